#!/usr/bin/env python
"""Cluster benchmark: a real 3-replica gesmas cluster over gRPC, measured from Python clients.

    python bench/cluster_bench.py                    # own LocalCluster, fsync on (a few minutes)
    python bench/cluster_bench.py --unsafe-no-fsync  # own LocalCluster, fsync off
    python bench/cluster_bench.py --cluster h:p,h:p,h:p   # an already running cluster
    python bench/cluster_bench.py --quick            # tiny sizes (the test suite's smoke test)

Measures
1. Single-client latency (p50 / p99 / mean ms, N ops after a warm-up) of an uncontended
   produce, consume (items present), lock acquire+release pair and counter add; once with the
   client bound to the leader and once bound to a follower.
2. Throughput with 1, 8, 64 concurrent clients (--clients), produce and consume separately.
   Every client is its own `Client` (own session), bound to a single replica, round-robin over
   the replicas, leader first. Clients run as threads in up to 8 spawned worker processes
   (--procs), because the client side is Python too. Each client stops after --ops-per-client
   operations or --seconds, whichever comes first; a consume run's queue is filled beforehand
   and each consumer is capped at its share of the items, so no consume ever waits.
   Reported: total ops / elapsed (common start to the last client's end), p50 / p99 per-op ms.
3. Machine facts: cores, Python, fsync, date, load average.

Prints a markdown table, then the same figures as one JSON line (also written to --json FILE).
Every loop is bounded in count and time; the cluster and the workers are stopped on any exit.
Client-side retries are counted from the client library's debug log ("... failed; next ...").
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import math
import multiprocessing as mp
import os
import platform
import queue as queue_mod
import signal
import sys
import threading
import time
from collections import Counter
from typing import Any, Callable

from gesmas.client import Client, GesmasError, ObjectProxy

from stats import pct  # bench/ is the script's directory, first on sys.path

CLIENT_LOGGER = "gesmas.client.client"
OP_TIMEOUT = 30.0          # `timeout=` of every benchmark call: bounds each call's waits/retries
# Session TTLs. The client sends a keep-alive every ttl/3 s, and keep-alives must reach the
# leader: a follower answers UNAVAILABLE with a leader hint, and the client then sends *all* its
# later calls to the leader. A client bound to a follower therefore stays there only until its
# first keep-alive, so TTLs are chosen to put that after a measurement; redirects are reported.
LATENCY_TTL = 60.0         # one fresh client per latency measurement: first keep-alive at 20 s
ADMIN_TTL = 30.0


def throughput_ttl(seconds: float) -> float:
    return max(30.0, 3 * (seconds + 10))
ITEM = b"bench-item-0123456789abcdef"
MAX_CLIENT_ERRORS = 5      # a client stops after this many failed calls


# -- retry counting ---------------------------------------------------------------------------

class RetryCounter(logging.Handler):
    """Counts the client library's 'METHOD at ADDR failed (ERROR); next ADDR' debug records."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.mu = threading.Lock()
        self.retries: Counter[str] = Counter()
        self.warnings: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        with self.mu:
            if isinstance(record.msg, str) and record.msg.startswith("gesmas: %s at %s failed"):
                args: tuple[Any, ...] = record.args if isinstance(record.args, tuple) else ()
                method, error = (args[0], args[2]) if len(args) >= 3 else ("?", "?")
                self.retries[f"{method}: {type(error).__name__}: {str(error)[:90]}"] += 1
            elif record.levelno >= logging.WARNING and len(self.warnings) < 20:
                self.warnings.append(record.getMessage()[:200])

    def take(self) -> tuple[dict[str, int], list[str]]:
        with self.mu:
            r, w = dict(self.retries), list(self.warnings)
            self.retries.clear()
            self.warnings.clear()
            return r, w


def install_retry_counter() -> RetryCounter:
    h = RetryCounter()
    lg = logging.getLogger(CLIENT_LOGGER)
    lg.setLevel(logging.DEBUG)
    lg.addHandler(h)
    # Warnings still reach stderr through logging's last-resort handler; debug records do not.
    return h


# -- statistics -------------------------------------------------------------------------------

def summary(lat_ms: list[float]) -> dict[str, float]:
    xs = sorted(lat_ms)
    return {"p50_ms": pct(xs, 50), "p99_ms": pct(xs, 99),
            "mean_ms": sum(xs) / len(xs) if xs else float("nan"), "n": len(xs)}


# -- 1. single-client latency ------------------------------------------------------------------

def timed_loop(fn: Callable[[], Any], n: int, warm: int, budget: float) -> list[float]:
    """`warm` untimed calls, then up to `n` timed calls within `budget` seconds; ms each."""
    end = time.monotonic() + budget
    for _ in range(warm):
        if time.monotonic() >= end:
            break
        fn()
    out: list[float] = []
    end = time.monotonic() + budget
    while len(out) < n and time.monotonic() < end:
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def latency_suite(addr: str, role: str, n: int, warm: int, budget: float,
                  counter: RetryCounter) -> list[dict[str, Any]]:
    """The four uncontended measurements through one Client bound to `addr`."""
    rows = []
    tag = f"{role}-{os.getpid()}-{int(time.time())}"
    qname, lname, cname = (f"bench-lat-{k}-{tag}" for k in ("q", "lock", "ctr"))

    def measure(name: str, make: Callable[[Client], Callable[[], Any]]) -> None:
        """A fresh Client (session) bound to `addr` for each measurement."""
        with Client(addr, session_ttl=LATENCY_TTL) as c:
            fn = make(c)
            counter.take()
            xs = timed_loop(fn, n, warm, budget)
            retries, warns = counter.take()
            notes = []
            if len(xs) < n:
                notes.append(f"time budget {budget:g} s hit after {len(xs)} ops")
            if len(c.addresses) > 1:
                notes.append(f"client redirected to {c.addresses[-1]}")
        rows.append({"kind": "latency", "op": name, "via": role, "address": addr,
                     **summary(xs), "retries": sum(retries.values()),
                     "retry_kinds": retries, "warnings": warns, "notes": notes})
        print(f"  latency {name} via {role}: p50 {rows[-1]['p50_ms']:.2f} ms "
              f"(n={len(xs)})", file=sys.stderr, flush=True)

    def produce(c: Client) -> Callable[[], Any]:
        q = c.queue(qname)
        return lambda: q.produce(ITEM, timeout=OP_TIMEOUT)

    def consume(c: Client) -> Callable[[], Any]:
        q = c.queue(qname)      # consume must find items: top up to warm + n, untimed
        missing = warm + n - q.size(timeout=OP_TIMEOUT)
        for _ in range(max(0, min(missing, warm + n))):
            q.produce(ITEM, timeout=OP_TIMEOUT)
        return lambda: q.consume(timeout=OP_TIMEOUT)

    def lock_pair(c: Client) -> Callable[[], Any]:
        lock = c.lock(lname)

        def pair() -> None:
            lock.acquire(timeout=OP_TIMEOUT)
            lock.release()
        return pair

    def add(c: Client) -> Callable[[], Any]:
        ctr = c.counter(cname)
        return lambda: ctr.add(1, timeout=OP_TIMEOUT)

    measure("produce", produce)
    measure("consume", consume)
    measure("lock acquire+release", lock_pair)
    measure("counter add", add)
    return rows


# -- 2. throughput: worker processes ----------------------------------------------------------

class _ClientSlot:
    def __init__(self, idx: int, addr: str) -> None:
        self.idx, self.addr = idx, addr
        self.client: Client | None = None
        self.proxy: ObjectProxy | None = None
        self.error: str | None = None
        self.lat: list[float] = []
        self.ops = 0
        self.errors: list[str] = []
        self.end = 0.0
        self.hit_deadline = False
        self.redirected = False


def _client_thread(slot: _ClientSlot, op: str, qname: str, cap: int, seconds: float,
                   go: threading.Event, start: list[float], abort: threading.Event,
                   created: threading.Event, finished: threading.Event,
                   close_now: threading.Event) -> None:
    try:
        try:
            slot.client = Client(slot.addr, session_ttl=throughput_ttl(seconds))
            slot.proxy = ObjectProxy(slot.client, "Queue", qname)
        except GesmasError as e:
            slot.error = f"{type(e).__name__}: {e}"
        finally:
            created.set()
        if slot.client is None or not go.wait(timeout=300) or abort.is_set():
            return
        time.sleep(max(0.0, start[0] - time.monotonic()))
        deadline = start[0] + seconds
        proxy = slot.proxy
        assert proxy is not None
        call = (lambda: proxy.produce(ITEM, timeout=OP_TIMEOUT)) if op == "produce" \
            else (lambda: proxy.consume(timeout=OP_TIMEOUT))
        while slot.ops < cap and len(slot.errors) < MAX_CLIENT_ERRORS:
            if time.monotonic() >= deadline:
                slot.hit_deadline = True
                break
            t0 = time.perf_counter()
            try:
                call()
            except GesmasError as e:
                slot.errors.append(f"{type(e).__name__}: {str(e)[:120]}")
                continue
            slot.lat.append((time.perf_counter() - t0) * 1e3)
            slot.ops += 1
        slot.end = time.monotonic()
        slot.redirected = len(slot.client.addresses) > 1
    except BaseException as e:       # noqa: BLE001 - reported to the parent, never swallowed
        slot.error = f"{type(e).__name__}: {e}"
    finally:
        finished.set()
        close_now.wait(timeout=60)
        if slot.client is not None:
            try:
                slot.client.close()
            except Exception as e:   # noqa: BLE001
                slot.errors.append(f"close: {type(e).__name__}: {e}")


def worker_main(wid: int, tasks: Any, results: Any) -> None:
    """A worker process: runs the clients of each run it is given, as threads."""
    counter = install_retry_counter()
    try:
        while True:
            try:
                msg = tasks.get(timeout=1800)
            except queue_mod.Empty:
                return
            if msg[0] == "stop":
                return
            _, run_id, op, qname, specs, cap, seconds = msg
            counter.take()
            go, abort, close_now = threading.Event(), threading.Event(), threading.Event()
            start = [0.0]
            slots = [_ClientSlot(i, a) for i, a in specs]
            created = [threading.Event() for _ in slots]
            finished = [threading.Event() for _ in slots]
            threads = [threading.Thread(target=_client_thread, daemon=True, args=(
                s, op, qname, cap, seconds, go, start, abort, cr, fi, close_now))
                for s, cr, fi in zip(slots, created, finished)]
            for t in threads:
                t.start()
            limit = time.monotonic() + 120
            for e in created:
                e.wait(timeout=max(0.0, limit - time.monotonic()))
            results.put(("ready", run_id, wid, [s.error for s in slots if s.error]))
            try:
                m = tasks.get(timeout=300)
            except queue_mod.Empty:
                m = ("abort",)
            if m[0] == "start" and m[1] == run_id:
                start[0] = m[2]
            else:
                abort.set()
            go.set()
            limit = time.monotonic() + seconds + 2 * OP_TIMEOUT + 30
            for e in finished:
                e.wait(timeout=max(0.0, limit - time.monotonic()))
            stuck = sum(not e.is_set() for e in finished)
            close_now.set()
            for t in threads:
                t.join(timeout=15)
            retries, warns = counter.take()
            results.put(("done", run_id, wid, {
                "clients": [{"idx": s.idx, "addr": s.addr, "ops": s.ops, "lat": s.lat,
                             "end": s.end, "hit_deadline": s.hit_deadline,
                             "redirected": s.redirected, "errors": s.errors,
                             "error": s.error} for s in slots],
                "stuck": stuck, "retries": retries, "warnings": warns}))
            if m[0] == "stop":
                return
    except KeyboardInterrupt:
        return


class Workers:
    """Up to `n` spawned worker processes, reused by every run; stopped by pid on exit."""

    def __init__(self, n: int) -> None:
        ctx = mp.get_context("spawn")
        self.results = ctx.Queue()
        self.tasks = [ctx.Queue() for _ in range(n)]
        self.procs = [ctx.Process(target=worker_main, args=(i, self.tasks[i], self.results),
                                  name=f"bench-worker-{i}", daemon=True) for i in range(n)]
        for p in self.procs:
            p.start()
        self.run_id = 0

    def _collect(self, kind: str, run_id: int, wids: set[int], deadline: float
                 ) -> dict[int, Any]:
        got: dict[int, Any] = {}
        while set(got) != wids:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"workers {sorted(wids - set(got))} did not report {kind!r}")
            try:
                m = self.results.get(timeout=min(left, 1.0))
            except queue_mod.Empty:
                dead = [i for i in wids - set(got) if not self.procs[i].is_alive()]
                if dead:
                    raise RuntimeError(f"worker(s) {dead} died") from None
                continue
            if m[0] == kind and m[1] == run_id:
                got[m[2]] = m[3]
        return got

    def run(self, op: str, qname: str, addrs: list[str], nclients: int, cap: int,
            seconds: float) -> dict[str, Any]:
        """`nclients` clients, client i bound to addrs[i % len(addrs)], in worker i % P."""
        self.run_id += 1
        rid = self.run_id
        p = min(len(self.procs), nclients)
        per: dict[int, list[tuple[int, str]]] = {w: [] for w in range(p)}
        for i in range(nclients):
            per[i % p].append((i, addrs[i % len(addrs)]))
        for w, specs in per.items():
            self.tasks[w].put(("run", rid, op, qname, specs, cap, seconds))
        ready = self._collect("ready", rid, set(per), time.monotonic() + 150 + nclients)
        setup_errors = [e for errs in ready.values() for e in errs]
        start = time.monotonic() + 0.3
        for w in per:
            self.tasks[w].put(("start", rid, start))
        done = self._collect("done", rid, set(per),
                             time.monotonic() + seconds + 2 * OP_TIMEOUT + 150)
        clients = sorted((c for d in done.values() for c in d["clients"]),
                         key=lambda c: c["idx"])
        lat = [x for c in clients for x in c["lat"]]
        ops = sum(c["ops"] for c in clients)
        ends = [c["end"] for c in clients if c["end"]]
        elapsed = max(ends) - start if ends else float("nan")
        retries: Counter[str] = Counter()
        for d in done.values():
            retries.update(d["retries"])
        errors = [e for c in clients for e in c["errors"]] + \
                 [c["error"] for c in clients if c["error"]]
        per_addr = Counter(c["addr"] for c in clients)
        return {
            "op": op, "clients": nclients, "procs": p, "ops": ops, "elapsed_s": elapsed,
            "ops_per_s": ops / elapsed if elapsed and elapsed > 0 else float("nan"),
            **summary(lat),
            "ended_by": "time" if any(c["hit_deadline"] for c in clients) else "count",
            "clients_per_replica": [per_addr.get(a, 0) for a in addrs],
            "redirected_clients": sum(c["redirected"] for c in clients),
            "retries": sum(retries.values()), "retry_kinds": dict(retries),
            "errors": len(errors), "error_samples": errors[:5] + setup_errors[:5],
            "stuck_clients": sum(d["stuck"] for d in done.values()),
            "warnings": [w for d in done.values() for w in d["warnings"]][:10],
        }

    def stop(self) -> None:
        for t in self.tasks:
            try:
                t.put(("stop",))
            except (OSError, ValueError):
                pass
        limit = time.monotonic() + 20
        for p in self.procs:
            p.join(timeout=max(0.1, limit - time.monotonic()))
        for p in self.procs:
            if p.is_alive() and p.pid is not None:
                os.kill(p.pid, signal.SIGTERM)
                p.join(timeout=5)
            if p.is_alive() and p.pid is not None:
                os.kill(p.pid, signal.SIGKILL)
                p.join(timeout=5)


def throughput_suite(workers: Workers, admin: Client, addrs: list[str], counts: list[int],
                     cap: int, seconds: float) -> list[dict[str, Any]]:
    rows = []
    tag = f"{os.getpid()}-{int(time.time())}"
    for n in counts:
        qname = f"bench-tp-q-{n}-{tag}"
        q = admin.queue(qname)
        r = workers.run("produce", qname, addrs, n, cap, seconds)
        rows.append({"kind": "throughput", **r})
        _say(r)
        # Fill for the consume run: 2.5x what the produce run did per second, plus slack;
        # then cap every consumer at its share of the queue, so no consume ever waits.
        have = q.size(timeout=OP_TIMEOUT)
        rate = r["ops_per_s"] if r["ops_per_s"] == r["ops_per_s"] else 0.0
        want = min(n * cap, int(rate * seconds * 2.5) + 2 * n)
        fill_note = ""
        if have < want:
            fillers = min(max(n, 8), 64)
            t0 = time.monotonic()
            f = workers.run("produce", qname, addrs, fillers,
                            math.ceil((want - have) / fillers), 120.0)
            have = q.size(timeout=OP_TIMEOUT)
            fill_note = f"pre-filled {have} items in {time.monotonic() - t0:.1f} s"
            if f["errors"]:
                fill_note += f" ({f['errors']} fill errors)"
        r = workers.run("consume", qname, addrs, n, min(cap, have // n), seconds)
        r["queue_items_before"] = have
        if fill_note:
            r["fill"] = fill_note
        rows.append({"kind": "throughput", **r})
        _say(r)
        try:
            admin.delete_object(qname)
        except GesmasError as e:
            print(f"  could not delete {qname}: {e}", file=sys.stderr)
    return rows


def _say(r: dict[str, Any]) -> None:
    print(f"  throughput {r['op']} x{r['clients']}: {r['ops_per_s']:.0f} ops/s "
          f"({r['ops']} ops, {r['elapsed_s']:.2f} s, ended by {r['ended_by']}, "
          f"retries {r['retries']}, errors {r['errors']})", file=sys.stderr, flush=True)


# -- output ----------------------------------------------------------------------------------

def _f(x: Any, fmt: str) -> str:
    return "—" if x is None or (isinstance(x, float) and x != x) else format(x, fmt)


def table(rows: list[dict[str, Any]]) -> str:
    head = ["measurement", "ops/s", "p50 ms", "p99 ms", "mean ms", "ops", "notes"]
    lines = []
    for r in rows:
        if r["kind"] == "latency":
            name = f"latency {r['op']} (via {r['via']})"
            notes = ["1 client, uncontended"] + r["notes"]
            ops_s = "—"
        else:
            s = "" if r["clients"] == 1 else "s"
            name = f"throughput {r['op']}, {r['clients']} client{s}"
            notes = [f"{r['procs']} proc", f"{r['elapsed_s']:.2f} s",
                     f"ended by {r['ended_by']}",
                     "per replica " + "/".join(map(str, r["clients_per_replica"]))]
            if r.get("fill"):
                notes.append(r["fill"])
            if r["redirected_clients"]:
                notes.append(f"{r['redirected_clients']} client(s) redirected")
            if r["stuck_clients"]:
                notes.append(f"{r['stuck_clients']} client(s) STUCK")
            ops_s = _f(r["ops_per_s"], ",.0f")
        if r["retries"]:
            notes.append(f"{r['retries']} retries")
        if r.get("errors"):
            notes.append(f"{r['errors']} errors")
        lines.append([name, ops_s, _f(r["p50_ms"], ".2f"), _f(r["p99_ms"], ".2f"),
                      _f(r["mean_ms"], ".2f"), str(r.get("ops", r["n"])), "; ".join(notes)])
    w = [max(len(head[i]), *(len(l[i]) for l in lines)) for i in range(len(head) - 1)]
    out = ["| " + " | ".join(h.ljust(w[i]) if i == 0 else h.rjust(w[i])
                             for i, h in enumerate(head[:-1])) + " | notes |",
           "|" + "|".join("-" * (w[i] + 2) if i == 0 else "-" * (w[i] + 1) + ":"
                          for i in range(len(w))) + "|-------|"]
    for l in lines:
        out.append("| " + " | ".join(c.ljust(w[i]) if i == 0 else c.rjust(w[i])
                                     for i, c in enumerate(l[:-1])) + f" | {l[-1]} |")
    return "\n".join(out)


def machine_facts(fsync: bool | None, own_cluster: bool) -> dict[str, Any]:
    import grpc  # type: ignore[import-untyped]
    try:
        usable: int | None = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "cores": os.cpu_count(), "usable_cores": usable,
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(), "implementation": platform.python_implementation(),
        "platform": platform.platform(), "machine": platform.machine(),
        "grpcio": grpc.__version__,
        "fsync": ("on" if fsync else "off") if own_cluster else "unknown (--cluster)",
        "cluster": "own LocalCluster, 3 processes on 127.0.0.1" if own_cluster
        else "external (--cluster)",
    }


# -- main ------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test")
    ap.add_argument("--cluster", default=None,
                    help="client addresses of a running cluster (else start a LocalCluster)")
    ap.add_argument("--unsafe-no-fsync", action="store_true",
                    help="own cluster without fsync of the Raft journal")
    ap.add_argument("--clients", default=None, help="client counts (default 1,8,64; quick 1,2)")
    ap.add_argument("--seconds", type=float, default=None,
                    help="duration bound of each throughput run (default 4, quick 1)")
    ap.add_argument("--ops", type=int, default=None,
                    help="timed ops per latency measurement (default 300, quick 20)")
    ap.add_argument("--ops-per-client", type=int, default=None,
                    help="op bound per client per throughput run (default 5000, quick 20)")
    ap.add_argument("--procs", type=int, default=8, help="max worker processes (default 8)")
    ap.add_argument("--json", default=None, metavar="FILE", help="also write the JSON here")
    a = ap.parse_args(argv)
    quick = a.quick
    counts = [int(x) for x in (a.clients or ("1,2" if quick else "1,8,64")).split(",") if x]
    if not counts or min(counts) < 1:
        ap.error("--clients needs positive counts")
    seconds = a.seconds if a.seconds is not None else (1.0 if quick else 4.0)
    n_lat = a.ops if a.ops is not None else (20 if quick else 300)
    warm = 5 if quick else 30
    lat_budget = 30.0 if quick else 60.0
    cap = a.ops_per_client if a.ops_per_client is not None else (20 if quick else 5000)

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.default_int_handler)   # even if started with it ignored

    counter = install_retry_counter()
    own = a.cluster is None
    facts = machine_facts(not a.unsafe_no_fsync, own)
    cluster = None
    workers: Workers | None = None
    t_all = time.monotonic()
    try:
        if own:
            from gesmas.server.cluster import LocalCluster
            cluster = LocalCluster(nodes=3, fsync=not a.unsafe_no_fsync)
            print(f"starting a 3-node LocalCluster (fsync {facts['fsync']}) ...",
                  file=sys.stderr, flush=True)
            cluster.start(timeout=90)
            addresses = cluster.addresses
        else:
            addresses = a.cluster
        workers = Workers(max(1, min(a.procs, max(counts))))
        with Client(addresses, connect=False) as probe:
            leader = probe.status()["leader_address"]
        all_addrs = [x.strip() for x in addresses.split(",") if x.strip()]
        if leader not in all_addrs:
            raise RuntimeError(f"leader {leader!r} is not one of {all_addrs}")
        addrs = [leader] + [x for x in all_addrs if x != leader]   # leader first
        # Leader first, so that its keep-alives are not counted as retries.
        with Client(addrs, session_ttl=ADMIN_TTL) as admin:
            st = admin.status()
            term0 = st["term"]
            rows = latency_suite(leader, "leader", n_lat, warm, lat_budget, counter)
            if len(addrs) > 1:
                rows += latency_suite(addrs[1], "follower", n_lat, warm, lat_budget, counter)
            rows += throughput_suite(workers, admin, addrs, counts, cap, seconds)
            st2 = admin.status()
        facts["leader_at_start"], facts["leader_at_end"] = leader, st2["leader_address"]
        facts["term_at_start"], facts["term_at_end"] = term0, st2["term"]
        facts["replicas_leader_first"] = addrs
        facts["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
        facts["total_s"] = round(time.monotonic() - t_all, 1)
    except KeyboardInterrupt:
        print("\ninterrupted; stopping", file=sys.stderr)
        return 130
    finally:
        if workers is not None:
            workers.stop()
        if cluster is not None:
            cluster.stop()

    print(f"\ncluster bench{' (quick)' if quick else ''}: {facts['date']}, "
          f"{facts['cores']} cores ({facts['usable_cores']} usable), "
          f"load {facts['loadavg_at_start']} -> {facts['loadavg_at_end']}, "
          f"Python {facts['python']} ({facts['implementation']}), grpcio {facts['grpcio']}, "
          f"{facts['platform']}")
    print(f"{facts['cluster']}, fsync {facts['fsync']}; leader {facts['leader_at_start']} "
          f"(term {facts['term_at_start']}) -> {facts['leader_at_end']} "
          f"(term {facts['term_at_end']}); total {facts['total_s']} s")
    print(f"latency: N={n_lat} timed ops after {warm} warm-up, one Client bound to one replica. "
          f"throughput: each client its own Client/session bound to one replica, round-robin "
          f"over {' '.join(facts['replicas_leader_first'])} (leader first), clients as threads "
          f"in <= {a.procs} spawned processes, each client stops at {cap} ops or {seconds:g} s; "
          f"ops/s = total ops / (common start .. last client end). Keep-alives go to the leader "
          f"and a follower's redirect moves all of a client's calls there: session TTLs put "
          f"the first keep-alive after a measurement; a redirect is noted.\n")
    print(table(rows))
    result = {"facts": facts,
              "config": {"quick": quick, "clients": counts, "seconds": seconds,
                         "latency_ops": n_lat, "warmup": warm, "ops_per_client": cap,
                         "procs": a.procs, "op_timeout_s": OP_TIMEOUT,
                         "session_ttl_s": {"latency": LATENCY_TTL,
                                           "throughput": throughput_ttl(seconds)}},
              "rows": rows}
    line = json.dumps(result, default=str)
    print(line, flush=True)
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""The GESMAS paper's experiments, gesmas side by side with ZooKeeper.

    python bench/paper.py [--quick] [--only NAME[,NAME]] [--systems gesmas,zookeeper] [--out DIR]

Systems
  gesmas     a 3-node LocalCluster on 127.0.0.1, fsync on; every client is its own `Client`
             (own session), client i preferring replica i mod 3.
  zookeeper  a 3-node ensemble on 127.0.0.1 (bench/zk.py: Debian's zookeeper, durable
             defaults, forceSync on), driven through kazoo recipes; every client is its own
             KazooClient, client i connecting to server i mod 3 first.

Experiments (NAME for --only)
  produce   produce throughput with 1 / 4 / 16 clients        (gesmas Queue.produce;
            ZK kazoo LockingQueue.put)
  consume   consume latency at queue length 10^3, 10^4, 10^5 (one pre-filled queue each;
            after a 10 s pause, 300 consumes per length, taken round-robin over the queues so
            that host noise hits every length alike). gesmas Queue.consume; ZK LockingQueue.get +
            consume, which lists and sorts the entries and the taken nodes on every get.
  mixed     2 producers + 2 consumers on an initially empty queue, throughput
  herd      N clients (50, 100, 200) block in consume, one producer produces N items; time from
            the first produce to the last consumer released. ZK: LockingQueue.get(timeout),
            whose waiters all watch the entries' parent (the herd).
  barrier   c parties (10, 25, 50) pass b=5 consecutive barriers. gesmas: one cyclic
            Barrier(c), wait() 5 times. ZK: kazoo DoubleBarrier(c).enter() on a fresh path per
            round (enter is the rendezvous half of the double barrier; kazoo's `Barrier` is a
            gate opened by a third party, not a rendezvous).
  lock      1 / 4 / 16 clients loop acquire/release on one lock for a bounded time: hand-offs
            per second; every holding interval is logged (CLOCK_MONOTONIC, system wide) and
            the union is checked afterwards for overlaps (gesmas also: fences increase).
            ZK: kazoo Lock.
  latency   p50 / p99 of single uncontended produce, consume, lock acquire+release (1 client).

Both clusters stay up for the whole run and the systems take turns point by point (one
experiment at one size on each, in alternating order), so that the host's load drifting
during the run does not favour one of them. Clients run as threads in spawned worker
processes (the client side is Python too). Output: a
markdown table (both systems and the ratio gesmas/zk, with which direction is better), the
same as JSON (results.json) and PNG plots under --out (default bench/results/). A full run with
both systems also rewrites docs/benchmarks.md and copies the PNGs to docs/. Every wait is
bounded; a size that is infeasible within its time bound is reported as such.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import logging
import math
import multiprocessing as mp
import os
import platform
import queue as queue_mod
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from stats import pct  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ITEM = b"paper-item-0123456789abcdef"
OP_TIMEOUT = 30.0
SESSION_TTL = 60.0
ROUTE_ENV = "GESMAS_BENCH_ROUTE"  # --route, handed to the spawned workers
EXPERIMENTS = ["produce", "consume", "mixed", "herd", "barrier", "lock", "latency"]
SYSTEMS = ["gesmas", "zookeeper"]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- statistics -------------------------------------------------------------------------------

def stats(lat_ms: list[float]) -> dict[str, float]:
    return {"n": len(lat_ms), "mean_ms": sum(lat_ms) / len(lat_ms) if lat_ms else float("nan"),
            "p50_ms": pct(lat_ms, 50), "p99_ms": pct(lat_ms, 99)}


# -- adapters: one connection (session) each ---------------------------------------------------

def rotate(xs: list[str], k: int) -> list[str]:
    k %= len(xs)
    return xs[k:] + xs[:k]


class GesmasConn:
    name = "gesmas"

    def __init__(self, addrs: list[str], idx: int) -> None:
        from gesmas.client import Client
        self.c = Client(rotate(addrs, idx), session_ttl=SESSION_TTL,
                        route=os.environ.get(ROUTE_ENV, "leader"))
        self._objs: dict[tuple[str, str], Any] = {}

    def _q(self, name: str) -> Any:
        k = ("q", name)
        if k not in self._objs:
            self._objs[k] = self.c.queue(name)
        return self._objs[k]

    def produce(self, q: str) -> None:
        self._q(q).produce(ITEM, timeout=OP_TIMEOUT)

    def consume(self, q: str, timeout: float) -> Any:
        from gesmas.client import Timeout
        try:
            return self._q(q).consume(timeout=timeout)
        except Timeout:
            return None

    def size(self, q: str) -> int:
        return int(self._q(q).size(timeout=OP_TIMEOUT))

    def acquire(self, name: str, timeout: float) -> Any:
        k = ("l", name)
        if k not in self._objs:
            self._objs[k] = self.c.lock(name)
        return self._objs[k].acquire(timeout=timeout)

    def release(self, name: str) -> None:
        self._objs[("l", name)].release()

    def barrier(self, name: str, parties: int, rnd: int, timeout: float) -> None:
        k = ("b", name)
        if k not in self._objs:
            self._objs[k] = self.c.barrier(name, parties=parties)
        self._objs[k].wait(timeout=timeout)

    def delete(self, q: str) -> None:
        self.c.delete_object(q)

    def close(self) -> None:
        self.c.close()


class ZkConn:
    name = "zookeeper"

    def __init__(self, hosts: list[str], idx: int) -> None:
        from kazoo.client import KazooClient
        self.c = KazooClient(hosts=",".join(rotate(hosts, idx)), randomize_hosts=False,
                             timeout=30.0)
        self.c.start(timeout=60)
        self._objs: dict[tuple[str, str], Any] = {}

    def _q(self, name: str) -> Any:
        from kazoo.recipe.queue import LockingQueue
        k = ("q", name)
        if k not in self._objs:
            self._objs[k] = LockingQueue(self.c, f"/paper/q/{name}")
        return self._objs[k]

    def produce(self, q: str) -> None:
        self._q(q).put(ITEM)

    def consume(self, q: str, timeout: float) -> Any:
        lq = self._q(q)
        v = lq.get(timeout)
        if v is None:
            return None
        if not lq.consume():
            raise RuntimeError("LockingQueue.consume failed (lock lost)")
        return v

    def consume_paper(self, q: str) -> Any:
        """The GESMAS paper's ZooKeeper consume, cheaper than LockingQueue's (no lock node):
        list the entries, sort them, get and delete the first; a delete that finds the node
        gone lost a race with another consumer, so try the next. None when empty."""
        from kazoo.exceptions import NoNodeError
        lq = self._q(q)
        path = lq._entries_path
        for child in sorted(self.c.get_children(path)):
            try:
                data, _ = self.c.get(f"{path}/{child}")
                self.c.delete(f"{path}/{child}")
            except NoNodeError:
                continue
            return data
        return None

    def size(self, q: str) -> int:
        return len(self._q(q))

    def acquire(self, name: str, timeout: float) -> Any:
        from kazoo.recipe.lock import Lock
        k = ("l", name)
        if k not in self._objs:
            self._objs[k] = Lock(self.c, f"/paper/lock/{name}")
        return True if self._objs[k].acquire(timeout=timeout) else None

    def release(self, name: str) -> None:
        self._objs[("l", name)].release()

    def barrier(self, name: str, parties: int, rnd: int, timeout: float) -> None:
        from kazoo.recipe.barrier import DoubleBarrier
        b = DoubleBarrier(self.c, f"/paper/bar/{name}/r{rnd}", parties)
        b.enter()             # no timeout in kazoo: bounded by the worker's deadline
        if not b.participating:
            raise RuntimeError("DoubleBarrier.enter failed")

    def barrier_state(self, name: str, rnd: int) -> str:
        """What a party stuck in round `rnd` should have seen (for the report)."""
        path = f"/paper/bar/{name}/r{rnd}"
        children = self.c.get_children(path) if self.c.exists(path) else []
        arrived = len([ch for ch in children if ch != "ready"])
        return f"{arrived} arrivals, 'ready' node {'exists' if 'ready' in children else 'absent'}"

    def fill(self, q: str, n: int, budget: float) -> int:
        """n items straight into the LockingQueue's entries (create_async, 1000 in flight)."""
        lq = self._q(q)
        lq._ensure_paths()
        path = f"{lq._entries_path}/entry-100-"
        pending: deque[Any] = deque()
        done = 0
        deadline = time.monotonic() + budget
        for _ in range(n):
            if time.monotonic() >= deadline:
                break
            pending.append(self.c.create_async(path, ITEM, sequence=True))
            if len(pending) >= 1000:
                pending.popleft().get(timeout=60)
                done += 1
        while pending:
            pending.popleft().get(timeout=60)
            done += 1
        return done

    def delete(self, q: str) -> None:
        pass   # the ensemble is thrown away at the end

    def close(self) -> None:
        try:
            self.c.stop()
        finally:
            self.c.close()


def connect(system: str, endpoints: list[str], idx: int) -> Any:
    return GesmasConn(endpoints, idx) if system == "gesmas" else ZkConn(endpoints, idx)


# -- worker processes --------------------------------------------------------------------------

def _client_body(kind: str, conn: Any, slot: dict[str, Any], p: dict[str, Any],
                 start: float) -> None:
    time.sleep(max(0.0, start - time.monotonic()))
    deadline = start + p.get("seconds", 0.0)
    lat: list[float] = []
    if kind == "produce" or (kind == "mixed" and slot["role"] == "producer"):
        cap = p.get("cap", 10 ** 9)
        while slot["ops"] < cap and time.monotonic() < deadline:
            t0 = time.perf_counter()
            conn.produce(p["q"])
            lat.append((time.perf_counter() - t0) * 1e3)
            slot["ops"] += 1
    elif kind == "mixed":
        while True:
            left = deadline - time.monotonic()
            if left <= 0.02:
                break
            t0 = time.perf_counter()
            v = conn.consume(p["q"], min(1.0, left))
            if v is not None:
                lat.append((time.perf_counter() - t0) * 1e3)
                slot["ops"] += 1
    elif kind == "herd":
        slot["t_call"] = time.monotonic()
        v = conn.consume(p["q"], p["timeout"])
        if v is not None:
            slot["t_release"] = time.monotonic()
            slot["ops"] = 1
    elif kind == "barrier":
        for r in range(p["rounds"]):
            conn.barrier(p["name"], p["parties"], r, p["timeout"])
            slot["ops"] += 1
        slot["t_end"] = time.monotonic()
    elif kind == "lock":
        ivs = []
        while time.monotonic() < deadline:
            fence = conn.acquire(p["name"], OP_TIMEOUT)
            if fence is None:
                slot["errors"].append("acquire timed out")
                continue
            t_acq = time.monotonic()
            t_rel = time.monotonic()
            conn.release(p["name"])
            ivs.append((t_acq, t_rel, fence if isinstance(fence, int)
                        and not isinstance(fence, bool) else None))
            slot["ops"] += 1
        slot["intervals"] = ivs
    slot["lat"] = lat
    slot["end"] = time.monotonic()


def worker_main(wid: int, system: str, endpoints: list[str], kind: str,
                clients: list[tuple[int, str]], params: dict[str, Any], results: Any,
                go: Any, start_val: Any) -> None:
    logging.getLogger("kazoo").setLevel(logging.CRITICAL)
    logging.getLogger("gesmas").setLevel(logging.CRITICAL)
    try:
        slots = [{"idx": i, "role": r, "ops": 0, "errors": [], "lat": []} for i, r in clients]
        conns: list[Any] = [None] * len(slots)

        def mk(k: int) -> None:
            try:
                conns[k] = connect(system, endpoints, slots[k]["idx"])
            except BaseException as e:  # noqa: BLE001
                slots[k]["errors"].append(f"connect: {type(e).__name__}: {e}")
        ts = [threading.Thread(target=mk, args=(k,), daemon=True) for k in range(len(slots))]
        for t in ts:
            t.start()
        limit = time.monotonic() + 180
        for t in ts:
            t.join(timeout=max(0.1, limit - time.monotonic()))
        results.put(("ready", wid, [e for s in slots for e in s["errors"]]))
        if not go.wait(timeout=600):
            return
        start = start_val.value

        def body(k: int) -> None:
            try:
                if conns[k] is not None:
                    _client_body(kind, conns[k], slots[k], params, start)
            except BaseException as e:  # noqa: BLE001
                slots[k]["errors"].append(f"{type(e).__name__}: {str(e)[:160]}")
        ts = [threading.Thread(target=body, args=(k,), daemon=True) for k in range(len(slots))]
        for t in ts:
            t.start()
        limit = start + params["limit"]
        for t in ts:
            t.join(timeout=max(0.1, limit - time.monotonic()))
        stuck = sum(t.is_alive() for t in ts)
        results.put(("done", wid, {"slots": [dict(s) for s in slots], "stuck": stuck}))
        closers = [threading.Thread(target=c.close, daemon=True) for c in conns if c is not None]
        for t in closers:
            t.start()
        limit = time.monotonic() + 20
        for t in closers:
            t.join(timeout=max(0.1, limit - time.monotonic()))
    except BaseException as e:  # noqa: BLE001
        results.put(("error", wid, f"{type(e).__name__}: {e}"))
    finally:
        results.close()
        results.join_thread()
        os._exit(0)


def run_clients(system: str, endpoints: list[str], kind: str, roles: list[str],
                params: dict[str, Any], procs: int,
                on_start: Callable[[float], Any] | None = None) -> dict[str, Any]:
    """len(roles) clients as threads in up to `procs` spawned processes; common start."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    go = ctx.Event()
    start_val = ctx.Value("d", 0.0)
    p = max(1, min(procs, len(roles)))
    per: dict[int, list[tuple[int, str]]] = {w: [] for w in range(p)}
    for i, r in enumerate(roles):
        per[i % p].append((i, r))
    ps = [ctx.Process(target=worker_main, daemon=True, name=f"paper-worker-{w}",
                      args=(w, system, endpoints, kind, per[w], params, results, go,
                            start_val)) for w in range(p)]
    for pr in ps:
        pr.start()
    errors: list[str] = []
    got: dict[str, dict[int, Any]] = {"ready": {}, "done": {}}

    def collect(kind_: str, deadline: float) -> None:
        while len(got[kind_]) < p:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"workers did not report {kind_!r} in time")
            try:
                m = results.get(timeout=min(1.0, left))
            except queue_mod.Empty:
                continue
            if m[0] == "error":
                errors.append(m[2])
                got["ready"].setdefault(m[1], [])
                got["done"].setdefault(m[1], {"slots": [], "stuck": 0})
            else:
                got[m[0]][m[1]] = m[2]
    extra = None
    try:
        collect("ready", time.monotonic() + 200 + len(roles))
        errors += [e for es in got["ready"].values() for e in es]
        start = time.monotonic() + 0.3
        start_val.value = start
        go.set()
        if on_start is not None:
            extra = on_start(start)
        collect("done", start + params["limit"] + 30)
    finally:
        limit = time.monotonic() + 30
        for pr in ps:
            pr.join(timeout=max(0.1, limit - time.monotonic()))
        for pr in ps:
            if pr.is_alive() and pr.pid is not None:
                os.kill(pr.pid, signal.SIGKILL)
                pr.join(timeout=5)
    slots = sorted((s for d in got["done"].values() for s in d["slots"]), key=lambda s: s["idx"])
    errors += [e for s in slots for e in s["errors"]]
    return {"start": start, "slots": slots, "errors": errors, "extra": extra,
            "stuck": sum(d["stuck"] for d in got["done"].values())}


# -- experiments -------------------------------------------------------------------------------

def tag() -> str:
    return uuid.uuid4().hex[:8]


def exp_produce(system: str, ep: list[str], cfg: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for n in cfg["produce_clients"]:
        r = run_clients(system, ep, "produce", ["producer"] * n,
                        {"q": f"tp-{n}-{tag()}", "seconds": cfg["seconds"],
                         "limit": cfg["seconds"] + 2 * OP_TIMEOUT}, cfg["procs"])
        ops = sum(s["ops"] for s in r["slots"])
        el = max((s.get("end", 0) for s in r["slots"]), default=0) - r["start"]
        lat = [x for s in r["slots"] for x in s["lat"]]
        out[str(n)] = {"clients": n, "ops": ops, "elapsed_s": el,
                       "ops_per_s": ops / el if el > 0 else float("nan"), **stats(lat),
                       "errors": r["errors"][:5], "n_errors": len(r["errors"])}
        log(f"  [{system}] produce x{n}: {out[str(n)]['ops_per_s']:.0f} ops/s")
    return out


def bounded(fn: Callable[[], Any], seconds: float) -> tuple[bool, Any]:
    """Run fn in a daemon thread; (finished, result or exception)."""
    box: list[Any] = []

    def run() -> None:
        try:
            box.append(("ok", fn()))
        except BaseException as e:  # noqa: BLE001
            box.append(("err", e))
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout=seconds)
    if t.is_alive() or not box:
        return False, None
    kind, v = box[0]
    if kind == "err":
        return True, v
    return True, v


def exp_consume(system: str, ep: list[str], cfg: dict[str, Any]) -> dict[str, Any]:
    """One queue per length, all filled first; then the consumes are timed round-robin over
    the queues (one from each length in turn), so that whatever else the host does while
    timing, and the after-effects of the fills, weigh on every length alike."""
    out: dict[str, Any] = {}
    conn = connect(system, ep, 0)
    queues: dict[int, str] = {}
    try:
        for length in cfg["consume_lengths"]:
            q = f"cl{length}-{tag()}"
            t0 = time.monotonic()
            if system == "zookeeper":
                bounded(lambda: conn.fill(q, length, cfg["fill_budget"]), cfg["fill_budget"] + 120)
            else:
                nf = min(32, length)
                run_clients(system, ep, "produce", ["producer"] * nf,
                            {"q": q, "seconds": cfg["fill_budget"],
                             "cap": math.ceil(length / nf),
                             "limit": cfg["fill_budget"] + 2 * OP_TIMEOUT},
                            min(cfg["procs"], 4))
            ok2, size = bounded(lambda: conn.size(q), 120)
            have = size if ok2 and isinstance(size, int) else 0
            fill_s = time.monotonic() - t0
            rec: dict[str, Any] = {"length": length, "actual_length": have,
                                   "fill_s": round(fill_s, 1)}
            out[str(length)] = rec
            if have < 0.9 * length:
                rec["infeasible"] = (f"pre-fill reached {have} of {length} items in "
                                     f"{fill_s:.0f} s (bound {cfg['fill_budget']:.0f} s)")
                log(f"  [{system}] consume @{length}: {rec['infeasible']}")
                continue
            queues[length] = q
        # Let the fills' after-effects (ZooKeeper's snapshot, gesmas' checkpoint and log
        # compaction, sessions of the fill clients closing, the page cache writing back what
        # the fills wrote) finish before timing: this experiment is about what one consume
        # costs at a given length. 3 s was too short after 10^5 items: gesmas' leader fsync
        # took 1.1 ms p50 instead of 0.46 for ~8 s (docs/performance.md).
        time.sleep(cfg["consume_settle"])
        lat: dict[int, list[float]] = {length: [] for length in queues}

        def measure() -> None:
            for _ in range(cfg["consume_n"]):
                for length, q in queues.items():
                    t1 = time.perf_counter()
                    v = conn.consume(q, OP_TIMEOUT)
                    if v is None:
                        raise RuntimeError(f"consume timed out on the {length}-item queue")
                    lat[length].append((time.perf_counter() - t1) * 1e3)
        bound = cfg["consume_budget"] * max(1, len(queues))
        ok, err = bounded(measure, bound)
        paper: dict[int, list[float]] = {length: [] for length in queues}

        def measure_paper() -> None:
            for _ in range(cfg["consume_n"]):
                for length, q in queues.items():
                    t1 = time.perf_counter()
                    if conn.consume_paper(q) is None:
                        raise RuntimeError(f"the {length}-item queue is empty")
                    paper[length].append((time.perf_counter() - t1) * 1e3)
        if system == "zookeeper" and ok and not isinstance(err, BaseException):
            ok_p, err_p = bounded(measure_paper, bound)
            if not ok_p or isinstance(err_p, BaseException):
                log(f"  [{system}] consume, paper recipe: {err_p or 'over its time bound'}")
        for length in queues:
            rec = out[str(length)]
            rec.update(stats(lat[length]))
            rec["ops_per_s"] = 1e3 / rec["mean_ms"] if lat[length] else float("nan")
            # ZooKeeper's cheapest consume (the paper's recipe) next to LockingQueue's;
            # gesmas has one consume, reported in both rows
            src = paper[length] if system == "zookeeper" else lat[length]
            if src:
                rec["paper"] = stats(src)
                rec["paper"]["ops_per_s"] = 1e3 / rec["paper"]["mean_ms"]
            if not ok:
                rec["infeasible"] = (f"{len(lat[length])} of {cfg['consume_n']} consumes done "
                                     f"within {bound:.0f} s")
            elif isinstance(err, BaseException):
                rec["infeasible"] = f"consume failed: {type(err).__name__}: {str(err)[:160]}"
            log(f"  [{system}] consume @{length} (fill {rec['fill_s']:.0f} s): mean "
                f"{rec['mean_ms']:.2f} ms p50 {rec['p50_ms']:.2f} ms {rec.get('infeasible', '')}")
        if not ok or isinstance(err, BaseException):
            # abandoned mid-call: stop the connection so that its retries end now
            bounded(conn.close, 20)
            conn = None
        elif system == "gesmas":
            for q in queues.values():
                bounded(lambda: conn.delete(q), 60)
    finally:
        if conn is not None:
            bounded(conn.close, 20)
    return out


def exp_mixed(system: str, ep: list[str], cfg: dict[str, Any]) -> dict[str, Any]:
    s = cfg["seconds"]
    r = run_clients(system, ep, "mixed", ["producer", "producer", "consumer", "consumer"],
                    {"q": f"mx-{tag()}", "seconds": s, "limit": s + 2 * OP_TIMEOUT},
                    cfg["procs"])
    prod = sum(x["ops"] for x in r["slots"] if x["role"] == "producer")
    cons = sum(x["ops"] for x in r["slots"] if x["role"] == "consumer")
    clat = [v for x in r["slots"] if x["role"] == "consumer" for v in x["lat"]]
    res = {"seconds": s, "produced": prod, "consumed": cons, "produced_per_s": prod / s,
           "consumed_per_s": cons / s, "total_per_s": (prod + cons) / s,
           "consume": stats(clat), "errors": r["errors"][:5], "n_errors": len(r["errors"])}
    log(f"  [{system}] mixed: {prod / s:.0f} produced/s, {cons / s:.0f} consumed/s")
    return res


def exp_herd(system: str, ep: list[str], cfg: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for n in cfg["herd_ns"]:
        q = f"herd-{n}-{tag()}"
        prod = connect(system, ep, n)
        try:
            prod.size(q)    # creates the queue / its paths
            settle = 1.0 + 0.01 * n

            def on_start(start: float) -> dict[str, float]:
                time.sleep(max(0.0, start + settle - time.monotonic()))
                t0 = time.monotonic()
                for _ in range(n):
                    prod.produce(q)
                return {"t_first_produce": t0, "t_last_produce": time.monotonic()}
            r = run_clients(system, ep, "herd", ["waiter"] * n,
                            {"q": q, "timeout": cfg["herd_timeout"],
                             "limit": cfg["herd_timeout"] + 10}, cfg["herd_procs"],
                            on_start=on_start)
        finally:
            prod.close()
        ext = r["extra"] or {}
        rel = [s["t_release"] for s in r["slots"] if "t_release" in s]
        t0 = ext.get("t_first_produce", float("nan"))
        rec = {"n": n, "released": len(rel),
               "time_s": (max(rel) - t0) if len(rel) == n else float("nan"),
               "produce_phase_s": ext.get("t_last_produce", float("nan")) - t0,
               "errors": r["errors"][:5], "n_errors": len(r["errors"])}
        if len(rel) < n:
            rec["infeasible"] = f"only {len(rel)} of {n} released within {cfg['herd_timeout']} s"
        out[str(n)] = rec
        log(f"  [{system}] herd N={n}: {rec['time_s']:.3f} s ({len(rel)} released)")
    return out


def exp_barrier(system: str, ep: list[str], cfg: dict[str, Any]) -> dict[str, Any]:
    out = {}
    b = cfg["barrier_rounds"]
    for c in cfg["barrier_parties"]:
        name = f"bar-{c}-{tag()}"
        r = run_clients(system, ep, "barrier", ["party"] * c,
                        {"name": name, "parties": c, "rounds": b,
                         "timeout": cfg["barrier_timeout"],
                         "limit": cfg["barrier_timeout"] + 10}, cfg["herd_procs"])
        ends = [s["t_end"] for s in r["slots"] if "t_end" in s]
        rec = {"parties": c, "rounds": b, "finished": len(ends),
               "time_s": (max(ends) - r["start"]) if len(ends) == c else float("nan"),
               "errors": r["errors"][:5], "n_errors": len(r["errors"])}
        rec["per_round_ms"] = rec["time_s"] / b * 1e3
        if len(ends) < c:
            rec["infeasible"] = (f"only {len(ends)} of {c} parties passed {b} rounds within "
                                 f"{cfg['barrier_timeout']} s")
            stuck = sorted({s["ops"] for s in r["slots"] if "t_end" not in s})
            if system == "zookeeper" and stuck:
                # kazoo's DoubleBarrier.enter() waits without a timeout for a watch on the
                # round's 'ready' node; say whether that node was there (a lost wake-up) or
                # arrivals were missing.
                try:
                    zc = ZkConn(ep, 0)
                    try:
                        rec["stuck_rounds"] = {str(k): zc.barrier_state(name, k) for k in stuck}
                    finally:
                        zc.close()
                except Exception as e:  # noqa: BLE001
                    rec["stuck_rounds"] = {"error": f"{type(e).__name__}: {e}"}
                rec["infeasible"] += "; stuck in round " + ", ".join(
                    f"{k}: {v}" for k, v in rec["stuck_rounds"].items())
        out[str(c)] = rec
        log(f"  [{system}] barrier c={c}: {rec['time_s']:.3f} s for {b} rounds")
    return out


def exp_lock(system: str, ep: list[str], cfg: dict[str, Any]) -> dict[str, Any]:
    out = {}
    s = cfg["seconds"]
    for n in cfg["lock_clients"]:
        r = run_clients(system, ep, "lock", ["locker"] * n,
                        {"name": f"lk-{n}-{tag()}", "seconds": s,
                         "limit": s + 2 * OP_TIMEOUT}, cfg["procs"])
        ivs = sorted((a, b_, f, x["idx"]) for x in r["slots"]
                     for a, b_, f in x.get("intervals", []))
        overlaps, last_rel, fence_bad, last_fence = 0, -1.0, 0, None
        for a, b_, f, _ in ivs:
            if a < last_rel:
                overlaps += 1
            last_rel = max(last_rel, b_)
            if f is not None:
                if last_fence is not None and f <= last_fence:
                    fence_bad += 1
                last_fence = f
        el = max((x.get("end", 0) for x in r["slots"]), default=0) - r["start"]
        ops = len(ivs)
        rec = {"clients": n, "handoffs": ops, "elapsed_s": el,
               "handoffs_per_s": ops / el if el > 0 else float("nan"),
               "overlaps": overlaps, "fence_violations": fence_bad,
               "mutual_exclusion": "ok" if overlaps == 0 and fence_bad == 0 else "VIOLATED",
               "errors": r["errors"][:5], "n_errors": len(r["errors"])}
        out[str(n)] = rec
        log(f"  [{system}] lock x{n}: {rec['handoffs_per_s']:.0f} hand-offs/s, "
            f"mutual exclusion {rec['mutual_exclusion']}")
    return out


def exp_latency(system: str, ep: list[str], cfg: dict[str, Any]) -> dict[str, Any]:
    n, warm = cfg["latency_n"], 10
    conn = connect(system, ep, 0)
    q, lk = f"lat-{tag()}", f"lat-{tag()}"
    out = {}
    try:
        def timed(fn: Callable[[], Any], count: int) -> list[float]:
            xs = []
            for _ in range(count):
                t0 = time.perf_counter()
                fn()
                xs.append((time.perf_counter() - t0) * 1e3)
            return xs

        def pair() -> None:
            conn.acquire(lk, OP_TIMEOUT)
            conn.release(lk)

        def cons() -> None:
            if conn.consume(q, OP_TIMEOUT) is None:
                raise RuntimeError("consume timed out")
        timed(lambda: conn.produce(q), warm)
        out["produce"] = stats(timed(lambda: conn.produce(q), n))
        timed(cons, warm)
        out["consume"] = stats(timed(cons, n))
        timed(pair, warm)
        out["lock acquire+release"] = stats(timed(pair, n))
        for k, v in out.items():
            log(f"  [{system}] latency {k}: p50 {v['p50_ms']:.2f} ms p99 {v['p99_ms']:.2f} ms")
    finally:
        conn.close()
    return out


#: The configuration list each experiment loops over; main() runs one size at a time.
SIZE_KEYS = {"produce": "produce_clients", "herd": "herd_ns", "barrier": "barrier_parties",
             "lock": "lock_clients"}

EXP_FUNCS = {"produce": exp_produce, "consume": exp_consume, "mixed": exp_mixed,
             "herd": exp_herd, "barrier": exp_barrier, "lock": exp_lock, "latency": exp_latency}


# -- systems -----------------------------------------------------------------------------------

class Gesmas:
    def __enter__(self) -> list[str]:
        from gesmas.server.cluster import LocalCluster
        self.cl = LocalCluster(nodes=3, fsync=True)
        log("starting a 3-node gesmas LocalCluster (fsync on) ...")
        try:
            self.cl.start(timeout=90)
        except BaseException:
            self.cl.stop()
            raise
        return self.cl.addresses.split(",")

    def __exit__(self, *exc: Any) -> None:
        self.cl.stop()


class ZooKeeper:
    def __enter__(self) -> list[str]:
        import zk
        self.ens = zk.ZkEnsemble()
        log(f"starting a 3-node ZooKeeper {zk.version()} ensemble (forceSync on) ...")
        self.ens.start(timeout=90)
        return self.ens.hosts

    def __exit__(self, *exc: Any) -> None:
        self.ens.stop()


# -- report ------------------------------------------------------------------------------------

def _get(res: dict[str, Any], *path: str) -> Any:
    cur: Any = res
    for k in path:
        if not isinstance(cur, dict) or k not in cur:
            return None
        cur = cur[k]
    return cur


def metric_rows(results: dict[str, Any], cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """(experiment, metric, direction, per-system value and note)."""
    rows: list[dict[str, Any]] = []

    def add(exp: str, metric: str, higher: bool, path: tuple[str, ...], fmt: str,
            note_path: tuple[str, ...] | None = None) -> None:
        vals, notes = {}, {}
        for s in SYSTEMS:
            if exp not in results.get(s, {}):
                continue
            v = _get(results[s], exp, *path)
            vals[s] = v
            if note_path is not None:
                nt = _get(results[s], exp, *note_path)
                if nt:
                    notes[s] = nt
        if vals:
            rows.append({"experiment": exp, "metric": metric, "higher_is_better": higher,
                         "values": vals, "fmt": fmt, "notes": notes})

    for n in cfg["produce_clients"]:
        add("produce", f"produce ops/s, {n} client{'s' if n > 1 else ''}", True,
            (str(n), "ops_per_s"), ",.0f")
    for L in cfg["consume_lengths"]:
        add("consume", f"consume mean ms @ length {L:,}", False, (str(L), "mean_ms"), ".2f",
            (str(L), "infeasible"))
        add("consume", f"consume p50 ms @ length {L:,}", False, (str(L), "p50_ms"), ".2f",
            (str(L), "infeasible"))
    for L in cfg["consume_lengths"]:
        add("consume", f"consume p50 ms @ length {L:,}, ZooKeeper: paper's recipe", False,
            (str(L), "paper", "p50_ms"), ".2f")
    if len(cfg["consume_lengths"]) > 1:
        mid = cfg["consume_lengths"][1]
        add("consume", f"consume ops/s (1 client) @ length {mid:,}", True,
            (str(mid), "ops_per_s"), ",.0f", (str(mid), "infeasible"))
        add("consume", f"consume ops/s (1 client) @ length {mid:,}, ZooKeeper: paper's "
            "recipe", True, (str(mid), "paper", "ops_per_s"), ",.0f")
    add("mixed", "mixed 2P+2C produced/s", True, ("produced_per_s",), ",.0f")
    add("mixed", "mixed 2P+2C consumed/s", True, ("consumed_per_s",), ",.0f")
    add("mixed", "mixed 2P+2C produced+consumed/s", True, ("total_per_s",), ",.0f")
    for n in cfg["herd_ns"]:
        add("herd", f"herd N={n}: s until all released", False, (str(n), "time_s"), ".3f",
            (str(n), "infeasible"))
    for c in cfg["barrier_parties"]:
        add("barrier", f"barrier {c} parties x {cfg['barrier_rounds']} rounds: s", False,
            (str(c), "time_s"), ".3f", (str(c), "infeasible"))
    for n in cfg["lock_clients"]:
        add("lock", f"lock hand-offs/s, {n} client{'s' if n > 1 else ''}", True,
            (str(n), "handoffs_per_s"), ",.0f", (str(n), "mutual_exclusion"))
    for op in ("produce", "consume", "lock acquire+release"):
        for q in ("p50", "p99"):
            add("latency", f"{op} {q} ms (1 client)", False, (op, f"{q}_ms"), ".2f")
    return rows


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and v == v else None


def _fmt(v: Any, fmt: str) -> str:
    x = _num(v)
    return "—" if x is None else format(x, fmt)


def render_table(rows: list[dict[str, Any]]) -> str:
    head = ["measurement", "better", "gesmas", "zookeeper", "gesmas/zk", "gesmas advantage"]
    lines = ["| " + " | ".join(head) + " |", "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        g, z = _num(r["values"].get("gesmas")), _num(r["values"].get("zookeeper"))
        ratio = g / z if g is not None and z else None
        adv = None if ratio is None or ratio == 0 else (ratio if r["higher_is_better"]
                                                       else 1 / ratio)
        cells = []
        for s in SYSTEMS:
            c = _fmt(r["values"].get(s), r["fmt"])
            if r["notes"].get(s) and r["notes"][s] != "ok":
                c += f" ({r['notes'][s]})"
            cells.append(c)
        lines.append(f"| {r['metric']} | {'higher' if r['higher_is_better'] else 'lower'} | "
                     f"{cells[0]} | {cells[1]} | {_fmt(ratio, '.3g')} | "
                     f"{_fmt(adv, '.2f')}{'×' if adv is not None else ''} |")
    return "\n".join(lines)


def targets(results: dict[str, Any], cfg: dict[str, Any]) -> list[str]:
    g, z = results.get("gesmas", {}), results.get("zookeeper", {})
    out = []

    def chk(name: str, ok: bool | None, detail: str) -> None:
        out.append(f"- {name}: **{'met' if ok else ('missed' if ok is not None else 'n/a')}**"
                   f" — {detail}")
    ns = cfg["herd_ns"]
    gh = [_num(_get(g, "herd", str(n), "time_s")) for n in ns]
    zh = _num(_get(z, "herd", str(ns[-1]), "time_s"))
    if gh[-1] and zh:
        f = zh / gh[-1]
        chk(f"herd N={ns[-1]} gesmas ≥10× faster", f >= 10, f"{f:.1f}× (gesmas {gh[-1]:.3f} s, "
            f"ZooKeeper {zh:.3f} s)")
    elif gh[-1]:
        zn = _get(z, "herd", str(ns[-1]), "infeasible")
        chk(f"herd N={ns[-1]} gesmas ≥10× faster", True if zn else None,
            f"gesmas {gh[-1]:.3f} s; ZooKeeper: {zn or 'not measured'}")
    if all(gh) and len(ns) > 1:
        per = [t / n * 1e3 for t, n in zip(gh, ns)]   # type: ignore[operator]
        growth = gh[-1] / gh[0]   # type: ignore[operator]
        chk("herd linear in N (gesmas)", growth <= 1.5 * ns[-1] / ns[0],
            f"time N={ns[-1]} / N={ns[0]} = {growth:.2f} for a {ns[-1] / ns[0]:.0f}× larger N; "
            f"ms per item: " + ", ".join(f"{p:.2f}" for p in per))
    Ls = cfg["consume_lengths"]
    g0, g1 = _num(_get(g, "consume", str(Ls[0]), "p50_ms")), \
        _num(_get(g, "consume", str(Ls[-1]), "p50_ms"))
    m0, m1 = _num(_get(g, "consume", str(Ls[0]), "mean_ms")), \
        _num(_get(g, "consume", str(Ls[-1]), "mean_ms"))
    if g0 and g1 and m0 and m1:
        chk(f"gesmas consume latency flat within 20% from {Ls[0]:,} to {Ls[-1]:,}",
            g1 / g0 <= 1.2 and m1 / m0 <= 1.2,
            f"p50 {g0:.2f} → {g1:.2f} ms ({(g1 / g0 - 1) * 100:+.0f}%), mean {m0:.2f} → "
            f"{m1:.2f} ms ({(m1 / m0 - 1) * 100:+.0f}%)")
    # consume: against ZooKeeper's faster recipe at each length (LockingQueue or the paper's)
    for L, want in zip(Ls[:2], (1.0, 5.0)):
        gr = _num(_get(g, "consume", str(L), "ops_per_s"))
        zr = max([x for x in (_num(_get(z, "consume", str(L), "ops_per_s")),
                              _num(_get(z, "consume", str(L), "paper", "ops_per_s"))) if x]
                 or [0.0])
        if gr and zr:
            chk(f"consume rate at {L:,} ≥{want:g}× ZooKeeper's faster recipe", gr / zr >= want,
                f"{gr / zr:.1f}× ({gr:.0f} vs {zr:.0f} consumes/s, one client)")
    c = cfg["barrier_parties"][-1]
    gb, zb = _num(_get(g, "barrier", str(c), "time_s")), _num(_get(z, "barrier", str(c), "time_s"))
    if gb and zb:
        chk(f"barrier {c} parties ≥5× faster", zb / gb >= 5,
            f"{zb / gb:.1f}× ({gb:.3f} vs {zb:.3f} s for {cfg['barrier_rounds']} rounds)")
    for n, want in ((cfg["lock_clients"][0], 1.0), (cfg["lock_clients"][-1], 2.0)):
        gl, zl = _num(_get(g, "lock", str(n), "handoffs_per_s")), \
            _num(_get(z, "lock", str(n), "handoffs_per_s"))
        if gl and zl:
            chk(f"lock hand-offs at {n} client{'s' if n > 1 else ''} ≥{want:g}× ZooKeeper",
                gl / zl >= want, f"{gl / zl:.2f}× ({gl:.0f} vs {zl:.0f} hand-offs/s)")
    n = cfg["produce_clients"][-1]
    gp, zp = _num(_get(g, "produce", str(n), "ops_per_s")), \
        _num(_get(z, "produce", str(n), "ops_per_s"))
    if gp and zp:
        chk(f"produce throughput at {n} clients ≥1.5× ZooKeeper", gp >= 1.5 * zp,
            f"{gp / zp:.2f}× ({gp:.0f} vs {zp:.0f} ops/s)")
    gm, zm = _num(_get(g, "mixed", "total_per_s")), _num(_get(z, "mixed", "total_per_s"))
    if gm and zm:
        chk("mixed 2P+2C items produced and consumed per second ≥1.5× ZooKeeper",
            gm >= 1.5 * zm, f"{gm / zm:.2f}× ({gm:.0f} vs {zm:.0f} items/s)")
    for op in ("produce", "lock acquire+release"):
        gq, zq = _num(_get(g, "latency", op, "p50_ms")), _num(_get(z, "latency", op, "p50_ms"))
        if gq and zq:
            chk(f"{op} p50 latency ≤ ZooKeeper's", gq <= zq,
                f"{gq:.2f} vs {zq:.2f} ms ({zq / gq:.2f}×)")
    return out


def plots(results: dict[str, Any], cfg: dict[str, Any], out_dir: str) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    files = []
    specs = [
        ("consume", "paper_consume_latency.png", cfg["consume_lengths"], "mean_ms",
         "queue length", "consume latency, mean ms", True,
         "Consume latency vs queue length (1 consumer)"),
        ("herd", "paper_herd.png", cfg["herd_ns"], "time_s", "N blocked consumers",
         "s until all N released", False, "Herd: N waiters, N items produced"),
        ("barrier", "paper_barrier.png", cfg["barrier_parties"], "time_s", "parties",
         f"s for {cfg['barrier_rounds']} consecutive barriers", False, "Barrier"),
    ]
    for exp, fname, xs, key, xl, yl, logx, title in specs:
        if not any(exp in results.get(s, {}) for s in SYSTEMS):
            continue
        fig, ax = plt.subplots(figsize=(5.5, 3.8), dpi=100)
        for s, mk in zip(SYSTEMS, ("o-", "s--")):
            pts = [(x, _num(_get(results.get(s, {}), exp, str(x), key))) for x in xs]
            pts = [(x, y) for x, y in pts if y is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], mk, label=s)
        if logx:
            ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(xl)
        ax.set_ylabel(yl)
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = os.path.join(out_dir, fname)
        fig.savefig(path)
        plt.close(fig)
        files.append(path)
    return files


def git_commit() -> str:
    try:
        h = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                           capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=ROOT, capture_output=True, text=True, timeout=10).stdout
        return h + (" (with uncommitted changes)" if dirty.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def facts(systems: list[str]) -> dict[str, Any]:
    f: dict[str, Any] = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "cores": os.cpu_count(), "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(), "platform": platform.platform(),
        "gesmas_commit": git_commit(),
        "gesmas_secure": os.environ.get("GESMAS_TEST_SECURE") == "1",
    }
    if "zookeeper" in systems:
        import kazoo
        import zk
        f["zookeeper"] = zk.version()
        f["java"] = zk.java_version()
        f["kazoo"] = getattr(kazoo, "__version__", None) or _dist_version("kazoo")
    return f


def _dist_version(name: str) -> str:
    from importlib.metadata import version
    try:
        return version(name)
    except Exception:  # noqa: BLE001
        return "unknown"


def write_docs(command: str, fa: dict[str, Any], table: str, tg: list[str],
               pngs: list[str]) -> str:
    docs = os.path.join(ROOT, "docs")
    os.makedirs(docs, exist_ok=True)
    for p in pngs:
        shutil.copy(p, os.path.join(docs, os.path.basename(p)))
    imgs = "\n".join(f"![{os.path.basename(p)}]({os.path.basename(p)})" for p in pngs)
    text = f"""# Benchmarks: gesmas vs ZooKeeper (the GESMAS paper's experiments)

Generated by `bench/paper.py` (the harness; `bench/zk.py` starts the ZooKeeper ensemble).

- Date: {fa['date']}
- Machine: {fa['cores']} cores, load average {fa['loadavg_at_start']} at start →
  {fa.get('loadavg_at_end')} at end (**other work was running on the machine**; the client
  processes, the 3 gesmas replicas and the 3 ZooKeeper JVMs all share these cores)
- {fa['platform']}, Python {fa['python']}
- ZooKeeper {fa.get('zookeeper', '—')} (Debian package; {fa.get('java', '')}), kazoo
  {fa.get('kazoo', '—')}
- gesmas commit {fa['gesmas_commit']}
- Total run time: {fa.get('total_s')} s

Command:

```sh
{command}
```

## Setup

- **gesmas**: 3 replicas via `LocalCluster` on 127.0.0.1, fsync of the Raft journal on. Each
  client is its own `Client` (own session) with `route="{os.environ.get(ROUTE_ENV, 'leader')}"`;
  client *i* opens its session at replica *i* mod 3 (with `route="leader"` its calls then go
  to the leader).
- **ZooKeeper**: 3 JVMs (`QuorumPeerMain`, `-Xmx256m`) on 127.0.0.1 with durable defaults
  (`forceSync=yes`; only the AdminServer is off, four-letter words `srvr,mntr,ruok` allowed and
  `maxClientCnxns=0`). Each client is its own `KazooClient`; client *i* connects to server
  *i* mod 3 first.
- Recipes: queue = kazoo `LockingQueue` (`put`; `get(timeout)` + `consume()` — every `get`
  lists and sorts the entries and the taken nodes and watches the parent); lock = kazoo `Lock`;
  barrier = kazoo `DoubleBarrier(c).enter()` on a fresh path per round (kazoo's `Barrier` is a
  gate opened by a third party, not a rendezvous of c parties); gesmas uses `Queue`, `Lock` and
  one cyclic `Barrier(c)`.
- Clients are threads in spawned worker processes, so the Python client side is part of every
  figure, for both systems alike.
- Both clusters run for the whole session and the systems take turns: each point (an
  experiment at one size) is measured on one system and right after on the other, the first
  one alternating from point to point, so that a change in the host's load between points
  does not fall on one system only.
- Consume latency: one queue per length, each pre-filled (gesmas: 32 producing clients;
  ZooKeeper: `create_async` with 1000 creates in flight); after a 10 s pause for the fills'
  after-effects (snapshots, checkpoints, the kernel writing back the fills' dirty pages), one
  client times 300 consumes per length, taking them round-robin (one from each queue in
  turn), so that load from elsewhere on the host weighs on every length alike.
- Herd: N clients block in `consume`, then one producer produces N items; time from the first
  produce to the last consumer released (includes the N sequential produces).
- Lock: clients loop acquire/release for a fixed time; every holding interval is logged with
  CLOCK_MONOTONIC (system wide) and checked afterwards for overlaps ("ok" in the table); the
  gesmas fences are also checked to increase.

## Results

"gesmas/zk" is the plain ratio of the two values; "better" says which direction is better for
that row; "gesmas advantage" is how many times better gesmas is (>1: gesmas better, <1:
ZooKeeper better).

{table}

## Targets

{chr(10).join(tg)}

Where the time goes on the gesmas side, and what was changed because of it:
[performance.md](performance.md).

## Plots

{imgs}
"""
    path = os.path.join(docs, "benchmarks.md")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


# -- main --------------------------------------------------------------------------------------

def config(quick: bool) -> dict[str, Any]:
    if quick:
        return {"produce_clients": [1, 2], "seconds": 1.0, "consume_lengths": [10, 50],
                "consume_n": 5, "consume_settle": 0.0, "fill_budget": 30.0, "consume_budget": 30.0,
                "herd_ns": [2, 4], "herd_timeout": 30.0, "barrier_parties": [2, 3],
                "barrier_rounds": 2, "barrier_timeout": 30.0, "lock_clients": [1, 2],
                "latency_n": 10, "procs": 2, "herd_procs": 2}
    return {"produce_clients": [1, 4, 16], "seconds": 5.0,
            "consume_lengths": [1000, 10000, 100000], "consume_n": 300, "consume_settle": 10.0,
            "fill_budget": 420.0, "consume_budget": 120.0,
            "herd_ns": [50, 100, 200], "herd_timeout": 120.0,
            "barrier_parties": [10, 25, 50], "barrier_rounds": 5, "barrier_timeout": 120.0,
            "lock_clients": [1, 4, 16], "latency_n": 200, "procs": 4, "herd_procs": 4}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes (the smoke test)")
    ap.add_argument("--secure", action="store_true",
                    help="gesmas with TLS on the client ports and auth on (clients log in as "
                         "root): the cost of security (LocalCluster secure=True)")
    ap.add_argument("--only", default=None, help="comma list of: " + ",".join(EXPERIMENTS))
    ap.add_argument("--systems", default="gesmas,zookeeper")
    ap.add_argument("--route", choices=["leader", "replica"], default="leader",
                    help="gesmas clients' call routing (Client(route=...))")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    ap.add_argument("--docs", choices=["auto", "yes", "no"], default="auto",
                    help="write docs/benchmarks.md (auto: full run, both systems, all experiments)")
    a = ap.parse_args(argv)
    only = EXPERIMENTS if not a.only else [x.strip() for x in a.only.split(",") if x.strip()]
    systems = [x.strip() for x in a.systems.split(",") if x.strip()]
    bad = [x for x in only if x not in EXPERIMENTS] + [x for x in systems if x not in SYSTEMS]
    if bad or not only or not systems:
        ap.error(f"unknown experiment/system: {bad}")
    cfg = config(a.quick)
    os.environ[ROUTE_ENV] = a.route
    if a.secure:                 # LocalCluster reads it and exports the client's TLS and login
        os.environ["GESMAS_TEST_SECURE"] = "1"
    os.makedirs(a.out, exist_ok=True)

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    logging.getLogger("kazoo").setLevel(logging.CRITICAL)
    logging.getLogger("gesmas").setLevel(logging.CRITICAL)

    fa = facts(systems)
    command = "bench/paper.py" + "".join(f" {x}" for x in (argv if argv is not None
                                                             else sys.argv[1:]))
    results: dict[str, Any] = {s: {} for s in systems}
    t_all = time.monotonic()
    try:
        with contextlib.ExitStack() as stack:
            eps = {s: stack.enter_context(Gesmas() if s == "gesmas" else ZooKeeper())
                   for s in systems}
            step = 0
            for e in only:
                key = SIZE_KEYS.get(e)
                for size in (cfg[key] if key else [None]):
                    # Both systems measure the same point one after the other, first one then
                    # the other in turn, so that a change in the host's load between points
                    # does not fall on one system only.
                    order = systems if step % 2 == 0 else systems[::-1]
                    step += 1
                    c = dict(cfg, **{key: [size]}) if key else cfg
                    for s in order:
                        t0 = time.monotonic()
                        try:
                            results[s].setdefault(e, {}).update(EXP_FUNCS[e](s, eps[s], c))
                        except Exception as ex:  # noqa: BLE001 - reported, the run goes on
                            log(f"  [{s}] {e} FAILED: {type(ex).__name__}: {ex}")
                            results[s].setdefault(e, {})["failed"] = (
                                f"{type(ex).__name__}: {str(ex)[:300]}")
                        log(f"  [{s}] {e}{'' if size is None else f' {size}'}: "
                            f"{time.monotonic() - t0:.0f} s")
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    fa["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    fa["total_s"] = round(time.monotonic() - t_all, 1)
    rows = metric_rows(results, cfg)
    table = render_table(rows)
    tg = targets(results, cfg) if len(systems) == 2 else []
    pngs = plots(results, cfg, a.out)
    doc = {"facts": fa, "command": command, "config": cfg, "results": results,
           "table": [{k: v for k, v in r.items() if k != "fmt"} for r in rows], "targets": tg}
    jpath = os.path.join(a.out, "paper.json")
    with open(jpath, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, default=str)
    print(f"\npaper bench{' (quick)' if a.quick else ''}: {fa['date']}, {fa['cores']} cores, "
          f"load {fa['loadavg_at_start']} -> {fa['loadavg_at_end']}, Python {fa['python']}, "
          f"gesmas {fa['gesmas_commit']}, ZooKeeper {fa.get('zookeeper', '—')}; "
          f"total {fa['total_s']} s\n")
    print(table)
    if tg:
        print("\nTargets:\n" + "\n".join(tg))
    failed = [f"{s}/{e}" for s in results for e, v in results[s].items()
              if isinstance(v, dict) and "failed" in v]
    print(f"\nJSON: {jpath}\nplots: {' '.join(pngs)}")
    write = a.docs == "yes" or (a.docs == "auto" and not a.quick and len(systems) == 2
                                and only == EXPERIMENTS)
    if write:
        print(f"docs: {write_docs(command, fa, table, tg, pngs)}")
    if failed:
        print(f"FAILED experiments: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

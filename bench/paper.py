#!/usr/bin/env python
"""The GESMAS paper's experiments, gesmas side by side with ZooKeeper (and etcd for reads, map).

    python bench/paper.py [--quick] [--only NAME[,NAME]] [--systems gesmas,zookeeper] [--out DIR]
    python bench/paper.py --only reads --systems gesmas,zookeeper,etcd     # issue 24's reads
    python bench/paper.py --only map --systems gesmas,zookeeper,etcd       # issue 27's Map

Systems
  gesmas     a 3-node LocalCluster on 127.0.0.1, fsync on; every client is its own `Client`
             (own session), client i preferring replica i mod 3.
  zookeeper  a 3-node ensemble on 127.0.0.1 (bench/zk.py: Debian's zookeeper, durable
             defaults, forceSync on), driven through kazoo recipes; every client is its own
             KazooClient, client i connecting to server i mod 3 first.
  etcd       (reads only) a 3-member etcd 3.4 cluster on 127.0.0.1 (bench/etcd_cluster.py:
             Debian's etcd-server, default fsync), through a minimal gRPC client; client i
             talks to member i mod 3.

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

Run only when named (--only reads / map; not part of the default run):
  reads     reads of one key, each system's linearizable read and its cheapest one: gesmas
            Counter.get (a declared reader: no log entry) with Client(consistency=
            "linearizable") / "sequential", route="replica" (calls stay on the replica given);
            ZooKeeper sync + getData / getData; etcd Range / serializable Range. Points: 1
            client on the leader and 1 on a follower (p50, p99, reads/s), 16 clients spread
            over the three replicas (reads/s), and 16 clients with 95 % reads and 5 % writes
            (gesmas Counter.add, ZooKeeper setData, etcd Put) of the same key (ops/s). Around
            each point the leader's log index is read (gesmas Status commit_index, ZooKeeper
            zxid, etcd raftIndex): a read-only load should add no entry. The whole set runs
            --repeat times (default 3; 1 with --quick), systems taking turns point by point;
            the report gives the median and the spread (min-max) of the repetitions.
  map       a key-value store (bench/paper_map.py): get (linearizable, cheapest) and put of
            one key at 1 and 16 clients (p50, p99, ops/s), and a watch fan-out: N watchers of
            one key, and of N keys, one writer: ms from a put to the last watcher notified,
            and the servers' CPU ms per change. gesmas Map; ZooKeeper znodes with kazoo's
            one-shot watches; etcd keys with Watch streams.

Both clusters stay up for the whole run and the systems take turns point by point (one
experiment at one size on each, in alternating order), so that the host's load drifting
during the run does not favour one of them. Clients run as threads in spawned worker
processes (the client side is Python too). Output: a
markdown table (both systems and the ratio gesmas/zk, with which direction is better), the
same as JSON (results.json) and PNG plots under --out (default bench/results/). A full run with
both systems also rewrites docs/benchmarks.md and copies the PNGs to docs/. Every wait is
bounded; a size that is infeasible within its time bound is reported as such.

Modules: this one (the experiments, the systems, main), paper_conns.py (one connection of each
system), paper_workers.py (the client processes), paper_report.py (table, targets, plots,
docs/benchmarks.md), paper_common.py (constants).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import signal
import sys
import threading
import time
import uuid
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from paper_common import (EXPERIMENTS, EXTRA_EXPERIMENTS, OP_TIMEOUT,  # noqa: E402
                          PAPER_SYSTEMS, ROOT, ROUTE_ENV, SYSTEMS, log, stats)
from paper_conns import ZkConn, connect  # noqa: E402
from paper_workers import run_clients  # noqa: E402
import paper_map  # noqa: E402
from paper_report import (facts, metric_rows, plots, reads_table, reads_targets,  # noqa: E402
                          render_table, targets, write_docs, write_reads_docs)


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


#: The running systems' clusters (leader, log index), for the reads experiment.
CLUSTERS: dict[str, Any] = {}

READ_KEY = "paper-read"


def _get(d: Any, *path: str) -> Any:
    for k in path:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def reads_key(point: str, mode: str, rep: int) -> str:
    return f"{point}|{mode}|{rep}"


def exp_reads(system: str, ep: list[str], cfg: dict[str, Any]) -> dict[str, Any]:
    """One point of the reads experiment (cfg["reads_points"]: [(rep, point, mode)]):
    point "1@leader" / "1@follower" (one client there), "16" (clients spread over the
    replicas, client i at replica i mod 3), "mix" (the same with a fraction of writes)."""
    out: dict[str, Any] = {}
    cl = CLUSTERS[system]
    for rep, point, mode in cfg["reads_points"]:
        leader, followers = cl.roles()
        if point.startswith("1@"):
            first = leader if point == "1@leader" else followers[0]
            eps = [first] + [e for e in ep if e != first]
            n = 1
        else:
            eps, n = ep, cfg["reads_clients"]
        conn_opts: dict[str, Any] = {"consistency": "linearizable" if mode == "linearizable"
                                     else "sequential"}
        if system == "gesmas":
            conn_opts["route"] = "replica"
        seconds = cfg["reads_seconds_1"] if n == 1 else cfg["reads_seconds"]
        setup = connect(system, ep, 0)
        try:                                   # the key exists before the clients read it
            (setup.setup_read if system == "zookeeper" else setup.write)(READ_KEY)
        finally:
            setup.close()
        marks: dict[str, Any] = {}

        hold = cfg["reads_hold"]

        def on_start(start: float, seconds: float = seconds) -> dict[str, Any]:
            # the leader's log index once every client has connected (sessions opened,
            # gesmas' CreateObject of the proxy done: log entries of their own), and after
            # the load's end, while the clients still hold their sessions open (`hold`
            # seconds): their closing is an entry too (gesmas, ZooKeeper)
            marks["before"] = cl.log_state()
            time.sleep(max(0.0, start + seconds + 0.05 - time.monotonic()))
            marks["after"] = cl.log_state()
            if time.monotonic() > start + seconds + hold - 0.1:
                marks["late"] = True                # the sessions may have closed meanwhile
            return marks
        mix = point == "mix"
        r = run_clients(system, eps, "readmix" if mix else "read", ["reader"] * n,
                        {"key": READ_KEY, "seconds": seconds, "conn": conn_opts,
                         "write_frac": cfg["reads_write_frac"] if mix else 0.0,
                         "warmup": cfg["reads_warmup"], "hold": hold,
                         "limit": seconds + hold + 2 * OP_TIMEOUT},
                        min(cfg["procs"], n), on_start=on_start)
        ops = sum(x["ops"] for x in r["slots"])
        writes = sum(x.get("writes", 0) for x in r["slots"])
        el = max((x.get("end", 0) for x in r["slots"]), default=0) - r["start"]
        lat = [v for x in r["slots"] for v in x["lat"]]
        wlat = [v for x in r["slots"] for v in x.get("wlat", [])]
        rec = {"rep": rep, "point": point, "mode": mode, "clients": n, "ops": ops,
               "reads": ops - writes, "writes": writes, "elapsed_s": el,
               "ops_per_s": ops / el if el > 0 else float("nan"),
               "reads_per_s": (ops - writes) / el if el > 0 else float("nan"),
               **stats(lat), "write": stats(wlat), "at": eps[0] if n == 1 else "spread",
               "leader": leader, "log_before": marks.get("before"),
               "log_after": marks.get("after"), "log_late": bool(marks.get("late")),
               "errors": r["errors"][:5],
               "n_errors": len(r["errors"])}
        i0, i1 = (_get(marks, "before", "index"), _get(marks, "after", "index"))
        if i0 is not None and i1 is not None and not marks.get("late"):
            rec["log_entries"] = i1 - i0
        if r["errors"] or len(r["slots"]) < n:
            rec["infeasible"] = (f"{len(r['errors'])} errors, {len(r['slots'])} of {n} clients "
                                 f"reported: {'; '.join(r['errors'][:2])}")
        out[reads_key(point, mode, rep)] = rec
        log(f"  [{system}] reads {point} {mode} #{rep}: {rec['ops_per_s']:.0f} ops/s, read p50 "
            f"{rec['p50_ms']:.2f} ms, {writes} writes, log +{rec.get('log_entries')}"
            f"{' ' + rec['infeasible'] if 'infeasible' in rec else ''}"
            f"{'' if mix or not rec.get('log_entries') else f' {marks}'}")
    return out


#: The configuration list each experiment loops over; main() runs one size at a time.
SIZE_KEYS = {"produce": "produce_clients", "herd": "herd_ns", "barrier": "barrier_parties",
             "lock": "lock_clients", "reads": "reads_points", "map": "map_points"}

EXP_FUNCS = {"produce": exp_produce, "consume": exp_consume, "mixed": exp_mixed,
             "herd": exp_herd, "barrier": exp_barrier, "lock": exp_lock, "latency": exp_latency,
             "reads": exp_reads,
             "map": lambda s, ep, cfg: paper_map.exp_map(s, ep, cfg, CLUSTERS[s])}


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
        CLUSTERS["gesmas"] = self
        return self.cl.addresses.split(",")

    def roles(self) -> tuple[str, list[str]]:
        lead = self.cl.find_leader()
        return lead.client_addr, [m.client_addr for m in self.cl.members if m is not lead]

    def log_state(self) -> dict[str, Any]:
        """The leader's commit index (the Status RPC: itself a read, no entry), with its term
        and counts, to tell what made an entry if one appears."""
        lead = self.cl.find_leader()
        st = self.cl.member_status(lead, timeout=5.0) or {}
        return {"index": st.get("commit_index"), "term": st.get("term"),
                "leader": lead.client_addr, "sessions": st.get("session_count"),
                "objects": st.get("object_count"), "waiters": st.get("waiter_count")}

    def pids(self) -> list[int]:
        return [m.proc.pid for m in self.cl.members if m.proc is not None]

    def __exit__(self, *exc: Any) -> None:
        self.cl.stop()


class ZooKeeper:
    def __enter__(self) -> list[str]:
        import zk
        self.ens = zk.ZkEnsemble()
        log(f"starting a 3-node ZooKeeper {zk.version()} ensemble (forceSync on) ...")
        self.ens.start(timeout=90)
        CLUSTERS["zookeeper"] = self
        return self.ens.hosts

    def roles(self) -> tuple[str, list[str]]:
        modes = self.ens.modes()
        lead = [m for m in self.ens.members if modes.get(m.myid) == "leader"]
        if len(lead) != 1:
            raise RuntimeError(f"no ZooKeeper leader: {modes}")
        return (f"127.0.0.1:{lead[0].client_port}",
                [f"127.0.0.1:{m.client_port}" for m in self.ens.members if m is not lead[0]])

    def log_state(self) -> dict[str, Any]:
        """The leader's last zxid (`srvr`): epoch << 32 | transaction counter."""
        import zk
        leader = self.roles()[0]
        zxid = None
        for line in zk.four_letter(int(leader.rsplit(":", 1)[1]), "srvr").splitlines():
            if line.startswith("Zxid:"):
                zxid = int(line.split(":", 1)[1].strip(), 16)
        return {"index": zxid, "epoch": None if zxid is None else zxid >> 32,
                "leader": leader}

    def pids(self) -> list[int]:
        return [m.proc.pid for m in self.ens.members if m.proc is not None]

    def __exit__(self, *exc: Any) -> None:
        self.ens.stop()


class Etcd:
    def __enter__(self) -> list[str]:
        import etcd_cluster
        self.cl = etcd_cluster.EtcdCluster()
        log(f"starting a 3-member etcd {etcd_cluster.version()} cluster (default fsync) ...")
        self.cl.start(timeout=90)
        CLUSTERS["etcd"] = self
        return self.cl.hosts

    def roles(self) -> tuple[str, list[str]]:
        lead = self.cl.leader()
        return lead, [h for h in self.cl.hosts if h != lead]

    def log_state(self) -> dict[str, Any]:
        """The leader's Raft commit index (Maintenance.Status raftIndex)."""
        from etcd_cluster import EtcdKV
        leader = self.cl.leader()
        kv = EtcdKV(leader)
        try:
            st = kv.status()
        finally:
            kv.close()
        return {"index": st["raft_index"], "term": st["raft_term"], "leader": leader,
                "revision": st["revision"]}

    def pids(self) -> list[int]:
        return [m.proc.pid for m in self.cl.members if m.proc is not None]

    def __exit__(self, *exc: Any) -> None:
        self.cl.stop()


SYSTEM_CLASSES: dict[str, Any] = {"gesmas": Gesmas, "zookeeper": ZooKeeper, "etcd": Etcd}


READ_POINTS = ["1@leader", "1@follower", "16", "mix"]
READ_MODES = ["cheapest", "linearizable"]


def config(quick: bool, repeat: int | None = None) -> dict[str, Any]:
    reps = repeat if repeat is not None else (1 if quick else 3)
    reads = {"reads_points": [(rep, point, mode) for rep in range(reps) for point in READ_POINTS
                              for mode in READ_MODES],
             "reads_repeat": reps, "reads_write_frac": 0.05}
    reads.update({"reads_clients": 3, "reads_seconds_1": 0.5, "reads_seconds": 0.5,
                  "reads_warmup": 2, "reads_hold": 1.0} if quick else
                 {"reads_clients": 16, "reads_seconds_1": 3.0, "reads_seconds": 5.0,
                  "reads_warmup": 20, "reads_hold": 2.0})
    return reads | paper_map.config(quick) | _config(quick)


def _config(quick: bool) -> dict[str, Any]:
    if quick:
        return {"produce_clients": [1, 2], "seconds": 0.5, "consume_lengths": [10],
                "consume_n": 5, "consume_settle": 0.0, "fill_budget": 30.0, "consume_budget": 30.0,
                "herd_ns": [3], "herd_timeout": 30.0, "barrier_parties": [3],
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
    ap.add_argument("--only", default=None, help="comma list of: " + ",".join(
        EXPERIMENTS + EXTRA_EXPERIMENTS) + f" (default: {','.join(EXPERIMENTS)})")
    ap.add_argument("--systems", default="gesmas,zookeeper",
                    help="comma list of: " + ",".join(SYSTEMS) + " (etcd: reads, map only)")
    ap.add_argument("--repeat", type=int, default=None,
                    help="repetitions of the reads experiment (default 3, --quick 1)")
    ap.add_argument("--route", choices=["leader", "replica"], default="leader",
                    help="gesmas clients' call routing (Client(route=...))")
    ap.add_argument("--map-points", default=None,
                    help="comma list of the map experiment's points to run (e.g. "
                         "fan|popular|100,fan|distinct|10; default: all)")
    ap.add_argument("--watch", choices=["stream", "rearm"], default="stream",
                    help="gesmas watchers in the map fan-out: one Map.watch_stream each "
                         "(default), or a Map.watch per change")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    ap.add_argument("--docs", choices=["auto", "yes", "no"], default="auto",
                    help="write docs/benchmarks.md (auto: full run, both systems, all experiments)")
    a = ap.parse_args(argv)
    only = EXPERIMENTS if not a.only else [x.strip() for x in a.only.split(",") if x.strip()]
    systems = [x.strip() for x in a.systems.split(",") if x.strip()]
    bad = [x for x in only if x not in EXPERIMENTS + EXTRA_EXPERIMENTS] + \
        [x for x in systems if x not in SYSTEMS]
    if bad or not only or not systems:
        ap.error(f"unknown experiment/system: {bad}")
    if "etcd" in systems and [x for x in only if x not in EXTRA_EXPERIMENTS]:
        ap.error("etcd takes part in the reads and map experiments only (--only reads,map)")
    cfg = config(a.quick, a.repeat)
    cfg["map_watch"] = a.watch
    if a.map_points:
        points = [x.strip() for x in a.map_points.split(",") if x.strip()]
        unknown = [x for x in points if x not in cfg["map_points"]]
        if unknown:
            ap.error(f"unknown map points {unknown}; the points are: "
                     f"{','.join(cfg['map_points'])}")
        cfg["map_points"] = points
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
            eps = {s: stack.enter_context(SYSTEM_CLASSES[s]()) for s in systems}
            step = 0
            for e in only:
                key = SIZE_KEYS.get(e)
                for size in (cfg[key] if key else [None]):
                    # The systems measure the same point one after the other, the first one
                    # rotating from point to point (two systems: in turn), so that a change in
                    # the host's load between points does not fall on one system only.
                    k = step % len(systems)
                    order = systems[k:] + systems[:k]
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
    tg = targets(results, cfg) if sorted(systems) == sorted(PAPER_SYSTEMS) else []
    rtable, rtg = "", []
    if "reads" in only:
        rtable = reads_table(results, cfg)
        rtg = reads_targets(results, cfg)
    mtable, mtg = "", []
    if "map" in only:
        mtable = paper_map.map_table(results, cfg)
        mtg = paper_map.map_targets(results, cfg)
    pngs = plots(results, cfg, a.out)
    doc = {"facts": fa, "command": command, "config": cfg, "results": results,
           "table": [{k: v for k, v in r.items() if k != "fmt"} for r in rows], "targets": tg,
           "reads_table": rtable, "reads_targets": rtg, "map_table": mtable,
           "map_targets": mtg}
    jpath = os.path.join(a.out, "paper.json")
    with open(jpath, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, default=str)
    print(f"\npaper bench{' (quick)' if a.quick else ''}: {fa['date']}, {fa['cores']} cores, "
          f"load {fa['loadavg_at_start']} -> {fa['loadavg_at_end']}, Python {fa['python']}, "
          f"gesmas {fa['gesmas_commit']}, ZooKeeper {fa.get('zookeeper', '—')}, "
          f"etcd {fa.get('etcd', '—')}; total {fa['total_s']} s\n")
    if rows:
        print(table)
    if tg:
        print("\nTargets:\n" + "\n".join(tg))
    if rtable:
        print(("\n" if rows else "") + rtable)
        print("\nRead targets (issue 24):\n" + "\n".join(rtg))
    if mtable:
        print(("\n" if rows or rtable else "") + mtable)
        print("\nMap targets (issue 27):\n" + "\n".join(mtg))
    failed = [f"{s}/{e}" for s in results for e, v in results[s].items()
              if isinstance(v, dict) and "failed" in v]
    print(f"\nJSON: {jpath}\nplots: {' '.join(pngs)}")
    paper_run = [x for x in only if x not in EXTRA_EXPERIMENTS]
    write = a.docs == "yes" or (a.docs == "auto" and not a.quick
                                and sorted(systems) == sorted(PAPER_SYSTEMS)
                                and only == EXPERIMENTS)
    if write and paper_run:
        print(f"docs: {write_docs(command, fa, table, tg, pngs)}")
    if rtable and (a.docs == "yes" or (a.docs == "auto" and not a.quick
                                       and sorted(systems) == sorted(SYSTEMS))):
        print(f"docs: {write_reads_docs(command, fa, rtable, rtg, cfg)} (reads section)")
    if failed:
        print(f"FAILED experiments: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())


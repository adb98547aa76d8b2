#!/usr/bin/env python
"""Scale: a 3-replica cluster growing to N objects (and W blocked waiters), checkpoints and
catch-up while a produce loop runs (issue "Scale without pauses").

    python bench/scale_bench.py                          # 10^5 objects, 1 run
    python bench/scale_bench.py --objects 1000000 --waiters 100000 --runs 3
    python bench/scale_bench.py --quick                  # 1,000 objects (a smoke test)

One run, on a fresh LocalCluster (fsync on, metrics on, GESMAS_CHECKPOINT_EVERY entries
between checkpoints), with one client producing to a queue from start to end, one call at a
time, every call timed (in a process of its own: a thread here would also wait for this
process's GIL, which the 16 creating threads hold most of the time):
1. create: 16 client threads make Counters until there are N; the time of each tenth.
2. idle: with N objects, produce until two more checkpoints were taken (a checkpoint then
   saves only what changed, plus writing every object's frame).
3. waiters (W > 0): W consume calls wait on one queue (asyncio clients), then as in 2.
4. restart: kill -9 a follower and start it on its data; the time until it has applied
   what the leader had committed when it started again.
5. wipe: stop a follower, empty its data dir, start it (it rejoins); the same time.
6. list: ListObjects latency (5 calls).
Throughout, every replica's metrics are read every 0.1 s: when each checkpoint happened,
how long it took (gesmas_checkpoint_seconds), the Raft term and who leads, and the
collector's passes over 50 and 100 ms (gesmas_gc_pause_seconds), and when a replica's Raft
snapshot file changed (gesmas_snapshot_bytes: pysyncobj's log compaction wrote one); and
what the host took from this virtual machine (bench/host_stalls.py: steal, and gaps of a
sampler process), to tell its stalls from ours.

Reported per run: creation rate per tenth; RSS of each replica per object and per waiter;
checkpoint durations and size; per phase the longest produce call, the longest within 0.5 s
of a checkpoint, the median and 99th percentile, and how many took over 50 and 100 ms; the
calls started within AFTER s after a checkpoint (while its capture may run) against those
started over CLEAR s from any (what the load alone does); term and leader before and after
each phase (an election or a leader change is named); catch-up times; list latency. With --runs > 1: median and min-max. The
JSON goes to --json (with --timeline: every produce call, checkpoint, term change and the
kill, start and catch-up of each restart, in seconds from the run's start). Bounded: each phase has a deadline, the cluster is stopped on exit.
"""
from __future__ import annotations

import argparse
import asyncio
import bisect
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__))))

from gesmas.aio import Client as AioClient  # noqa: E402
from gesmas.client import Client, SessionExpired  # noqa: E402
from gesmas.server.cluster import LocalCluster, Member  # noqa: E402
from host_stalls import HostStalls  # noqa: E402
from scale_report import AFTER, CLEAR, summary  # noqa: E402

THREADS = 16
PHASE_LIMIT = 1800.0            # seconds: no phase runs longer


def scrape(addr: str) -> dict[str, float]:
    try:
        text = urllib.request.urlopen(f"http://{addr}/metrics", timeout=5).read().decode()
    except (OSError, http.client.HTTPException):     # a replica killed or restarting
        return {}
    out = {}
    for line in text.splitlines():
        if line.startswith(("gesmas_checkpoint_seconds_sum", "gesmas_checkpoint_seconds_count",
                            "gesmas_checkpoint_index", "gesmas_checkpoint_bytes",
                            "gesmas_raft_is_leader", "gesmas_raft_term",
                            "gesmas_raft_applied_index", "gesmas_raft_commit_index",
                            "gesmas_objects", "gesmas_waiters", "gesmas_snapshot_bytes")):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
        elif line.startswith(("gesmas_gc_pause_seconds_count{",
                              "gesmas_gc_pause_seconds_bucket{")) and (
                '"0.05"' in line or '"0.1"' in line or "_count{" in line):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def long_gc_passes(got: dict[str, float]) -> dict[int, tuple[float, float]]:
    """Per generation, how many of a replica's collector passes took over 50 and over
    100 ms so far (gesmas_gc_pause_seconds: its count less its 0.05 and 0.1 buckets)."""
    out = {}
    for g in range(3):
        count = got.get(f'gesmas_gc_pause_seconds_count{{generation="{g}"}}')
        if count is None:
            continue
        bucket = f'gesmas_gc_pause_seconds_bucket{{generation="{g}",le='
        out[g] = (count - got.get(bucket + '"0.05"}', count),
                  count - got.get(bucket + '"0.1"}', count))
    return out


def rss_mib(m: Member) -> float:
    try:
        with open(f"/proc/{m.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except (OSError, AttributeError):
        pass
    return float("nan")


class Watch:
    """Every replica's metrics every 0.1 s: checkpoints (when, how long), terms, leaders;
    and what the host took (`host`: steal, the sampler's gaps)."""

    def __init__(self, cl: LocalCluster) -> None:
        self.cl = cl
        self.host = HostStalls()
        self.lock = threading.Lock()
        self.checkpoints: list[dict[str, Any]] = []   # {"t", "node", "index", "seconds"}
        self.terms: list[tuple[float, int, float]] = []    # (t, node, term) on change
        self.leaders: list[tuple[float, int]] = []        # (t, node) when a node leads anew
        # (t, node, generation, passes over 50 ms, over 100 ms) seen since the last scrape
        self.long_gcs: list[tuple[float, int, int, int, int]] = []
        self.snapshots: list[tuple[float, int, int]] = []   # (t, node, bytes): a new file
        self.last: dict[int, dict[str, float]] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.1):
            for m in self.cl.members:
                if not self.cl.alive(m):
                    continue
                now, got = time.monotonic(), scrape(m.metrics_addr)
                if not got:
                    continue
                before = self.last.get(m.node_id, {})
                with self.lock:
                    if got.get("gesmas_checkpoint_index") != before.get(
                            "gesmas_checkpoint_index") and before:
                        n = got.get("gesmas_checkpoint_seconds_count", 0) - \
                            before.get("gesmas_checkpoint_seconds_count", 0)
                        s = got.get("gesmas_checkpoint_seconds_sum", 0) - \
                            before.get("gesmas_checkpoint_seconds_sum", 0)
                        self.checkpoints.append({
                            "t": now, "node": m.node_id,
                            "index": int(got.get("gesmas_checkpoint_index", 0)),
                            "seconds": s / n if n > 0 else None,
                            "bytes": int(got.get("gesmas_checkpoint_bytes", 0))})
                    elif before and got.get("gesmas_checkpoint_bytes") != before.get(
                            "gesmas_checkpoint_bytes"):
                        # a deferred checkpoint's size is known once its capture has ended
                        for c in reversed(self.checkpoints):
                            if c["node"] == m.node_id:
                                if c["index"] == int(got.get("gesmas_checkpoint_index", 0)):
                                    c["bytes"] = int(got.get("gesmas_checkpoint_bytes", 0))
                                break
                    if got.get("gesmas_raft_term") != before.get("gesmas_raft_term"):
                        self.terms.append((now, m.node_id, got.get("gesmas_raft_term", 0)))
                    snap = got.get("gesmas_snapshot_bytes")
                    if before and snap and snap != before.get("gesmas_snapshot_bytes"):
                        self.snapshots.append((now, m.node_id, int(snap)))
                    was = long_gc_passes(before)
                    for g, (over50, over100) in long_gc_passes(got).items():
                        b50, b100 = was.get(g, (0.0, 0.0))
                        if over50 > b50 and before:     # (a restarted replica counts anew)
                            self.long_gcs.append((now, m.node_id, g, int(over50 - b50),
                                                  int(max(0.0, over100 - b100))))
                    if got.get("gesmas_raft_is_leader") and not before.get(
                            "gesmas_raft_is_leader"):
                        self.leaders.append((now, m.node_id))
                    self.last[m.node_id] = got

    def term(self) -> float:
        with self.lock:
            return max((v.get("gesmas_raft_term", 0) for v in self.last.values()), default=0)

    def leader(self) -> int | None:
        with self.lock:
            for node, v in self.last.items():
                if v.get("gesmas_raft_is_leader"):
                    return node
        return None

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        self.host.close()


def produce_loop(addresses: str, record, stop: threading.Event) -> None:
    """Produce to a queue and consume it again until `stop`, one call at a time; each
    produce is timed: `record(t0, ms, error or None, session_lost)`."""
    client = Client(addresses, retry_timeout=60)
    q = client.queue("scale-produce")
    n = 0
    try:
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                q.produce(n)
                record(t0, (time.monotonic() - t0) * 1e3, None, False)
                q.consume(timeout=60)          # the queue stays short (not timed)
            except Exception as e:         # reported, the loop goes on
                lost = isinstance(e, SessionExpired)
                record(t0, (time.monotonic() - t0) * 1e3, repr(e), lost)
                if lost:                   # a new session, counted as an error
                    client.close()
                    client = Client(addresses, retry_timeout=60)
                    q = client.queue("scale-produce")
            n += 1
    finally:
        client.close()


def produce_child(addresses: str, path: str) -> None:
    """`--produce-loop FILE` (a child process): the produce loop until stdin closes, one line
    per call appended to FILE: start (time.monotonic()), ms, and an error's repr if any."""
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    with open(path, "a", buffering=1) as f:
        def record(t0: float, ms: float, error: str | None, lost: bool) -> None:
            f.write(f"{t0:.6f} {ms:.3f}" + (f" {int(lost)} {json.dumps(error)}" if error else "")
                    + "\n")
        produce_loop(addresses, record, stop)


class Producer:
    """One client producing to a queue, one call at a time, each call timed.

    It runs in a child process of its own (`--produce-loop`). In this process its thread
    shared the GIL with the 16 creating threads and the metrics watcher, so a call's time
    also held its wait for this process's GIL (`in_process`, kept to compare). The child's
    times are time.monotonic(), the same clock in every process (CLOCK_MONOTONIC)."""

    def __init__(self, cl: LocalCluster, in_process: bool = False) -> None:
        self._calls: list[tuple[float, float]] = []     # (start, ms)
        self.errors: list[str] = []
        self.sessions_lost = 0
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        self.proc: subprocess.Popen | None = None
        self._path = ""
        self._seen = 0
        if in_process:
            self.thread = threading.Thread(target=produce_loop, daemon=True,
                                           args=(cl.addresses, self._record, self.stop))
            self.thread.start()
            return
        fd, self._path = tempfile.mkstemp(prefix="scale-produce-", suffix=".txt")
        os.close(fd)
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__),
                                      "--produce-loop", self._path, "--cluster", cl.addresses],
                                     stdin=subprocess.PIPE)

    def _record(self, t0: float, ms: float, error: str | None, lost: bool) -> None:
        self._calls.append((t0, ms))
        if error is not None:
            self.errors.append(error)
            self.sessions_lost += lost

    @property
    def calls(self) -> list[tuple[float, float]]:
        """Every call so far (the child's lines read up to the last complete one)."""
        if self._path:
            with open(self._path, "rb") as f:
                f.seek(self._seen)
                data = f.read()
            data = data[:data.rfind(b"\n") + 1]
            self._seen += len(data)
            for line in data.decode().splitlines():
                t0, ms, *rest = line.split(" ", 3)
                self._record(float(t0), float(ms), json.loads(rest[1]) if rest else None,
                             bool(rest) and rest[0] == "1")
        return self._calls

    def longest(self, start: float, end: float) -> float:
        return max((ms for t, ms in self.calls if start <= t < end), default=0.0)

    def spread(self, start: float, end: float) -> dict[str, Any]:
        """The median and 99th percentile of the calls started in [start, end), and how many
        took over 50 and over 100 ms (a longest call alone does not say if it was one)."""
        ms = sorted(x for t, x in self.calls if start <= t < end)
        if not ms:
            return {}
        return {"produce_p50_ms": round(ms[len(ms) // 2], 1),
                "produce_p99_ms": round(ms[min(len(ms) - 1, len(ms) * 99 // 100)], 1),
                "produce_over_50ms": sum(1 for x in ms if x > 50),
                "produce_over_100ms": sum(1 for x in ms if x > 100)}

    def after(self, start: float, end: float, marks: list[float]) -> dict[str, Any]:
        """The calls started in [start, end) split by where they fall from the checkpoints
        (each seen at one of `marks`): started in the AFTER s after one, or running across it,
        against started more than CLEAR s from any (the load alone): the longest, the 99th
        percentile and how many took over 50 ms of each."""
        marks = sorted(marks)
        near: list[float] = []
        clear: list[float] = []
        for t, ms in self.calls:
            if not start <= t < end:
                continue
            i = bisect.bisect_right(marks, t + ms / 1e3)
            prev = marks[i - 1] if i else -1e18
            nxt = marks[i] if i < len(marks) else 1e18
            if t - AFTER <= prev:
                near.append(ms)
            elif t - prev > CLEAR and nxt - t > CLEAR:
                clear.append(ms)
        out: dict[str, Any] = {}
        for key, xs in (("after_checkpoint", near), ("clear_of_checkpoints", clear)):
            xs.sort()
            out[f"produce_{key}"] = {"calls": len(xs), "max_ms": round(xs[-1], 1) if xs else None,
                                     "p99_ms": round(xs[len(xs) * 99 // 100], 1) if xs else None,
                                     "over_50ms": sum(1 for x in xs if x > 50)}
        return out

    def near(self, spans: list[tuple[float, float]], within: float = 0.5) -> float:
        """The longest call started within `within` s of any (start, end) span."""
        return max((ms for t, ms in self.calls
                    if any(a - within <= t <= b + within for a, b in spans)), default=0.0)

    def overlapping(self, spans: list[tuple[float, float]], over_ms: float) -> int:
        """How many calls over `over_ms` ran during any of the (start, end) spans."""
        return sum(1 for t, ms in self.calls if ms > over_ms
                   and any(t <= b and t + ms / 1e3 >= a for a, b in spans))

    def close(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(60)
        if self.proc is not None:
            if self.proc.stdin:
                self.proc.stdin.close()
            try:
                self.proc.wait(90)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.calls                  # noqa: B018 - the last lines
            os.unlink(self._path)
            self._path = ""


def phase(name: str, watch: Watch, prod: Producer, fn, *args) -> dict[str, Any]:
    term, leader, start = watch.term(), watch.leader(), time.monotonic()
    extra = fn(*args) or {}
    end = time.monotonic()
    with watch.lock:
        ckpts = [c for c in watch.checkpoints if start <= c["t"] < end]
        leads = [n for t, n in watch.leaders if start <= t < end]
        gcs = [x for x in watch.long_gcs if start <= x[0] < end]
        snaps = [x for x in watch.snapshots if start <= x[0] < end]
    # a checkpoint is seen when it has ended: it began `seconds` (+ a poll) before
    begun = [c["t"] - (c["seconds"] or 0) - 0.1 for c in ckpts]
    out = {"phase": name, "seconds": round(end - start, 2), "term_before": term,
           "term_after": watch.term(), "leader_before": leader, "leader_after": watch.leader(),
           "leader_changes": leads, "checkpoints": len(ckpts),
           "checkpoint_seconds_max": max((c["seconds"] or 0 for c in ckpts), default=None),
           "checkpoint_bytes": max((c["bytes"] for c in ckpts), default=None),
           "produce_max_ms": round(prod.longest(start, end), 1),
           "produce_max_near_checkpoint_ms": round(prod.near(
               [(b, c["t"]) for b, c in zip(begun, ckpts)]), 1),
           "produce_calls": sum(1 for t, _ in prod.calls if start <= t < end),
           **prod.spread(start, end), "start": start, "end": end,
           **prod.after(start, end, begun),
           # the collector stops every thread of its replica: which slow calls it explains
           "gc_over_50ms": sum(x[3] for x in gcs), "gc_over_100ms": sum(x[4] for x in gcs),
           "produce_over_50ms_during_long_gc": prod.overlapping(
               [(t - 0.2, t) for t, *_ in gcs], 50),
           # a Raft snapshot file written (pysyncobj's log compaction): seen once installed,
           # written in the seconds before
           "snapshots": len(snaps), "produce_over_50ms_near_snapshot": prod.overlapping(
               [(t - 2.0, t + 0.2) for t, *_ in snaps], 50),
           # what the host took: steal (all CPUs), the sampler's gaps, and the slow calls
           # during which it took over 20 ms or the sampler did not run
           "host_steal_ms": round(watch.host.steal_ms(start, end)),
           "host_iowait_ms": round(watch.host.iowait_ms(start, end)),
           "host_gaps": len(watch.host.gaps(start, end)),
           "produce_over_50ms_host": sum(1 for t, ms in prod.calls if start <= t < end
                                         and ms > 50 and watch.host.explains(t, ms))}
    out.update(extra)
    print(f"  {name}: {json.dumps({k: v for k, v in out.items() if k not in ('start', 'end', 'marks')})}",
          flush=True)
    return out


def create(cl: LocalCluster, n: int) -> dict[str, Any]:
    made = [0]
    lock = threading.Lock()
    tenths: list[float] = []
    errors: list[str] = []
    start = time.monotonic()
    deadline = start + PHASE_LIMIT

    def worker(k: int) -> None:
        with Client(cl.addresses, retry_timeout=60) as c:
            for i in range(k, n, THREADS):
                if time.monotonic() > deadline:
                    return
                try:
                    c.counter(f"s{i:07d}")
                except Exception as e:
                    errors.append(repr(e))
                    return
                with lock:
                    made[0] += 1
                    if made[0] % max(1, n // 10) == 0:
                        tenths.append(time.monotonic())

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise SystemExit(f"creating objects failed: {errors[:3]}")
    marks = [start] + tenths
    rates = [round(max(1, n // 10) / (b - a)) for a, b in zip(marks, marks[1:])]
    rss = {m.node_id: round(rss_mib(m), 1) for m in cl.members}
    return {"objects": made[0], "rate_per_tenth": rates,
            "rate": round(made[0] / (time.monotonic() - start)), "rss_mib": rss}


def until_checkpoints(watch: Watch, count: int, limit: float) -> dict[str, Any]:
    """Produce (the phase's loop) until `count` checkpoints taken after this phase began have
    been seen on some replica: distinct indexes, not scrapes (a checkpoint is seen once per
    replica, and the one the last phase took may be seen late)."""
    with watch.lock:
        start = max((c["index"] for c in watch.checkpoints), default=0)
        start = max([start] + [int(v.get("gesmas_checkpoint_index", 0))
                               for v in watch.last.values()])
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        with watch.lock:
            if len({c["index"] for c in watch.checkpoints if c["index"] > start}) >= count:
                break
        time.sleep(0.2)
    return {}


WAITERS_PER_PROCESS = 20_000     # each holder process: a client's waiting calls cost it too


def hold_waiters_child(addresses: str, n: int) -> None:
    """`--hold-waiters N` (a child process): N consume calls waiting on one queue through
    asyncio clients; prints its RSS growth per waiting call once all are sent, holds them
    until its stdin closes, then cancels them and closes its sessions."""
    async def main() -> None:
        loop = asyncio.get_running_loop()
        stop = loop.create_future()
        threading.Thread(target=lambda: (sys.stdin.read(), loop.call_soon_threadsafe(
            lambda: stop.done() or stop.set_result(None))), daemon=True).start()
        before = _own_rss()
        clients = [AioClient(addresses, session_ttl=600) for _ in range(max(1, n // 10000))]
        for c in clients:
            await c.__aenter__()
        try:
            tasks = [asyncio.create_task(clients[i % len(clients)].queue("scale-waiters")
                                         .consume(timeout=3600)) for i in range(n)]
            await asyncio.sleep(min(5.0, 0.5 + n / 4000))   # sent (one stream per client)
            print(json.dumps({"client_rss_bytes_per_call": round(
                (_own_rss() - before) / max(1, n))}), flush=True)
            await stop
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            for c in clients:
                await c.__aexit__(None, None, None)
    asyncio.run(main())


def _own_rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class Holders:
    """The waiting calls, held by child processes of at most WAITERS_PER_PROCESS each (one
    process holding 10^5 calls saturated its own CPU: its clients' keep-alives starved)."""

    def __init__(self, cl: LocalCluster, n: int) -> None:
        self.procs = []
        left = n
        while left > 0:
            k = min(left, WAITERS_PER_PROCESS)
            self.procs.append(subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--hold-waiters", str(k),
                 "--cluster", cl.addresses], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                text=True))
            left -= k

    def client_rss_per_call(self) -> list[int]:
        out = []
        for p in self.procs:
            line = p.stdout.readline() if p.stdout else ""
            if line:
                out.append(json.loads(line)["client_rss_bytes_per_call"])
        return out

    def stop(self) -> None:
        for p in self.procs:
            if p.stdin:
                p.stdin.close()
        for p in self.procs:
            try:
                p.wait(120)
            except subprocess.TimeoutExpired:
                p.kill()


def waiters(cl: LocalCluster, watch: Watch, n: int, holder: dict[str, Any]) -> dict[str, Any]:
    before = {m.node_id: rss_mib(m) for m in cl.members}
    holders = holder["holders"] = Holders(cl, n)
    client_rss = holders.client_rss_per_call()
    deadline = time.monotonic() + PHASE_LIMIT
    with Client(cl.addresses) as c:
        while (got := c.status()["waiter_count"]) < n:
            if time.monotonic() > deadline or any(p.poll() is not None for p in holders.procs):
                raise SystemExit(f"the waiters did not all wait: {got} of {n}")
            time.sleep(0.2)
    after = {m.node_id: rss_mib(m) for m in cl.members}
    per = {k: round((after[k] - before[k]) * 1024 * 1024 / n) for k in after}
    until_checkpoints(watch, 1, 120)
    return {"waiters": n, "rss_bytes_per_waiter": per,
            "client_rss_bytes_per_waiting_call": client_rss}


def caught_up(cl: LocalCluster, m: Member, limit: float) -> float:
    """Seconds until `m` applied what the leader had committed when this began."""
    start = time.monotonic()
    leader = next(x for x in cl.members if x is not m and cl.alive(x)
                  and scrape(x.metrics_addr).get("gesmas_raft_is_leader"))
    target = scrape(leader.metrics_addr).get("gesmas_raft_commit_index", 0)
    while time.monotonic() - start < limit:
        if scrape(m.metrics_addr).get("gesmas_raft_applied_index", -1) >= target:
            return round(time.monotonic() - start, 2)
        time.sleep(0.05)
    return float("nan")


def restart(cl: LocalCluster, watch: Watch, wipe: bool) -> dict[str, Any]:
    m = next(x for x in cl.members if x.node_id != watch.leader())
    if wipe:
        cl.kill(m, signal.SIGTERM)
        shutil.rmtree(m.data_dir)
    else:
        cl.kill(m, signal.SIGKILL)
    stopped = time.monotonic()
    cl.start_member(m)
    started = time.monotonic()
    return {"node": m.node_id, "caught_up_seconds": caught_up(cl, m, 600),
            "marks": {"stopped": stopped, "started": started, "caught_up": time.monotonic()}}


def listing(cl: LocalCluster) -> dict[str, Any]:
    with Client(cl.addresses) as c:
        times = []
        for _ in range(5):
            t0 = time.monotonic()
            got = c.list_objects()
            times.append((time.monotonic() - t0) * 1e3)
    return {"list_ms": [round(x, 1) for x in times], "listed": len(got)}


def one_run(a: argparse.Namespace) -> dict[str, Any]:
    env = {"GESMAS_CHECKPOINT_EVERY": str(a.checkpoint_every),
           **dict(kv.split("=", 1) for kv in a.server_env)}
    holder: dict[str, Any] = {}
    with LocalCluster(metrics=True, env=env, fsync=not a.unsafe_no_fsync) as cl:
        watch = Watch(cl)
        deadline = time.monotonic() + 60
        while watch.leader() is None and time.monotonic() < deadline:   # the first election
            time.sleep(0.1)
        prod = Producer(cl, in_process=a.producer_in_process)
        try:
            out = {"objects": a.objects, "waiters": a.waiters,
                   "checkpoint_every": a.checkpoint_every, "phases": []}
            rss0 = {m.node_id: rss_mib(m) for m in cl.members}
            p = phase("create", watch, prod, create, cl, a.objects)
            p["rss_bytes_per_object"] = {
                k: round((p["rss_mib"][k] - rss0[k]) * 1024 * 1024 / a.objects)
                for k in p["rss_mib"]}
            out["phases"].append(p)
            out["phases"].append(phase("idle", watch, prod, until_checkpoints, watch,
                                       1 if a.quick else 2, 300))
            if a.waiters and not a.create_only:
                out["phases"].append(phase("waiters", watch, prod, waiters, cl, watch,
                                           a.waiters, holder))
            if not a.create_only:
                out["phases"].append(phase("restart", watch, prod, restart, cl, watch, False))
                out["phases"].append(phase("wipe", watch, prod, restart, cl, watch, True))
                out["phases"].append(phase("list", watch, prod, listing, cl))
            out["produce_errors"] = prod.errors[:5]
            out["produce_sessions_lost"] = prod.sessions_lost
            with watch.lock:
                out["checkpoint_seconds"] = [c["seconds"] for c in watch.checkpoints]
                out["elections"] = len({t for _, _, t in watch.terms}) - 1
                if a.timeline:
                    out["timeline"] = timeline(out, prod, watch)
            return out
        finally:
            if holder:
                holder["holders"].stop()
            prod.close()
            watch.close()


def timeline(out: dict[str, Any], prod: Producer, watch: Watch) -> dict[str, Any]:
    """Everything timed in a run, in seconds from its first phase (--timeline): to find what
    a long call coincided with (a checkpoint, a kill, a restart, catch-up)."""
    t0 = out["phases"][0]["start"]

    def rel(t: float) -> float:
        return round(t - t0, 3)
    return {"phases": [{"phase": p["phase"], "start": rel(p["start"]), "end": rel(p["end"]),
                        **{k: rel(v) for k, v in p.get("marks", {}).items()}}
                       for p in out["phases"]],
            "produce": [(rel(t), round(ms, 1)) for t, ms in prod.calls],
            "checkpoints": [dict(c, t=rel(c["t"])) for c in watch.checkpoints],
            "terms": [(rel(t), node, term) for t, node, term in watch.terms],
            "leaders": [(rel(t), node) for t, node in watch.leaders],
            "long_gcs": [(rel(t), *rest) for t, *rest in watch.long_gcs],
            "snapshots": [(rel(t), *rest) for t, *rest in watch.snapshots],
            "host_gaps": [(rel(a), rel(b)) for a, b in watch.host.gaps(t0, float("inf"))],
            # every call over 50 ms with the steal and I/O wait counted during it, and what
            # the disk did meanwhile
            "slow_produce_host": [(rel(t), round(ms, 1), round(watch.host.steal_ms(
                t, t + ms / 1e3)), round(watch.host.iowait_ms(t, t + ms / 1e3)),
                watch.host.disk_between(t, t + ms / 1e3))
                for t, ms in prod.calls if ms > 50]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--objects", type=int, default=100_000)
    ap.add_argument("--waiters", type=int, default=0)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--checkpoint-every", type=int, default=20_000,
                    help="entries between checkpoints (the server's default is 20,000)")
    ap.add_argument("--unsafe-no-fsync", action="store_true")
    ap.add_argument("--quick", action="store_true",
                    help="1,000 objects, 50 waiters, one checkpoint in the idle phase")
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--timeline", action="store_true",
                    help="with --json: every produce call, checkpoint, term and phase mark in "
                         "time, per run")
    ap.add_argument("--server-env", action="append", default=[], metavar="NAME=VALUE",
                    help="an environment variable of the servers (repeatable)")
    ap.add_argument("--phase-limit", type=float, default=PHASE_LIMIT,
                    help="seconds any phase may take (default %(default)s)")
    ap.add_argument("--create-only", action="store_true",
                    help="only the create and idle phases (to compare checkpoint pauses)")
    ap.add_argument("--producer-in-process", action="store_true",
                    help="run the produce loop on a thread of this process, as before "
                         "(its calls then wait for this process's GIL too), to compare")
    ap.add_argument("--hold-waiters", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--produce-loop", metavar="FILE", help=argparse.SUPPRESS)
    ap.add_argument("--cluster", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.hold_waiters:
        hold_waiters_child(a.cluster, a.hold_waiters)
        return 0
    if a.produce_loop:
        produce_child(a.cluster, a.produce_loop)
        return 0
    globals()["PHASE_LIMIT"] = a.phase_limit
    if a.quick:
        a.objects, a.waiters, a.checkpoint_every = 1000, 50, 100
    if a.objects < 10:
        ap.error("--objects must be at least 10")
    runs = []
    for r in range(a.runs):
        print(f"run {r + 1}/{a.runs}: {a.objects} objects, {a.waiters} waiters, "
              f"checkpoint every {a.checkpoint_every} entries", flush=True)
        runs.append(one_run(a))
    summary(runs)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"argv": sys.argv[1:], "runs": runs, "load": os.getloadavg()}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

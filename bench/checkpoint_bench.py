#!/usr/bin/env python
"""How long a checkpoint stalls the calls of a replica: a produce loop runs while the leader
checkpoints a kernel with W blocked waiters (default 10^4).

    python bench/checkpoint_bench.py [--waiters 10000] [--seconds 12] [--runs 1]

A 3-replica LocalCluster (fsync on, metrics on) is started with checkpoint_every set so that
exactly one checkpoint falls inside the produce loop: W consume calls wait on one queue
(an asyncio client in a thread, so that W waits cost no threads), then one synchronous client
produces to another queue for --seconds, timing every call. A checkpoint writes the blocked
calls and pickles the state (DESIGN §5) on the apply thread of every replica, and nothing else
is applied there meanwhile: the produce calls in flight then wait.

Prints, per run: the checkpoint durations each replica recorded (gesmas_checkpoint_seconds),
produce latency p50 / p99 / max over the loop, and how many calls took over 50 ms. One
client produces one call at a time, so the checkpoint stalls one call (or two): the max is
the stall, a percentile would hide it. When the checkpoint happened is read from a follower's
gesmas_checkpoint_index, polled every 50 ms: the stall is the slowest call started within a
second of it, and the slowest call elsewhere in the loop is printed apart (a stall that is
not the checkpoint's). Bounded: the loop stops after --seconds, the cluster is stopped on
exit.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__))))

from gesmas.aio import Client as AioClient  # noqa: E402
from gesmas.client import Client  # noqa: E402
from gesmas.server.cluster import LocalCluster  # noqa: E402

from stats import pct  # noqa: E402


def scrape(addr: str) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://{addr}/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith(("gesmas_checkpoint_seconds_sum", "gesmas_checkpoint_seconds_count",
                            "gesmas_checkpoint_index", "gesmas_raft_is_leader",
                            'gesmas_gc_pause_seconds_sum{generation="2"}',
                            'gesmas_gc_pause_seconds_count{generation="2"}')):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def watch_checkpoints(addr: str, stop: threading.Event, seen: list[float]) -> None:
    """Append the monotonic time at which `addr`'s checkpoint index changes, every change."""
    last = scrape(addr).get("gesmas_checkpoint_index")
    while not stop.wait(0.05):
        now = scrape(addr).get("gesmas_checkpoint_index")
        if now != last:
            seen.append(time.monotonic())
            last = now


def hold_waiters(addresses: str, n: int, ready: threading.Event, stop: threading.Event,
                 errors: list[str]) -> None:
    async def main() -> None:
        async with AioClient(addresses, session_ttl=60) as c:
            q = c.queue("ckpt-waiters")
            tasks = [asyncio.create_task(q.consume(timeout=600)) for _ in range(n)]
            ready.set()
            while not stop.is_set():
                await asyncio.sleep(0.1)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    try:
        asyncio.run(main())
    except BaseException as e:          # reported by the main thread
        errors.append(repr(e))
        ready.set()


def one_run(waiters: int, seconds: float) -> dict[str, object]:
    # the waiters, the sessions and the standard classes come first; the checkpoint falls
    # ~2000 produce calls into the loop
    env = {"GESMAS_CHECKPOINT_EVERY": str(waiters + 2500)}
    with LocalCluster(metrics=True, env=env) as cl:
        ready, stop, errors = threading.Event(), threading.Event(), []
        holder = threading.Thread(target=hold_waiters,
                                  args=(cl.addresses, waiters, ready, stop, errors))
        holder.start()
        try:
            with Client(cl.addresses) as c:
                ready.wait(120)
                deadline = time.monotonic() + 120
                while c.status()["waiter_count"] < waiters:
                    if errors or time.monotonic() > deadline:
                        raise SystemExit(f"the waiters did not all wait: {errors}")
                    time.sleep(0.2)
                before = {m.node_id: scrape(m.metrics_addr) for m in cl.members}
                follower = next(m for m in cl.members
                                if not before[m.node_id].get("gesmas_raft_is_leader"))
                seen: list[float] = []
                watch_stop = threading.Event()
                watcher = threading.Thread(target=watch_checkpoints,
                                           args=(follower.metrics_addr, watch_stop, seen))
                watcher.start()
                q = c.queue("ckpt-produce")
                calls: list[tuple[float, float]] = []
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    t0 = time.monotonic()
                    q.produce(b"x" * 32)
                    calls.append((t0, (time.monotonic() - t0) * 1e3))
                watch_stop.set()
                watcher.join(10)
                after = {m.node_id: scrape(m.metrics_addr) for m in cl.members}
        finally:
            stop.set()
            holder.join(60)
    ckpts = {}
    for node, a in after.items():
        b = before[node]
        n = a.get("gesmas_checkpoint_seconds_count", 0) - b.get("gesmas_checkpoint_seconds_count", 0)
        s = a.get("gesmas_checkpoint_seconds_sum", 0) - b.get("gesmas_checkpoint_seconds_sum", 0)
        gc_n, gc_s = (a.get(f'gesmas_gc_pause_seconds_{x}{{generation="2"}}', 0) -
                      b.get(f'gesmas_gc_pause_seconds_{x}{{generation="2"}}', 0)
                      for x in ("count", "sum"))
        ckpts[node] = {"count": int(n), "seconds": round(s, 3),
                       "leader": bool(a.get("gesmas_raft_is_leader")),
                       "full_gc": int(gc_n), "full_gc_seconds": round(gc_s, 3)}
    lat = [ms for _, ms in calls]
    start = calls[0][0]
    near: list[float] = []
    elsewhere: list[float] = []
    for t, ms in calls:
        (near if any(abs(t - c) <= 1.0 for c in seen) else elsewhere).append(ms)
    return {
        "checkpoint_at_s": [round(c - start, 2) for c in seen],
        "checkpoint_stall_ms": round(max(near), 1) if near else None,
        "max_elsewhere_ms": round(max(elsewhere), 1) if elsewhere else None,
        "waiters": waiters, "calls": len(calls), "checkpoints": ckpts,
        "p50_ms": round(pct(lat, 50), 2), "p99_ms": round(pct(lat, 99), 2),
        "max_ms": round(max(lat), 1),
        "over_50ms": sum(1 for ms in lat if ms > 50),
        # when the slow calls started (seconds into the loop) and how long each took
        "slow": [(round(t - calls[0][0], 2), round(ms)) for t, ms in calls if ms > 50],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--waiters", type=int, default=10_000)
    ap.add_argument("--seconds", type=float, default=12.0)
    ap.add_argument("--runs", type=int, default=1)
    args = ap.parse_args()
    for i in range(args.runs):
        r = one_run(args.waiters, args.seconds)
        ck = ", ".join(f"node{n}{' (leader)' if v['leader'] else ''}: {v['count']} in "
                       f"{v['seconds']} s" for n, v in sorted(r["checkpoints"].items()))
        print(f"run {i + 1}: {r['waiters']} waiters; checkpoints {ck}")
        print("  full garbage collections during the loop: " + ", ".join(
            f"node{n}: {v['full_gc']} taking {v['full_gc_seconds']} s"
            for n, v in sorted(r["checkpoints"].items())))
        print(f"  produce: {r['calls']} calls, p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms, "
              f"max {r['max_ms']} ms; {r['over_50ms']} calls over 50 ms")
        print(f"  checkpoint at {r['checkpoint_at_s']} s into the loop (a follower applied it): "
              f"slowest call within 1 s of it (the stall) {r['checkpoint_stall_ms']} ms; "
              f"slowest call elsewhere {r['max_elsewhere_ms']} ms")
        if r["slow"]:
            print("  calls over 50 ms (s into the loop: ms): " +
                  ", ".join(f"{t}: {ms}" for t, ms in r["slow"]))
        print("  " + json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())

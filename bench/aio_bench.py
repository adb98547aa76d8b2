#!/usr/bin/env python
"""Many waiting calls in one asyncio process: N tasks block in `consume` on one queue, then
N produces release them; prints the time of each phase and the client process's memory.

    python bench/aio_bench.py                 # N = 10,000 on a fresh local 3-node cluster
    python bench/aio_bench.py --n 2000        # smaller

The consumers' client stays on one follower (route="replica") and the producers' on the
leader, so that neither replica holds more than N + a few calls (a replica serves at most
10,000 at once: gesmas.server.grpclimits). Each task is one awaited gRPC call, no thread.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


async def bench(addresses: list[str], leader: str, follower: str, n: int) -> dict:
    from gesmas.aio import Client
    out: dict = {"n": n, "rss_mb_start": round(rss_mb(), 1)}
    async with Client(follower, route="replica", retry_timeout=120) as consumers, \
            Client(leader, retry_timeout=120) as producers:
        q = consumers.queue("aio-bench")
        await q.size()
        t0 = time.perf_counter()
        tasks = [asyncio.create_task(q.consume(timeout=600)) for _ in range(n)]
        while (await producers.status())["waiter_count"] < n:
            await asyncio.sleep(0.1)
        out["block_s"] = round(time.perf_counter() - t0, 2)
        out["rss_mb_blocked"] = round(rss_mb(), 1)
        out["threads"] = len(os.listdir("/proc/self/task"))
        out["connections_to_follower"] = len(consumers._connections.get(follower, []))
        t1 = time.perf_counter()
        pq = producers.queue("aio-bench")
        sem = asyncio.Semaphore(256)          # produces in flight at once

        async def produce(i: int) -> None:
            async with sem:
                await pq.produce(i)
        await asyncio.gather(*(produce(i) for i in range(n)))
        got = await asyncio.gather(*tasks)
        out["release_s"] = round(time.perf_counter() - t1, 2)
        out["lost"] = n - len(set(got))
        out["wrong"] = len(set(got) - set(range(n)))
        out["rss_mb_end"] = round(rss_mb(), 1)
        out["max_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=10_000)
    a = ap.parse_args()
    sys.path.insert(0, ROOT)
    from gesmas.server.cluster import LocalCluster
    with LocalCluster() as cl:
        leader = cl.find_leader()
        follower = next(m for m in cl.members if m is not leader)
        out = asyncio.run(bench(cl.addresses.split(","), leader.client_addr,
                                follower.client_addr, a.n))
    for k, v in out.items():
        print(f"{k:26} {v}")
    return 0 if out["lost"] == 0 and out["wrong"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

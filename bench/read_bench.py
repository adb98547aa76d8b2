#!/usr/bin/env python
"""Read benchmark: Status, ListObjects and Counter.get (a declared reader, kernel/readers.py)
without a log entry (linearizable, sequential) against
the same reads through the Raft log (the gesmas of a baseline commit), on 3-replica clusters
on 127.0.0.1, fsync on.

    python bench/read_bench.py                        # this checkout, and e09b0c3 through the log
    python bench/read_bench.py --baseline e09b0c3     # the old path: that commit's servers
    python bench/read_bench.py --baseline none        # this checkout only
    python bench/read_bench.py --quick                # tiny sizes (a smoke test)

What it does
1. Starts a LocalCluster of this checkout; makes 10 objects; then, for Status, ListObjects
   and Counter.get and each consistency: 1 client on the leader (--ops reads one after another:
   p50 / p99 ms, reads/s), then 16 clients spread over the three replicas for --seconds
   (reads/s, p50). Also the p50 of a write (Counter.add) alone, and under a sequential read
   load of 8 clients (does reading slow writing?). Stops the cluster.
2. With --baseline REV: extracts that commit (git archive) into a temporary folder and runs
   the same against a cluster of its servers (PYTHONPATH pointing there): every read there is
   a log entry. Clusters run one after the other, never together.
Clients are threads of this process, each with its own gRPC channel (raw stubs: no session
for reads; the client library for the writes). Prints a markdown table and one JSON line.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import grpc

from gesmas.client import Client
from gesmas.server.cluster import LocalCluster
from gesmas.v1 import gesmas_pb2 as pb
from gesmas.v1 import gesmas_pb2_grpc as pb_grpc

from stats import pct  # bench/ is the script's directory, first on sys.path

ROOTS = ("server", "client", "protocol", "protos", "objects")
MODES = {"linearizable": pb.CONSISTENCY_LINEARIZABLE, "sequential": pb.CONSISTENCY_SEQUENTIAL}


RPCS = ("Status", "ListObjects", "Counter.get")


def request(rpc: str, consistency: int, stub: Any = None) -> tuple[Any, Any]:
    """(the stub's method to call, its request). Counter.get is an Invoke of a declared
    reader (a read since readers; a log entry on a baseline without them): it needs a
    session, opened here on the stub's channel."""
    opts = pb.ReadOptions(consistency=consistency)
    if rpc == "Counter.get":
        s = stub.OpenSession(pb.OpenSessionRequest(ttl=60), timeout=10)
        req = pb.InvokeRequest(session=s.session, session_secret=s.session_secret, seq=1,
                               class_name="Counter", object_name="bench-read-0",
                               method="get", read=opts)
        return stub.Invoke, req
    call = getattr(stub, rpc)
    return call, (pb.StatusRequest(read=opts) if rpc == "Status"
                  else pb.ListObjectsRequest(read=opts))


def one_client(address: str, rpc: str, consistency: int, ops: int) -> dict[str, float]:
    with grpc.insecure_channel(address) as ch:
        call, req = request(rpc, consistency, pb_grpc.GesmasStub(ch))
        for _ in range(min(50, ops)):                      # warm-up
            call(req, timeout=10)
        lat = []
        started = time.perf_counter()
        for _ in range(ops):
            t = time.perf_counter()
            call(req, timeout=10)
            lat.append(time.perf_counter() - t)
        elapsed = time.perf_counter() - started
    return {"p50_ms": pct(lat, 50) * 1e3, "p99_ms": pct(lat, 99) * 1e3, "per_s": ops / elapsed}


def many_clients(addresses: list[str], rpc: str, consistency: int, clients: int,
                 seconds: float) -> dict[str, float]:
    lat: list[list[float]] = [[] for _ in range(clients)]
    errors = [0] * clients
    go = threading.Event()
    stop_at = [0.0]

    def run(i: int) -> None:
        with grpc.insecure_channel(addresses[i % len(addresses)]) as ch:
            call, req = request(rpc, consistency, pb_grpc.GesmasStub(ch))
            call(req, timeout=10)
            go.wait(30)
            while time.perf_counter() < stop_at[0]:
                t = time.perf_counter()
                try:
                    call(req, timeout=10)
                except grpc.RpcError:
                    errors[i] += 1
                    continue
                lat[i].append(time.perf_counter() - t)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    time.sleep(0.5)                                        # channels connected, warm
    started = time.perf_counter()
    stop_at[0] = started + seconds
    go.set()
    for t in threads:
        t.join(seconds + 60)
    elapsed = time.perf_counter() - started
    flat = [x for xs in lat for x in xs]
    return {"per_s": len(flat) / elapsed, "p50_ms": pct(flat, 50) * 1e3,
            "errors": float(sum(errors))}


def writes(addresses: str, ops: int) -> list[float]:
    with Client(addresses, session_ttl=60) as c:
        ctr = c.counter("bench-writes")
        for _ in range(min(20, ops)):
            ctr.add(1)
        lat = []
        for _ in range(ops):
            t = time.perf_counter()
            ctr.add(1)
            lat.append(time.perf_counter() - t)
    return lat


def measure(cluster: LocalCluster, label: str, modes: dict[str, int], args: Any) -> list[dict]:
    leader = cluster.find_leader()
    with Client(cluster.addresses) as c:
        for i in range(10):
            c.object("Counter", f"bench-read-{i}")
    addresses = [leader.client_addr] + [m.client_addr for m in cluster.members
                                        if m is not leader]
    rows = []
    for rpc in RPCS:
        for mode, consistency in modes.items():
            one = one_client(leader.client_addr, rpc, consistency, args.ops)
            many = many_clients(addresses, rpc, consistency, 16, args.seconds)
            rows.append({"server": label, "rpc": rpc, "mode": mode,
                         "p50_ms_1": one["p50_ms"], "p99_ms_1": one["p99_ms"],
                         "per_s_1": one["per_s"], "per_s_16": many["per_s"],
                         "p50_ms_16": many["p50_ms"], "errors_16": many["errors"]})
            print(f"  {label} {rpc} {mode}: 1 client p50 {one['p50_ms']:.2f} ms "
                  f"{one['per_s']:.0f}/s; 16 clients {many['per_s']:.0f}/s", flush=True)
    alone = writes(leader.client_addr, args.write_ops)
    rows.append({"server": label, "rpc": "Counter.add", "mode": "write alone",
                 "p50_ms_1": pct(alone, 50) * 1e3, "p99_ms_1": pct(alone, 99) * 1e3,
                 "per_s_1": len(alone) / sum(alone)})
    if "sequential" in modes:
        done = threading.Event()
        loaded: list[float] = []

        def load_writes() -> None:
            loaded.extend(writes(leader.client_addr, args.write_ops))
            done.set()
        t = threading.Thread(target=load_writes)
        t.start()
        readers = threading.Thread(target=lambda: many_clients(
            addresses, "ListObjects", modes["sequential"], 8, args.write_ops * 0.004 + 2))
        readers.start()
        t.join(300)
        readers.join(300)
        rows.append({"server": label, "rpc": "Counter.add",
                     "mode": "write, 8 sequential readers",
                     "p50_ms_1": pct(loaded, 50) * 1e3, "p99_ms_1": pct(loaded, 99) * 1e3,
                     "per_s_1": len(loaded) / sum(loaded)})
    return rows


def baseline_src(rev: str) -> str:
    out = tempfile.mkdtemp(prefix="gesmas-baseline-")
    top = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True,
                         text=True, check=True).stdout.strip()
    archive = subprocess.run(["git", "-C", top, "archive", rev], capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", out], input=archive, check=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", default="e09b0c3",
                    help="commit whose servers read through the log ('none': skip)")
    ap.add_argument("--ops", type=int, default=2000, help="reads of the 1-client runs")
    ap.add_argument("--seconds", type=float, default=4.0, help="length of the 16-client runs")
    ap.add_argument("--write-ops", type=int, default=500)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.ops, args.seconds, args.write_ops = 50, 0.5, 20
    rows: list[dict] = []
    runs = [("this checkout", None, MODES)]
    if args.baseline != "none":
        runs.append((f"{args.baseline} (through the log)", baseline_src(args.baseline),
                     {"log": pb.CONSISTENCY_LINEARIZABLE}))
    for label, src, modes in runs:
        env = {}
        if src is not None:
            env["PYTHONPATH"] = os.pathsep.join(os.path.join(src, r) for r in ROOTS)
        cluster = LocalCluster(nodes=3, fsync=True, env=env)
        try:
            cluster.start(timeout=120)
            print(f"{label}: cluster up", flush=True)
            rows += measure(cluster, label, modes, args)
        finally:
            cluster.stop()
    print()
    print("| server | what | mode | p50 ms (1 client) | p99 ms | ops/s (1 client) | "
          "reads/s (16 clients, 3 replicas) | p50 ms (16) |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        many = f"{r['per_s_16']:.0f}" if "per_s_16" in r else ""
        p50_16 = f"{r['p50_ms_16']:.2f}" if "p50_ms_16" in r else ""
        print(f"| {r['server']} | {r['rpc']} | {r['mode']} | {r['p50_ms_1']:.2f} | "
              f"{r['p99_ms_1']:.2f} | {r['per_s_1']:.0f} | {many} | {p50_16} |")
    print()
    print(json.dumps({"machine": {"cores": os.cpu_count(), "python": platform.python_version(),
                                  "load": os.getloadavg()}, "rows": rows}))


if __name__ == "__main__":
    sys.exit(main())

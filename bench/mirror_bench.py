#!/usr/bin/env python
"""A Map's mirror against reads through the cluster, with etcd's serializable Range beside
(issue 27: reads of configuration).

    python bench/mirror_bench.py                # gesmas only
    python bench/mirror_bench.py --etcd         # and a 3-member etcd (installs etcd-server)
    python bench/mirror_bench.py --quick        # tiny sizes (a smoke test)

What it does, on 3-replica clusters on 127.0.0.1 (fsync on), one system after the other:
1. gesmas (a LocalCluster): a writer client puts --keys entries under "cfg/" (100-byte
   values). A reader client on a follower (route="replica", sequential reads) then, for
   --rounds rounds: --ops `Map.get` one after the other, and --ops `mirror.get` of a
   mirror of "cfg/" loaded by the same client (p50 / p99 of each round); its load time.
   16 threads reading the mirror for --seconds (reads/s; the GIL's share of one process).
   The lag: the writer puts one key every --gap ms, --puts times; the mirror's listener
   notes when each change arrives: ms from the put's start and from its return.
2. With --etcd: the same with bench/etcd_cluster.py's client on a follower: serializable
   Range one after the other, and a Watch stream of the key the writer puts (from the
   put's start and return to the event).
Prints the figures and one JSON line (--json FILE also writes it). Reads of a mirror are
local by design: the comparison says what a configuration read costs each way, not that
the two reads are the same operation (a mirror's is a few ms stale, as a follower's).
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from typing import Any, Callable

from gesmas.client import Client
from gesmas.server.cluster import LocalCluster

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from stats import pct  # noqa: E402


def timed(fn: Callable[[], Any], n: int) -> dict[str, float]:
    lat = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        lat.append((time.perf_counter() - t) * 1000)
    return {"p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99)}


def rate(fn: Callable[[], Any], threads: int, seconds: float) -> float:
    counts = [0] * threads
    stop = threading.Event()

    def run(i: int) -> None:
        n = 0
        while not stop.is_set():
            for _ in range(100):
                fn()
            n += 100
        counts[i] = n
    ts = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    start = time.perf_counter()
    for t in ts:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in ts:
        t.join(60)
    return sum(counts) / (time.perf_counter() - start)


def lag(put: Callable[[int], Any], arrived: dict[int, float], cond: threading.Condition,
        puts: int, gap: float) -> dict[str, float]:
    """``put(i)`` returns the change's revision; ``arrived[rev]`` is set by the watcher."""
    from_start, from_return = [], []
    for i in range(puts):
        t0 = time.perf_counter()
        rev = put(i)
        t1 = time.perf_counter()
        with cond:
            if not cond.wait_for(lambda: rev in arrived, 30):
                raise RuntimeError(f"the change at revision {rev} did not arrive in 30 s")
            t2 = arrived[rev]
        from_start.append((t2 - t0) * 1000)
        from_return.append((t2 - t1) * 1000)
        time.sleep(gap)
    return {"from_put_start_p50_ms": pct(from_start, 50),
            "from_put_start_p99_ms": pct(from_start, 99),
            "from_put_return_p50_ms": pct(from_return, 50),
            "from_put_return_p99_ms": pct(from_return, 99)}


def run_gesmas(a: argparse.Namespace) -> dict[str, Any]:
    cluster = LocalCluster(nodes=3, fsync=True)
    out: dict[str, Any] = {"rounds": []}
    try:
        cluster.start(timeout=90)
        leader = cluster.find_leader()
        follower = next(m for m in cluster.members if m is not leader)
        with Client(cluster.addresses) as w, \
                Client(follower.client_addr, route="replica", consistency="sequential") as r:
            wm = w.map("bench-config")
            for i in range(a.keys):
                wm.put(f"cfg/{i}", "v" * 100)
            m = r.map("bench-config")
            t = time.perf_counter()
            mirror = m.mirror("cfg/")
            out["load_ms"] = (time.perf_counter() - t) * 1000
            key = f"cfg/{a.keys // 2}"
            for _ in range(a.rounds):
                out["rounds"].append({"get": timed(lambda: m.get(key), a.ops),
                                      "mirror": timed(lambda: mirror.get(key), a.ops)})
            out["mirror_reads_per_s_16_threads"] = rate(lambda: mirror.get(key), 16,
                                                        a.seconds)
            arrived: dict[int, float] = {}
            cond = threading.Condition()

            def note(ev: dict[str, Any]) -> None:
                with cond:
                    arrived[ev["revision"]] = time.perf_counter()
                    cond.notify_all()
            mirror.listen(note)
            out["lag"] = lag(lambda i: wm.put("cfg/0", i)["revision"], arrived, cond,
                             a.puts, a.gap / 1000)
            mirror.close()
    finally:
        cluster.stop()
    return out


def run_etcd(a: argparse.Namespace) -> dict[str, Any]:
    from etcd_cluster import EtcdCluster, EtcdKV
    cluster = EtcdCluster()
    out: dict[str, Any] = {"rounds": []}
    clients: list[Any] = []
    try:
        cluster.start(timeout=90)
        leader = cluster.leader()
        follower = next(h for h in cluster.hosts if h != leader)
        w, r = EtcdKV(leader), EtcdKV(follower)
        clients += [w, r]
        for i in range(a.keys):
            w.put(f"cfg/{i}".encode(), b"v" * 100)
        key = f"cfg/{a.keys // 2}".encode()
        for _ in range(a.rounds):
            out["rounds"].append({"get": timed(lambda: r.get(key, serializable=True), a.ops)})
        arrived: dict[int, float] = {}
        cond = threading.Condition()
        stream, close = r.watch(b"cfg/0", deadline=600)
        created = threading.Event()

        def watch() -> None:
            try:
                for resp in stream:
                    now = time.perf_counter()
                    created.set()            # the first response: the stream is created
                    with cond:
                        for ev in resp.events:
                            arrived[ev.kv.mod_revision] = now
                        cond.notify_all()
            except Exception:
                pass                     # the stream's end (close)
        t = threading.Thread(target=watch, daemon=True)
        t.start()
        if not created.wait(30):
            raise RuntimeError("etcd's watch stream was not created in 30 s")
        out["lag"] = lag(lambda i: w.put(b"cfg/0", str(i).encode()), arrived, cond,
                         a.puts, a.gap / 1000)
        close()
    finally:
        for c in clients:
            c.close()
        cluster.stop()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--keys", type=int, default=100)
    p.add_argument("--ops", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--puts", type=int, default=200)
    p.add_argument("--gap", type=float, default=20.0, help="ms between the lag's puts")
    p.add_argument("--etcd", action="store_true")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json")
    a = p.parse_args()
    if a.quick:
        a.keys, a.ops, a.rounds, a.seconds, a.puts, a.gap = 10, 50, 1, 0.3, 5, 5.0
    results: dict[str, Any] = {"gesmas": run_gesmas(a)}
    if a.etcd:
        results["etcd"] = run_etcd(a)
    g = results["gesmas"]
    print(f"gesmas: mirror of {a.keys} keys loaded in {g['load_ms']:.1f} ms")
    for i, rd in enumerate(g["rounds"]):
        e = results["etcd"]["rounds"][i]["get"] if a.etcd else None
        print(f"round {i + 1}: Map.get p50 {rd['get']['p50_ms']:.3f} p99 "
              f"{rd['get']['p99_ms']:.3f} ms; mirror.get p50 {rd['mirror']['p50_ms']:.4f} "
              f"p99 {rd['mirror']['p99_ms']:.4f} ms" +
              ("" if e is None else f"; etcd serializable Range p50 {e['p50_ms']:.3f} "
                                    f"p99 {e['p99_ms']:.3f} ms"))
    print(f"mirror.get, 16 threads: {g['mirror_reads_per_s_16_threads']:,.0f} reads/s")
    for name in results:
        lg = results[name]["lag"]
        print(f"{name}: a change reaches the {'mirror' if name == 'gesmas' else 'watch'} "
              f"{lg['from_put_start_p50_ms']:.2f} ms (p99 {lg['from_put_start_p99_ms']:.2f}) "
              f"after the put's start, {lg['from_put_return_p50_ms']:.2f} ms (p99 "
              f"{lg['from_put_return_p99_ms']:.2f}) after its return")
    line = json.dumps({"args": vars(a), "results": results}, sort_keys=True)
    print(line)
    if a.json:
        with open(a.json, "w") as f:
            f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

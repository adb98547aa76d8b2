"""What a client that vanishes with many waiting calls costs the others (issue 25).

A process holds --waiters blocked `Queue.consume` calls on a 3-replica cluster, then is
killed (SIGKILL): its call streams break, and every wait must be withdrawn (else a later
item would go to the dead consumer). Meanwhile another client with a short session TTL
runs a `Counter.add` every 50 ms, and a raw keep-alive goes to the leader every 100 ms.
Printed: how long until the last wait was withdrawn, the log entries that took, the longest
keep-alive and add while it lasted, and whether the other client's session survived.

    python bench/cancel_bench.py --waiters 20000 --ttl 5
"""
from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import threading
import time

import grpc

from gesmas.client import Client, GesmasError
from gesmas.server.cluster import LocalCluster
from gesmas.v1 import gesmas_pb2 as pb
from gesmas.v1 import gesmas_pb2_grpc as pb_grpc


def hold(addresses: str, n: int) -> None:
    """The victim: n threads, each blocked in a consume of the queue "mc"."""
    c = Client(addresses)
    q = c.queue("mc")

    def one() -> None:
        try:
            q.consume()
        except GesmasError:
            pass
    for _ in range(n):
        threading.Thread(target=one, daemon=True).start()
    print("ready", flush=True)
    time.sleep(3600)


def run(n: int, ttl: float, limit: float) -> bool:
    with LocalCluster(nodes=3, fsync=True) as cl:
        c = Client(cl.addresses, session_ttl=ttl)
        c.queue("mc").size()
        holder = subprocess.Popen([sys.executable, __file__, "--hold", cl.addresses, str(n)],
                                  stdout=subprocess.PIPE, text=True)
        try:
            holder.stdout.readline()            # type: ignore[union-attr]
            t0 = time.monotonic()
            while c.status()["waiter_count"] < n:
                if time.monotonic() - t0 > limit:
                    raise SystemExit(f"the holder did not get {n} calls waiting in {limit} s")
                time.sleep(0.2)
            print(f"{n} calls waiting after {time.monotonic() - t0:.1f} s", flush=True)
            stop = threading.Event()
            adds: list[tuple[float, float]] = []
            alives: list[tuple[float, float, str]] = []
            lost: list[str] = []

            def add() -> None:
                counter = c.counter("probe")
                while not stop.is_set():
                    s = time.monotonic()
                    try:
                        counter.add(1)
                    except GesmasError as e:
                        lost.append(str(e))
                        return
                    adds.append((s, time.monotonic() - s))
                    stop.wait(0.05)

            def keep_alive() -> None:
                stub = pb_grpc.GesmasStub(grpc.insecure_channel(cl.find_leader().client_addr))
                s = stub.OpenSession(pb.OpenSessionRequest(ttl=30), timeout=10)
                while not stop.is_set():
                    s0 = time.monotonic()
                    try:
                        stub.KeepAlive(pb.KeepAliveRequest(
                            session=s.session, session_secret=s.session_secret), timeout=10)
                        err = ""
                    except grpc.RpcError as e:
                        err = str(e.code())
                    alives.append((s0, time.monotonic() - s0, err))
                    stop.wait(0.1)
            threads = [threading.Thread(target=add), threading.Thread(target=keep_alive)]
            for t in threads:
                t.start()
            time.sleep(1.0)
            commit = c.status()["commit_index"] if not lost else 0
            k0 = time.monotonic()
            os.kill(holder.pid, signal.SIGKILL)
            holder.wait()
            with Client(cl.addresses) as watcher:
                while watcher.status()["waiter_count"] > 0 and time.monotonic() - k0 < limit:
                    time.sleep(0.1)
                k1 = time.monotonic()
                left = watcher.status()["waiter_count"]
                entries = watcher.status()["commit_index"] - commit
            time.sleep(1.0)
            stop.set()
            for t in threads:
                t.join(30)
            during = [d for s, d in adds if k0 <= s <= k1]
            ka = [(d, e) for s, d, e in alives if k0 <= s <= k1]
            # a withdrawal quicker than a keep-alive period (or an add) sees none of them
            ka_max = f"{max(d for d, _ in ka) * 1e3:.0f} ms" if ka else "-"
            adds_at = (f"longest {max(during) * 1e3:.0f} ms, p50 "
                       f"{statistics.median(during) * 1e3:.0f} ms" if during else "none")
            print(f"withdrawn after {k1 - k0:.1f} s in {entries} log entries; "
                  f"keep-alives meanwhile: {len(ka)}, longest {ka_max}, "
                  f"{sum(1 for _, e in ka if e)} refused; adds: {len(during)}, {adds_at}; "
                  f"the other client's session (TTL {ttl:g} s): "
                  f"{'LOST: ' + lost[0] if lost else 'kept'}", flush=True)
            c.close()
            if left:
                print(f"FAILED: {left} waits still there after {limit:g} s", flush=True)
            return not left and not lost
        finally:
            if holder.poll() is None:
                holder.kill()
                holder.wait()


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--hold":
        hold(sys.argv[2], int(sys.argv[3]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--waiters", type=int, default=20_000)
    ap.add_argument("--ttl", type=float, default=5.0, help="the other client's session TTL")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--limit", type=float, default=300.0, help="seconds a phase may take")
    a = ap.parse_args()
    ok = [run(a.waiters, a.ttl, a.limit) for _ in range(a.runs)]
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())

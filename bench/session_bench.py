#!/usr/bin/env python
"""Sessions through a hung leader: a real 3-replica cluster whose leader is SIGSTOPped.

    python bench/session_bench.py                 # TTL 4 s, 20 idle sessions, hangs 0.5/1/2 x TTL
    python bench/session_bench.py --ttl 6 --sessions 40 --callers 8

For each hang length (0.5x, 1x and 2x the TTL) on the same cluster:

1. ``--sessions`` idle clients (fresh sessions of TTL ``--ttl``) are open when the leader is
   stopped; after SIGCONT and recovery each is asked: did it hear ``lost`` (client view), and
   does a call in its session still run (server view: ``SessionExpired`` means expired).
2. ``--callers`` idle callers each start one call (a counter add) the moment the leader is
   stopped: time from the hang to its answer, which the new leader serves.
3. ``--callers`` blocked callers wait in ``consume`` on an empty queue before the hang; a
   producer adds one item per caller from the moment of the hang: time from the hang to each
   consume's answer (the call noticed the hung replica, re-attached elsewhere with the same
   (session, seq), and the new leader served it).

Also the time to the new leader's election (a Status that commits, polled). Prints one line
per hang and the p50 / max of both call kinds over all hangs.

Then (``--fencing`` seconds, 0 to skip) the fencing run of issue 23, twice: ``--holders``
clients take one lock in turns and write while they hold it to a store that refuses a
fence older than the newest it saw; the holder that wrote last is cut off (its keep-alives
stop arriving, as a paused client's) every 1.5 TTL, holds last about a TTL, and the leader is SIGSTOPped for TTL seconds
once. Once the holders check ``fence.held`` before each write, once they do not. Counted:
writes made while the writer's hold was no longer sure (``fence.held`` False), stale writes
(refused by the store), and holds lost. The cluster is stopped on any
exit; a stopped leader is always continued.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from stats import pct  # noqa: E402

from gesmas.client import Client, GesmasError, SessionExpired  # noqa: E402
from gesmas.server.cluster import LocalCluster  # noqa: E402

BOUND = 120.0       # every wait is bounded


def one_hang(cluster: LocalCluster, ttl: float, hang: float, n_sessions: int, n_callers: int,
             tag: str) -> dict[str, Any]:
    idle = [Client(cluster.addresses, session_ttl=ttl) for _ in range(n_sessions)]
    lost = [threading.Event() for _ in idle]
    for c, ev in zip(idle, lost):
        if hasattr(c, "add_listener"):          # (a gesmas before issue 23 has none)
            c.add_listener(lambda s, ev=ev: ev.set() if s == "lost" else None)
    callers = [Client(cluster.addresses, session_ttl=max(ttl, 10.0)) for _ in range(n_callers)]
    blocked = [Client(cluster.addresses, session_ttl=max(ttl, 10.0)) for _ in range(n_callers)]
    producer = Client(cluster.addresses, session_ttl=max(ttl, 10.0))
    queue = f"sb-q-{tag}"
    for c in callers:
        c.counter(f"sb-c-{tag}")
    producer.queue(queue)
    idle_times: list[float] = []
    blocked_times: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    start = threading.Event()
    t0 = [0.0]

    def consume(c: Client) -> None:
        try:
            c.queue(queue).consume(timeout=BOUND)
            with lock:
                blocked_times.append(time.monotonic() - t0[0])
        except GesmasError as e:
            errors.append(f"consume: {e!r}")

    def call(c: Client) -> None:
        start.wait(BOUND)
        try:
            c.counter(f"sb-c-{tag}").add(1)
            with lock:
                idle_times.append(time.monotonic() - t0[0])
        except GesmasError as e:
            errors.append(f"add: {e!r}")

    def produce() -> None:
        start.wait(BOUND)
        for _ in blocked:
            try:
                producer.queue(queue).produce(1)
            except GesmasError as e:
                errors.append(f"produce: {e!r}")

    threads = [threading.Thread(target=consume, args=(c,), daemon=True) for c in blocked]
    for t in threads:
        t.start()
    deadline = time.monotonic() + BOUND
    while producer.queue(queue).invoke("size") != 0 or _waiters(producer, queue) < len(blocked):
        if time.monotonic() > deadline:
            raise TimeoutError("the consumers never all waited")
        time.sleep(0.05)
    more = [threading.Thread(target=call, args=(c,), daemon=True) for c in callers]
    more.append(threading.Thread(target=produce, daemon=True))
    for t in more:
        t.start()
    threads += more

    leader = cluster.find_leader()
    t0[0] = time.monotonic()
    os.kill(leader.proc.pid, signal.SIGSTOP)
    try:
        start.set()
        others = [m for m in cluster.members if m is not leader]
        cluster.find_leader(timeout=BOUND, among=others)
        elected = time.monotonic() - t0[0]
        time.sleep(max(0.0, hang - (time.monotonic() - t0[0])))       # the fault itself
    finally:
        os.kill(leader.proc.pid, signal.SIGCONT)
    for t in threads:
        t.join(BOUND)
    cluster.wait_caught_up(leader, timeout=BOUND)
    client_lost = sum(ev.is_set() or c.expired for ev, c in zip(lost, idle))
    server_expired = 0
    for c in idle:
        try:
            c.counter(f"sb-c-{tag}").add(1)
        except SessionExpired:
            server_expired += 1
        except GesmasError as e:
            errors.append(f"check: {e!r}")
    for c in [*idle, *callers, *blocked, producer]:
        c.close()
    return {"hang": hang, "elected": elected, "client_lost": client_lost,
            "server_expired": server_expired, "idle": idle_times, "blocked": blocked_times,
            "errors": errors}


def fencing(cluster: LocalCluster, ttl: float, seconds: float, n: int, honour: bool,
            tag: str) -> dict[str, int]:
    from gesmas.client import Timeout, Unavailable, core
    store_lock = threading.Lock()
    top = [0]
    counts = {"writes": 0, "unsure": 0, "stale": 0, "lost": 0}
    stop = threading.Event()
    name = f"sb-fence-{tag}"
    steps = max(1, int(ttl / 0.05))          # a hold lasts about a TTL
    writer = [-1]                             # who wrote last: the holder to cut off

    def holder(i: int) -> None:
        while not stop.is_set():
            c = Client(cluster.addresses, session_ttl=ttl)
            cut = threading.Event()
            real = c._attempt

            def attempt(address: str, method: str, *a: Any, **kw: Any) -> Any:
                if method == "KeepAlive" and cut.is_set():
                    raise core.Failure(Unavailable("cut off (bench)"))
                return real(address, method, *a, **kw)

            c._attempt = attempt  # type: ignore[method-assign]
            cuts[i] = cut
            lock = c.lock(name)
            try:
                while not stop.is_set():
                    try:
                        fence = lock.acquire(timeout=1.0)
                    except Timeout:
                        continue
                    try:
                        for _ in range(steps):
                            if stop.is_set() or (honour and not fence.held):
                                break
                            with store_lock:
                                writer[0] = i
                                counts["writes"] += 1
                                counts["unsure"] += not fence.held
                                if fence < top[0]:
                                    counts["stale"] += 1
                                else:
                                    top[0] = fence
                            stop.wait(0.05)
                    finally:
                        lock.release()
            except GesmasError:
                with store_lock:
                    counts["lost"] += 1
            finally:
                c.close()

    cuts: dict[int, threading.Event] = {}
    threads = [threading.Thread(target=holder, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    end = time.monotonic() + seconds
    leader_stopped = False
    while time.monotonic() < end:
        if writer[0] in cuts:
            cuts[writer[0]].set()             # the holder's keep-alives stop arriving
        if not leader_stopped and time.monotonic() > end - seconds / 2:
            leader = cluster.find_leader()
            os.kill(leader.proc.pid, signal.SIGSTOP)
            try:
                time.sleep(ttl)                # the fault itself
            finally:
                os.kill(leader.proc.pid, signal.SIGCONT)
            leader_stopped = True
            continue
        time.sleep(ttl * 1.5)                  # the next cut after this one had its effect
    stop.set()
    for t in threads:
        t.join(BOUND)
    return counts


def _waiters(c: Client, queue: str) -> int:
    for o in c.list_objects():
        if o["name"] == queue:
            return int(o["waiters"])
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ttl", type=float, default=4.0)
    ap.add_argument("--sessions", type=int, default=20)
    ap.add_argument("--callers", type=int, default=5)
    ap.add_argument("--hangs", default="0.5,1,2", help="hang lengths, in TTLs")
    ap.add_argument("--fencing", type=float, default=30.0, help="seconds per fencing run")
    ap.add_argument("--holders", type=int, default=4)
    args = ap.parse_args()
    factors = [float(x) for x in args.hangs.split(",")]
    print(f"# session_bench: TTL {args.ttl:g} s, {args.sessions} idle sessions, "
          f"{args.callers} idle + {args.callers} blocked callers per hang, "
          f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}")
    cluster = LocalCluster(nodes=3)
    all_idle: list[float] = []
    all_blocked: list[float] = []
    try:
        cluster.start(timeout=BOUND)
        print("| leader hang | elected after | sessions lost (client) | sessions expired "
              "(server) | idle call p50 / max | blocked call p50 / max | errors |")
        print("|---|---|---|---|---|---|---|")
        for i, f in enumerate(factors):
            r = one_hang(cluster, args.ttl, f * args.ttl, args.sessions, args.callers, str(i))
            all_idle += r["idle"]
            all_blocked += r["blocked"]
            print(f"| {f:g} x TTL = {r['hang']:.1f} s | {r['elected']:.2f} s | "
                  f"{r['client_lost']}/{args.sessions} | {r['server_expired']}/{args.sessions}"
                  f" | {pct(r['idle'], 50):.2f} / {max(r['idle'], default=float('nan')):.2f} s"
                  f" | {pct(r['blocked'], 50):.2f} / "
                  f"{max(r['blocked'], default=float('nan')):.2f} s | "
                  f"{'; '.join(r['errors'][:3]) or 0} |", flush=True)
        print(f"all hangs: idle calls (n={len(all_idle)}) p50 {pct(all_idle, 50):.2f} s, max "
              f"{max(all_idle, default=float('nan')):.2f} s; blocked calls "
              f"(n={len(all_blocked)}) p50 {pct(all_blocked, 50):.2f} s, max "
              f"{max(all_blocked, default=float('nan')):.2f} s (from the SIGSTOP)")
        if args.fencing > 0:
            print("| holders check fence.held | writes | writes without a sure hold | "
                  "stale writes (refused by the store) | holds lost |")
            print("|---|---|---|---|---|")
            for honour in (True, False):
                r = fencing(cluster, args.ttl, args.fencing, args.holders, honour,
                            "h" if honour else "n")
                print(f"| {'yes' if honour else 'no'} | {r['writes']} | {r['unsure']} | "
                      f"{r['stale']} | {r['lost']} |", flush=True)
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()

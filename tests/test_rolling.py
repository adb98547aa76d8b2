"""Rolling restart (issue "Operate it"): the three replicas restarted one at a time (SIGTERM,
start again on the same data dir, wait until it has caught up) under produce/consume load:
nothing lost, nothing twice, no call failing (the clients retry), and the longest pause a
client saw is printed (run with -s to see the figures)."""
from __future__ import annotations

import signal
import threading
import time

from gesmas.client import Client, GesmasError, Timeout
from gesmas.server.cluster import LocalCluster

PRODUCERS, CONSUMERS = 2, 2


def test_rolling_restart_under_load_loses_nothing_and_fails_no_call():
    with LocalCluster() as cl:
        stop = threading.Event()
        produced: list[str] = []
        consumed: list[str] = []
        failures: list[str] = []
        pauses: list[float] = []
        calls = [0]
        lock = threading.Lock()

        def timed(fn, pause: bool = False):
            t0 = time.monotonic()
            try:
                return fn()
            finally:
                with lock:
                    calls[0] += 1
                    if pause:                    # a produce never waits: its time is a pause
                        pauses.append(time.monotonic() - t0)

        def producer(i: int) -> None:
            with Client(cl.addresses, retry_timeout=60) as c:
                q = c.queue("rolling")
                n = 0
                while not stop.is_set():
                    item = f"p{i}-{n}"
                    try:
                        timed(lambda: q.produce(item), pause=True)
                    except GesmasError as e:
                        failures.append(f"produce {item}: {e}")
                        return
                    with lock:
                        produced.append(item)
                    n += 1

        def consumer() -> None:
            with Client(cl.addresses, retry_timeout=60) as c:
                q = c.queue("rolling")
                while True:
                    try:
                        item = timed(lambda: q.consume(timeout=1.0))
                    except Timeout:
                        if stop.is_set():
                            return
                        continue
                    except GesmasError as e:
                        failures.append(f"consume: {e}")
                        return
                    with lock:
                        consumed.append(item)

        threads = [threading.Thread(target=producer, args=(i,)) for i in range(PRODUCERS)]
        threads += [threading.Thread(target=consumer) for _ in range(CONSUMERS)]
        for t in threads:
            t.start()
        started = time.monotonic()
        try:
            while len(produced) < 50 and time.monotonic() - started < 30:
                time.sleep(0.05)
            for m in cl.members:                         # one at a time, the leader too
                cl.restart_member(m, signal.SIGTERM)
                cl.wait_caught_up(m, timeout=60)
                mark = len(produced)
                while len(produced) < mark + 50 and time.monotonic() - started < 120:
                    time.sleep(0.05)                     # serving again before the next one
        finally:
            stop.set()
            for t in threads:
                t.join(120)
        assert not failures, failures[:5]
        assert len(consumed) == len(set(consumed)), "an item was consumed twice"
        assert sorted(consumed) == sorted(produced), (
            f"lost: {sorted(set(produced) - set(consumed))[:10]}")
        print(f"\nrolling restart: {calls[0]} calls, {len(failures)} failed, "
              f"{len(set(produced) - set(consumed))} lost, {len(produced)} items, "
              f"longest produce {max(pauses):.2f} s, "
              f"{time.monotonic() - started:.1f} s in all")

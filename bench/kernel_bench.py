#!/usr/bin/env python
"""Kernel micro-benchmarks: the kernel alone, in-process, no network, no replication.

    python bench/kernel_bench.py            # full run (about a minute)
    python bench/kernel_bench.py --quick    # tiny sizes, a few seconds (the test suite's smoke test)

Prints a markdown table:
- produce+consume pairs per second, commands fed as encode()d bytes (so decode is included,
  as in the server's apply path); once with the item waiting for the consumer, once with the
  consumer waiting for the item (a wake-up per pair);
- lock hand-offs per second with 1000 requests waiting on the lock;
- consume latency (µs per consume: median and p99) with 10^3, 10^4, 10^5 items queued:
  must stay flat;
- memory per blocked waiter (tracemalloc over 10^4 blocked consumers; greenlet stack copies
  are PyMem allocations, so they are counted);
- Checkpoint time (interrupt + pickle + re-run) and Kernel.restore time with 10^4 waiters.

Every timed loop stops at its time budget (--seconds) or its count, whichever comes first.
Times are this process's CPU time (--wall for the wall clock). Figures are for one core of
whatever machine runs this; compare runs on the same machine only.
"""
from __future__ import annotations

import argparse
import gc
import platform
import sys
import time
import tracemalloc
from typing import Any, Callable

import greenlet

from gesmas.objects import RESERVED_CLASSES, standard_sources
from gesmas.server.kernel import (Checkpoint, Config, CreateObject, Invoke, Kernel,
                                  OpenSession, RegisterClass, encode)
from gesmas.server.kernel.auth import SYSTEM
from gesmas.server.kernel.codec import Command

CONFIG = Config(reserved_classes=RESERVED_CLASSES)
PARK = True        # --no-park: every waiting call keeps its greenlet

# CPU time of this process by default: the kernel is single-threaded, and CPU time does not
# count the time other processes on a shared machine take from us. --wall uses perf_counter.
clock = time.process_time


class Driver:
    """Numbers the log and keeps per-session seqs; `apply` takes a Command or bytes."""

    def __init__(self) -> None:
        self.k = Kernel(CONFIG)               # as the replicas run the standard classes
        self.k.runner.park = PARK
        self.index = 0
        self.seqs: dict[int, int] = {}
        for _, src in standard_sources():
            self.apply(RegisterClass(source=src, user=SYSTEM))

    def apply(self, cmd: Command | bytes) -> list[Any]:
        self.index += 1
        return self.k.apply(self.index, cmd)

    def session(self) -> int:
        out = self.apply(OpenSession(ttl=60, tag="s"))
        return out[0].value

    def make(self, cls: str, name: str, *args: Any) -> None:
        out = self.apply(CreateObject(class_name=cls, name=name, args=list(args), tag="m"))
        assert out and out[0].error is None, out

    def invoke(self, session: int, obj: str, method: str, *args: Any, tag: str = "") -> Invoke:
        """The next Invoke of `session` (not applied), acknowledging every earlier result."""
        seq = self.seqs.get(session, 0) + 1
        self.seqs[session] = seq
        return Invoke(session=session, seq=seq, ack=seq - 1, name=obj, method=method,
                      args=list(args), tag=tag)


def timed_batches(make_batch: Callable[[], list[bytes]], run: Callable[[bytes], Any],
                  per_batch: int, budget: float, max_units: int) -> tuple[int, float]:
    """Apply pre-encoded batches until `budget` seconds or `max_units` units; encoding is
    done between batches, outside the timed part. Returns (units, seconds)."""
    units, spent = 0, 0.0
    while spent < budget and units < max_units:
        batch = make_batch()
        t0 = clock()
        for b in batch:
            run(b)
        spent += clock() - t0
        units += per_batch
    return units, spent


# -- measurements ---------------------------------------------------------------------------

def bench_pairs(budget: float, max_pairs: int, consumer_first: bool) -> float:
    d = Driver()
    d.make("Queue", "q")
    p, c = d.session(), d.session()
    n = 0
    per = 500

    def batch() -> list[bytes]:
        nonlocal n
        out = []
        for _ in range(per):
            n += 1
            prod = encode(d.invoke(p, "q", "produce", n, tag="p"))
            cons = encode(d.invoke(c, "q", "consume", tag="c"))
            out += [cons, prod] if consumer_first else [prod, cons]
        return out

    done = 0

    def run(b: bytes) -> None:
        nonlocal done
        done += len(d.apply(b))

    pairs, secs = timed_batches(batch, run, per, budget, max_pairs)
    assert done == 2 * pairs, (done, pairs)          # every produce and consume answered
    assert d.k._waiting == 0
    return pairs / secs


def bench_lock_handoffs(budget: float, max_handoffs: int, waiting: int) -> float:
    d = Driver()
    d.make("Lock", "l")
    ss = [d.session() for _ in range(waiting + 1)]
    for s in ss:
        d.apply(d.invoke(s, "l", "acquire", tag="a"))
    assert d.k._waiting == waiting
    turn = 0
    per = 500

    def batch() -> list[bytes]:
        nonlocal turn
        out = []
        for _ in range(per):
            holder = ss[turn % len(ss)]
            turn += 1
            out.append(encode(d.invoke(holder, "l", "release", tag="r")))
            out.append(encode(d.invoke(holder, "l", "acquire", tag="a")))   # back in line
        return out

    grants = 0

    def run(b: bytes) -> None:
        nonlocal grants
        for c in d.apply(b):
            grants += c.tag == "a"
    handoffs, secs = timed_batches(batch, run, per, budget, max_handoffs)
    assert grants == handoffs and d.k._waiting == waiting, (grants, handoffs)
    return handoffs / secs


def bench_consume_latency(lengths: list[int], budget: float,
                          max_ops: int) -> dict[int, tuple[float, float]]:
    """{queue length: (median, 99th percentile) µs of one consume, bytes in}. One kernel per
    length, measured in alternating blocks so that a change in machine load hits every length
    alike; a produce after each consume (not timed) keeps each length constant."""
    drivers = {}
    for n in lengths:
        d = Driver()
        d.make("Queue", "q")
        p, c = d.session(), d.session()
        for i in range(n):
            d.apply(d.invoke(p, "q", "produce", i))
        drivers[n] = (d, p, c)
    samples: dict[int, list[float]] = {n: [] for n in lengths}
    spent = 0.0
    per = 200
    while spent < budget and len(samples[lengths[0]]) < max_ops:
        for n, (d, p, c) in drivers.items():
            cons = [encode(d.invoke(c, "q", "consume", tag="c")) for _ in range(per)]
            prods = [encode(d.invoke(p, "q", "produce", 0, tag="p")) for _ in range(per)]
            for cb, pb in zip(cons, prods):
                t0 = clock()
                out = d.apply(cb)
                dt = clock() - t0
                assert out and out[0].error is None
                samples[n].append(dt)
                spent += dt
                d.apply(pb)
    result = {}
    for n, (d, _, _) in drivers.items():
        assert d.k.objects["q"].instance.size() == n
        xs = sorted(samples[n])
        result[n] = (xs[len(xs) // 2] * 1e6, xs[int(len(xs) * 0.99)] * 1e6)
    return result


def _blocked_consumers(d: Driver, sessions: list[int]) -> None:
    for s in sessions:
        d.apply(d.invoke(s, "q", "consume", tag="w"))


def bench_waiter_memory(n: int) -> tuple[float, float]:
    """(bytes per waiter by tracemalloc, bytes per waiter by RSS growth; nan if unknown)."""
    d = Driver()
    d.make("Queue", "q")
    ss = [d.session() for _ in range(n)]
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    _blocked_consumers(d, ss)
    gc.collect()
    traced = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    assert d.k._waiting == n
    del d, ss
    gc.collect()

    d = Driver()                                       # again, untraced, for RSS
    d.make("Queue", "q")
    ss = [d.session() for _ in range(n)]
    gc.collect()
    r0 = _rss()
    _blocked_consumers(d, ss)
    gc.collect()
    r1 = _rss()
    return traced / n, (r1 - r0) / n if r0 and r1 else float("nan")


def _rss() -> int:
    try:
        with open("/proc/self/statm") as f:
            import os
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


def bench_checkpoint(n: int) -> tuple[float, float, int]:
    """(Checkpoint ms, Kernel.restore ms, blob bytes) with `n` blocked consumers."""
    d = Driver()
    d.make("Queue", "q")
    ss = [d.session() for _ in range(n)]
    _blocked_consumers(d, ss)
    assert d.k._waiting == n
    gc.collect()
    t0 = clock()
    out = d.apply(Checkpoint(tag="cp"))
    t1 = clock()
    assert [c.tag for c in out] == ["cp"] and d.k._waiting == n
    blob = d.k.checkpoint_blob
    assert blob is not None
    t2 = clock()
    k2 = Kernel.restore(blob, CONFIG)
    t3 = clock()
    assert k2._waiting == n
    return (t1 - t0) * 1e3, (t3 - t2) * 1e3, len(blob)


# -- main -----------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test")
    ap.add_argument("--seconds", type=float, default=None,
                    help="time budget of each timed loop (default 2, quick 0.1)")
    ap.add_argument("--wall", action="store_true",
                    help="time with the wall clock instead of this process's CPU time")
    ap.add_argument("--no-park", action="store_true",
                    help="keep every waiting call's greenlet (the kernel parks the standard "
                         "classes' restartable waits by default: kernel/runner.py)")
    a = ap.parse_args(argv)
    global clock, PARK
    PARK = not a.no_park
    if a.wall:
        clock = time.perf_counter
    quick = a.quick
    budget = a.seconds if a.seconds is not None else (0.1 if quick else 2.0)
    cap = 2_000 if quick else 1_000_000
    waiting = 100 if quick else 1000
    lengths = [10 ** 2, 10 ** 3] if quick else [10 ** 3, 10 ** 4, 10 ** 5]
    nwait = 1000 if quick else 10 ** 4

    rows: list[tuple[str, str, str]] = []

    def row(name: str, value: str, note: str = "") -> None:
        rows.append((name, value, note))
        print(f"  {name}: {value} {note}", file=sys.stderr, flush=True)

    t_all = clock()
    row("produce+consume pairs/s (item waits)",
        f"{bench_pairs(budget, cap, consumer_first=False):,.0f}", "bytes in: decode included")
    row("produce+consume pairs/s (consumer waits)",
        f"{bench_pairs(budget, cap, consumer_first=True):,.0f}", "one wake-up per pair")
    row(f"lock hand-offs/s, {waiting} waiting",
        f"{bench_lock_handoffs(budget, cap, waiting):,.0f}", "release + re-acquire per hand-off")
    lat = bench_consume_latency(lengths, 1.5 * budget, cap)
    for n, (med, p99) in lat.items():
        row(f"consume latency, {n:,} queued", f"{med:.1f} µs", f"median; p99 {p99:.1f} µs")
    row("consume latency ratio, longest/shortest queue",
        f"{lat[lengths[-1]][0] / lat[lengths[0]][0]:.2f}", "medians; flat means about 1")
    traced, rss = bench_waiter_memory(nwait)
    row(f"memory per blocked waiter ({nwait:,} consumers)", f"{traced:,.0f} B",
        f"tracemalloc; RSS growth {rss:,.0f} B")
    cp, rs, size = bench_checkpoint(nwait)
    row(f"Checkpoint with {nwait:,} waiters", f"{cp:,.1f} ms",
        f"blob {size / 1024:,.0f} KiB; Kernel.restore {rs:,.1f} ms")

    print(f"\nkernel bench{' (quick)' if quick else ''}"
          f"{'' if PARK else ' (waits not parked)'}: Python {platform.python_version()}, "
          f"greenlet {greenlet.__version__}, {platform.machine()}, "
          f"{'wall' if a.wall else 'CPU'} time, budget {budget:g} s per timed loop, "
          f"total {clock() - t_all:.1f} s\n")
    w0 = max(len(r[0]) for r in rows + [("measurement", "", "")])
    w1 = max(len(r[1]) for r in rows + [("", "value", "")])
    print(f"| {'measurement':<{w0}} | {'value':>{w1}} | notes |")
    print(f"|{'-' * (w0 + 2)}|{'-' * (w1 + 1)}:|-------|")
    for name, value, note in rows:
        print(f"| {name:<{w0}} | {value:>{w1}} | {note} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""The longest single insert into the kernel's tables of objects as they grow (issue "Scale
without pauses"): a dict grows its table all at once, copying every entry, on the insert that
fills two thirds of it (349,525 and 699,050 keys on the way to 10^6), and the kernel's tables
of objects and of their checkpoint frames were such dicts (kernel/epochdict.py).

    python bench/dict_resize_bench.py                 # 10^6 names, 3 runs
    python bench/dict_resize_bench.py --objects 200000 --runs 1

For each table: the longest insert, which insert it was, and the total time, per run; then
what a lookup costs once the table is full, of a name it holds (spread over the whole table)
and of one it does not hold (every object made looks its name up first), and the bytes a key
takes (tracemalloc, in a fill of its own). One process, nothing else in it; names as the
benchmarks make them ("scale/c-0000001")."""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
import tracemalloc

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "server"))

from gesmas.server.kernel.epochdict import EpochDict  # noqa: E402
from gesmas.server.kernel.frametable import FrameTable  # noqa: E402
from gesmas.server.kernel.records import ObjectTable  # noqa: E402


class Record:
    __slots__ = ("n",)

    def __init__(self, n: int) -> None:
        self.n = n


def fill(table: object, names: list[str], frame: bool) -> tuple[float, int, float]:
    """(longest insert in s, its position, total s) of inserting `names` into `table`, the
    collector off (its passes are another cost: docs/performance.md)."""
    gc.collect()
    gc.disable()
    setitem = type(table).__setitem__
    worst, at = 0.0, -1
    clock = time.perf_counter
    start = clock()
    for i, name in enumerate(names):
        value = b"f" if frame else Record(i)
        t = clock()
        setitem(table, name, value)
        dt = clock() - t
        if dt > worst:
            worst, at = dt, i + 1
    total = clock() - start
    gc.enable()
    return worst, at, total


def lookups(table: object, names: list[str], absent: list[str]) -> tuple[float, float]:
    """(us a lookup of a name held, us a lookup of one not held), `table` full of `names`."""
    contains = type(table).__contains__
    step = max(1, len(names) // len(absent))
    held = names[::step][:len(absent)]
    out = []
    for probe in (held, absent):
        clock = time.perf_counter
        start = clock()
        for name in probe:
            contains(table, name)
        out.append((clock() - start) / len(probe) * 1e6)
    return out[0], out[1]


def bytes_a_key(cls: type, names: list[str], frame: bool) -> float:
    tracemalloc.start()
    table = cls()
    base = tracemalloc.get_traced_memory()[0]
    for name in names:
        table[name] = b"f" if frame else None
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    return used / len(names)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--objects", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    names = [f"scale/c-{i:07d}" for i in range(a.objects)]
    kinds = {"dict (one, as the tables were)": (dict, False),
             "EpochDict": (EpochDict, False),
             "ObjectTable (objects by name)": (ObjectTable, False),
             "FrameTable (frames, and its page index)": (FrameTable, True)}
    absent = [f"scale/x-{i:07d}" for i in range(min(20_000, a.objects))]
    print(f"{a.objects} names, {a.runs} run(s); longest single insert (at which), total")
    costs = {}
    for label, (cls, frame) in kinds.items():
        worst, totals, held, missed = [], [], [], []
        for _ in range(a.runs):
            table = cls()
            ms, at, total = fill(table, names, frame)
            worst.append((ms * 1e3, at))
            totals.append(total)
            h, m = lookups(table, names, absent)
            held.append(h)
            missed.append(m)
            del table
        med = statistics.median(w for w, _ in worst)
        print(f"  {label:42s} longest {med:7.2f} ms (runs: "
              f"{', '.join(f'{w:.2f} at {at}' for w, at in worst)}); total "
              f"{statistics.median(totals):.2f} s")
        costs[label] = (statistics.median(held), statistics.median(missed),
                        bytes_a_key(cls, names, frame))
    print("full: a lookup of a name held, of one not held (median us); bytes a key")
    for label, (h, m, b) in costs.items():
        print(f"  {label:42s} held {h:6.2f} us, absent {m:6.2f} us; {b:6.1f} bytes")


if __name__ == "__main__":
    main()

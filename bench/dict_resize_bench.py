#!/usr/bin/env python
"""The longest single insert into the kernel's tables of objects as they grow (issue "Scale
without pauses"): a dict grows its table all at once, copying every entry, on the insert that
fills two thirds of it (349,525 and 699,050 keys on the way to 10^6), and the kernel's tables
of objects and of their checkpoint frames were such dicts (kernel/epochdict.py).

    python bench/dict_resize_bench.py                 # 10^6 names, 3 runs
    python bench/dict_resize_bench.py --objects 200000 --runs 1

For each table: the longest insert, which insert it was, and the total time, per run. One
process, nothing else in it; names as the benchmarks make them ("scale/c-0000001")."""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time

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
    print(f"{a.objects} names, {a.runs} run(s); longest single insert (at which), total")
    for label, (cls, frame) in kinds.items():
        worst, totals = [], []
        for _ in range(a.runs):
            ms, at, total = fill(cls(), names, frame)
            worst.append((ms * 1e3, at))
            totals.append(total)
        med = statistics.median(w for w, _ in worst)
        print(f"  {label:42s} longest {med:7.2f} ms (runs: "
              f"{', '.join(f'{w:.2f} at {at}' for w, at in worst)}); total "
              f"{statistics.median(totals):.2f} s")


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""How long a checkpoint holds the apply thread: its entry, and each idle slice of its capture
(kernel/capture.py, kernel/listed.py), in-process, no network, no replication.

    python bench/capture_slices.py [--objects 200000] [--made 20000] [--calls 200000]
                                   [--rounds 3] [--restore] [--quick]

A kernel with the standard classes (reserved, as on a replica) and the garbage collector
tuned as a replica tunes it (`gesmas.server.main.tune_gc`) gets --objects Counters, then
--rounds rounds of: a checkpoint as the leader proposes it (format 7), its idle slices
(`capture_some` with the applier's CAPTURE_SLICE) until the blob is whole, --made Counters
made, --calls calls on existing ones (spread over them; --calls equal to --objects changes
every object, so the next capture saves them all again) and 1,200 ticks (the entries after a
checkpoint apply the sizes it took, SIZES_PER_ENTRY at a time). With --restore, then: a
kernel restored from one more checkpoint (how long that took), --calls calls on it, and its
first capture, printed as a round is.

Prints per round: the entry, the number of slices, the longest slice, the longest slice in
which no garbage-collector pass ran (and what it was doing: saving objects, joining the
blob, or ending the capture), the longest collector pass, and the blob's size (the parts of a
blob of JOIN_APART_FROM bytes or more are joined apart, on a thread of a replica's own: how
long that took is printed too). A call that
arrives while a slice runs waits for it, so the longest slice is the stall a checkpoint can
still cause. Wall-clock times: run it on a quiet machine.
"""
from __future__ import annotations

import argparse
import gc
import sys
import time
from typing import Any

from gesmas.objects import RESERVED_CLASSES, standard_sources
from gesmas.server.kernel import (Checkpoint, Config, CreateObject, Invoke, Kernel,
                                  OpenSession, RegisterClass, Tick)
from gesmas.server.kernel.auth import SYSTEM
from gesmas.server.kernel.capture import CheckpointUnavailable
from gesmas.server.main import tune_gc
from gesmas.server.replication.applier import CAPTURE_SLICE


class Driver:
    def __init__(self) -> None:
        self.k = Kernel(Config(reserved_classes=RESERVED_CLASSES))
        self.index, self.ts, self.seq = 0, 0.0, 0
        for module, src in standard_sources():
            self.run(RegisterClass(ts=self.ts, tag="r", source=src, user=SYSTEM), module)
        out = self.apply(OpenSession(ts=self.ts, ttl=3600, tag="s"))
        self.session = out[0].value

    def apply(self, cmd: Any) -> list[Any]:
        self.index += 1
        return self.k.apply(self.index, cmd)

    def run(self, cmd: Any, what: str) -> Any:
        out = [c for c in self.apply(cmd) if c.tag == cmd.tag]
        if not out or out[0].error is not None:
            raise SystemExit(f"{what}: {out[0].error if out else 'no completion'}")
        return out[0].value

    def make(self, name: str) -> None:
        self.run(CreateObject(ts=self.ts, tag="c", class_name="Counter", name=name,
                              measured=True), name)

    def call(self, name: str) -> None:
        self.seq += 1
        self.run(Invoke(ts=self.ts, tag="i", session=self.session, seq=self.seq,
                        ack=self.seq - 1, name=name, method="add", args=[1]), name)

    def tick(self) -> None:
        self.ts += 0.001
        self.apply(Tick(ts=self.ts))

    def checkpoint(self) -> None:
        self.run(Checkpoint(ts=self.ts, tag="k", defer=True, calls_apart=True,
                            listed_after=True, touched_in_parts=True,
                            hooked_touched=True, keep_gone=True), "checkpoint")


class Collector:
    """The garbage collector's passes: their total time and the longest one."""

    def __init__(self) -> None:
        self.started, self.total, self.longest = 0.0, 0.0, 0.0
        gc.callbacks.append(self.callback)

    def callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self.started = time.perf_counter()
        else:
            d = time.perf_counter() - self.started
            self.total += d
            self.longest = max(self.longest, d)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--objects", type=int, default=200_000)
    ap.add_argument("--made", type=int, default=20_000, help="Counters made each round")
    ap.add_argument("--calls", type=int, default=200_000, help="calls made each round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--restore", action="store_true",
                    help="then restore a kernel from a last checkpoint, make --calls calls "
                         "and time its first capture")
    ap.add_argument("--quick", action="store_true", help="tiny sizes (the smoke test)")
    a = ap.parse_args(argv)
    if a.quick:
        a.objects, a.made, a.calls, a.rounds = 2000, 200, 2000, 2
    tune_gc()
    collector = Collector()
    d = Driver()
    t0 = time.perf_counter()
    for i in range(a.objects):
        d.make(f"c{i:07d}")
    print(f"{a.objects} Counters made in {time.perf_counter() - t0:.1f} s; "
          f"{a.made} made and {a.calls} calls a round", flush=True)
    made = a.objects
    for r in range(a.rounds):
        size = capture_round(d, collector, f"round {r}")
        if size is None:
            return 1
        for _ in range(a.made):
            d.make(f"c{made:07d}")
            made += 1
        for i in range(a.calls):
            d.call(f"c{(r * 7919 + i * 13) % a.objects:07d}")
        for _ in range(1200):
            d.tick()
    if a.restore:
        d.checkpoint()                 # the blob a restore reads: the state after the rounds
        while d.k.capture_some(CAPTURE_SLICE):
            pass
        blob = d.k.checkpoint_blob
        assert blob is not None
        config = d.k.config
        del d.k                        # (freeing the live kernel is not the restore's time)
        t = time.perf_counter()
        d.k = Kernel.restore(blob, config)
        print(f"restored from {len(blob)} bytes in {time.perf_counter() - t:.2f} s", flush=True)
        for i in range(a.calls):
            d.call(f"c{(i * 13) % a.objects:07d}")
        if capture_round(d, collector, "the first capture after the restore") is None:
            return 1
    return 0


def capture_round(d: Driver, collector: Collector, title: str) -> int | None:
    """A checkpoint and its idle slices until the blob is whole; prints what they took and
    returns the blob's size (None: no blob)."""
    k = d.k
    collector.longest = 0.0
    t = time.perf_counter()
    d.checkpoint()
    entry = time.perf_counter() - t
    worst = clean = 0.0
    what = "-"
    n = 0
    spent: dict[str, float] = {"save": 0.0, "join": 0.0, "end": 0.0}
    while True:
        cap = k.checkpoints.capture
        doing = "end" if cap is None else "join" if cap.joined or cap.pickled or \
            not cap.any_unsaved() else "save"
        g0 = collector.total
        t = time.perf_counter()
        more = k.capture_some(CAPTURE_SLICE)
        dt = time.perf_counter() - t
        n += 1
        spent[doing] += dt
        worst = max(worst, dt)
        if collector.total == g0 and dt > clean:
            clean, what = dt, doing if more else "end"
        if not more:
            break
    apart = k.checkpoint_size is None       # a large blob: a replica joins it on a thread
    t = time.perf_counter()
    try:
        size: int | None = len(k.checkpoint_blob or b"")
    except CheckpointUnavailable:
        size = None
    waited = time.perf_counter() - t
    print(f"{title}: entry {entry * 1e3:.1f} ms, {n} slices, longest {worst * 1e3:.0f} ms,"
          f" longest without a collection {clean * 1e3:.0f} ms ({what}), longest "
          f"collection {collector.longest * 1e3:.0f} ms, in all "
          + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in spent.items())
          + f", blob {size} bytes"
          + (f" (its parts joined apart in {waited * 1e3:.0f} ms: a replica does that "
             "on a thread of its own)" if apart else ""), flush=True)
    if size is None:
        print("FAILED: the capture ended without a blob", flush=True)
    return size


if __name__ == "__main__":
    sys.exit(main())

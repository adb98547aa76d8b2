"""What the runaway defence adds to applying one log entry, in one process (CPU time).

The defence writes a shared page twice around each entry (watchdog.ApplyMonitor: begin,
end) and routes each entry through the Applier (replication/applier.py) instead of a few
lines in Replica._apply_committed. To see that against the real work, this times per entry:

  kernel     Kernel.apply of a Counter.add invocation (what a replica does for a call anyway)
  before     Replica._apply_committed's bookkeeping before the defence, around a state
             machine that does nothing
  applier    Applier.apply around the same, without a watchdog (--runaway-limit 0)
  watched    the same with the page written around every entry (the default); the
             watchdog process runs and polls meanwhile

Each row is the best of --repeat runs of --entries entries, the rows taking turns, the
garbage collector off while timed:

    .venv/bin/python bench/runaway_bench.py [--entries 200000] [--repeat 5]
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from typing import Any, Callable, List, Optional, Tuple

from gesmas.objects import standard_sources
from gesmas.server.kernel import Config, Kernel, codec
from gesmas.server.replication.applier import Applier
from gesmas.server.replication.watchdog import ApplyMonitor


class NullSM:
    """A state machine that does nothing: what is left is the bookkeeping around it."""
    checkpoint_index: Optional[int] = None
    checkpoint_blob: Optional[bytes] = None

    def apply(self, index: int, data: bytes) -> list:
        return []

    def abort(self, index: int, data: bytes, message: str) -> list:
        return []

    @staticmethod
    def is_checkpoint(data: bytes) -> bool:
        return False


def counter_calls(n: int) -> Tuple[Kernel, int, List[bytes]]:
    """A kernel with the standard classes and a session; n Counter.add invocations."""
    k, index = Kernel(Config()), 0
    for _, src in standard_sources():
        index += 1
        k.apply(index, codec.encode(codec.RegisterClass(ts=1.0, source=src)))
    index += 1
    k.apply(index, codec.encode(codec.OpenSession(ts=1.0, ttl=3600.0, secret="s")))
    calls = [codec.encode(codec.Invoke(ts=1.0, tag=f"t{i}", session=index, seq=i + 1, ack=i,
                                       name="c", method="add", secret="s",
                                       class_name="Counter", create=True))
             for i in range(n)]
    return k, index, calls


def before(sm: Any, deliver: Callable[[list], None]) -> Callable[[int, bytes], None]:
    """Replica._apply_committed at 7f6148a, less its logging and error handling."""
    since: List[Tuple[int, bytes]] = []
    last = [None]

    def apply(index: int, data: bytes) -> None:
        out = sm.apply(index, data)
        since.append((index, data))
        ckpt = sm.checkpoint_index
        if ckpt is not None and ckpt != last[0]:
            last[0] = ckpt
        if out:
            deliver(out)
    return apply


def timed(apply: Callable[[int, bytes], None], start: int, entries: List[bytes]) -> float:
    gc.collect()
    gc.disable()
    try:
        started = time.process_time()
        for index, data in enumerate(entries, start=start):
            apply(index, data)
        return (time.process_time() - started) / len(entries)
    finally:
        gc.enable()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--entries", type=int, default=200000)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    n = args.entries
    out: List[Any] = []
    kinds = ["kernel", "before", "applier", "watched"]
    best = {k: float("inf") for k in kinds}
    with tempfile.TemporaryDirectory() as page_dir:
        monitor = ApplyMonitor(page_dir, 3600.0)
        try:
            _, _, calls = counter_calls(n)
            for _ in range(args.repeat):
                k, index, few = counter_calls(min(n, 20000))
                best["kernel"] = min(best["kernel"], timed(k.apply, index + 1, few))
                best["before"] = min(best["before"], timed(before(NullSM(), out.extend), 1,
                                                           calls))
                a = Applier(NullSM, NullSM, out.extend)
                best["applier"] = min(best["applier"], timed(a.apply, 1, calls))
                a = Applier(NullSM, NullSM, out.extend, monitor=monitor)
                best["watched"] = min(best["watched"], timed(a.apply, 1, calls))
        finally:
            monitor.stop()
    print(f"runaway_bench: CPU time per entry, best of {args.repeat} (kernel: 20000 "
          f"Counter.add, others: {n} entries of {len(calls[0])} bytes), load "
          f"{os.getloadavg()[0]:.2f}, Python {sys.version.split()[0]}")
    for k in kinds:
        extra = "" if k in ("kernel", "before") else \
            f"   (+{(best[k] - best['before']) * 1e6:.2f} µs vs before)"
        print(f"  {k:8s} {best[k] * 1e6:8.2f} µs{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

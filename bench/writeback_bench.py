"""How long a journal's small fsync waits while a large snapshot file is written beside it.

A replica appends Raft entries to its journal and fsyncs them before it acknowledges them;
every checkpoint it also writes a snapshot file (105 MB at 10^6 objects). Written whole and
then fsynced, the snapshot is written back to the disk at once, and on ext4 the journal's
fsync can wait behind that writeback. This program models it in one process: a thread
appends 200 bytes and fsyncs, every 2 ms, in a directory where the main thread writes a
snapshot-sized file, either whole then fsynced (`whole`), or as the replicas write it now,
synced a megabyte at a time (`paced`: replication/snapshots.py's PacedFile). It prints the
journal fsync's latency before and during each write.

    python bench/writeback_bench.py [--mb 100] [--runs 3] [--dir DIR]

DIR (default: a new directory under the current one, removed after) should be on the disk
the replicas' data dirs use.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

from gesmas.server.replication.snapshots import PacedFile


def one(directory: str, mode: str, size: int) -> dict[str, float]:
    lat: list[tuple[float, float]] = []
    stop = threading.Event()

    def journal() -> None:
        fd = os.open(os.path.join(directory, "journal"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            while not stop.is_set():
                os.write(fd, b"x" * 200)
                t = time.perf_counter()
                os.fsync(fd)
                lat.append((t, time.perf_counter() - t))
                time.sleep(0.002)
        finally:
            os.close(fd)

    th = threading.Thread(target=journal)
    th.start()
    time.sleep(1.0)                    # the journal's own latency first
    data = os.urandom(1 << 20) * (size >> 20)
    path = os.path.join(directory, "snapshot.tmp")
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        if mode == "whole":
            f.write(data)
            f.flush()
        else:
            paced = PacedFile(f, sync=True)
            paced.write(data)
            paced.flush_to_disk()
        os.fsync(f.fileno())
    t1 = time.perf_counter()
    time.sleep(0.5)
    stop.set()
    th.join()
    os.unlink(path)
    os.unlink(os.path.join(directory, "journal"))
    before = [d * 1e3 for t, d in lat if t < t0]
    during = [d * 1e3 for t, d in lat if t0 <= t <= t1]
    return {"write_ms": (t1 - t0) * 1e3, "before_max_ms": max(before),
            "during_p50_ms": statistics.median(during) if during else 0.0,
            "during_max_ms": max(during) if during else 0.0, "during_n": len(during)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=100, help="size of the snapshot file")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", help="where to write (default: a new directory here)")
    a = ap.parse_args(argv)
    directory = a.dir or tempfile.mkdtemp(prefix="writeback-", dir=".")
    os.makedirs(directory, exist_ok=True)
    try:
        rows = []
        for run in range(a.runs):
            for mode in ("whole", "paced"):
                r = one(directory, mode, a.mb << 20)
                rows.append((mode, run + 1, r))
    finally:
        if not a.dir:
            shutil.rmtree(directory, ignore_errors=True)
    print(f"| {a.mb} MB snapshot | run | write + fsync, ms | journal fsync before: max, ms "
          "| during: n, p50, max, ms |")
    print("|---|---:|---:|---:|---:|")
    for mode, run, r in rows:
        print(f"| {mode} | {run} | {r['write_ms']:.0f} | {r['before_max_ms']:.1f} | "
              f"{r['during_n']}, {r['during_p50_ms']:.2f}, {r['during_max_ms']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

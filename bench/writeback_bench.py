"""How long a journal's small fsync waits while a large snapshot file is written beside it.

A replica appends Raft entries to its journal and fsyncs them before it acknowledges them;
every checkpoint it also writes a snapshot file (105 MB at 10^6 objects). Written whole and
then fsynced, the snapshot is written back to the disk at once, and on ext4 the journal's
fsync can wait behind that writeback. This program models it in one process: a thread
appends 200 bytes and fsyncs, every 2 ms, in a directory where the main thread writes a
snapshot-sized file, either whole then fsynced (`whole`), or as the replicas write it now,
synced a megabyte at a time (`paced`: replication/snapshots.py's PacedFile). It prints the
journal fsync's latency before and during each write.

With --install it measures the step after: a snapshot renamed over the last one. The
replaced file's blocks are freed, and on a filesystem mounted with `discard` they are trimmed
at the journal's next commit, which fsyncs wait for. It installs `--runs` snapshots each way,
`fresh` (a new file, as the replicas did before) and `over` (written over the blocks of the
one before last: replication/snapshots.py's written_over and spare), and prints the journal
fsync's latency over the 2 s after each rename, with the disk's discards meanwhile.

    python bench/writeback_bench.py [--mb 100] [--runs 3] [--dir DIR] [--install]

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

from gesmas.server.replication.snapshots import (PacedFile, keep_previous, take_spare,
                                                 written_over)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from host_stalls import DISK_FIELDS, _disk, _disk_stat_path  # noqa: E402

_DISCARD_MS = DISK_FIELDS.index(14)        # ms the device spent discarding


class Journal:
    """A thread appending 200 bytes and fsyncing every 2 ms: (start, seconds) per fsync."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, "journal")
        self.lat: list[tuple[float, float]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            while not self.stop.is_set():
                os.write(fd, b"x" * 200)
                t = time.perf_counter()
                os.fsync(fd)
                self.lat.append((t, time.perf_counter() - t))
                time.sleep(0.002)
        finally:
            os.close(fd)

    def between(self, a: float, b: float) -> list[float]:
        return [d * 1e3 for t, d in self.lat if a <= t <= b]

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        os.unlink(self.path)


def write(path: str, data: bytes, how: str) -> None:
    """`data` into `path`, fsynced: `whole` (written, then fsynced), `paced` (a new file
    synced a MB at a time: PacedFile) or `over` (over the blocks it has: written_over)."""
    if how == "over":
        with written_over(path, sync=True) as paced:
            paced.write(data)
        return
    with open(path, "wb") as f:
        if how == "whole":
            f.write(data)
            f.flush()
        else:
            paced = PacedFile(f, sync=True)
            paced.write(data)
            paced.flush_to_disk()
        os.fsync(f.fileno())


def one(directory: str, mode: str, size: int) -> dict[str, float]:
    journal = Journal(directory)
    time.sleep(1.0)                    # the journal's own latency first
    data = os.urandom(1 << 20) * (size >> 20)
    path = os.path.join(directory, "snapshot.tmp")
    t0 = time.perf_counter()
    write(path, data, mode)
    t1 = time.perf_counter()
    time.sleep(0.5)
    journal.close()
    os.unlink(path)
    before = journal.between(0.0, t0)
    during = journal.between(t0, t1)
    return {"write_ms": (t1 - t0) * 1e3, "before_max_ms": max(before),
            "during_p50_ms": statistics.median(during) if during else 0.0,
            "during_max_ms": max(during) if during else 0.0, "during_n": len(during)}


def installs(directory: str, mode: str, size: int, runs: int) -> list[dict[str, float]]:
    """`runs` snapshots of `size` bytes installed by a rename over the last one, `fresh`
    or written `over` the one before last; per install the journal's fsyncs over the 2 s
    after the rename and the disk's discards meanwhile (module docstring)."""
    data = os.urandom(1 << 20) * (size >> 20)
    snap = os.path.join(directory, "snapshot.bin")
    tmp, spare = snap + ".tmp", snap + ".spare"
    stat = _disk_stat_path(directory)
    how = "over" if mode == "over" else "paced"
    write(snap, data, how)
    if mode == "over":
        write(spare, data, how)          # as after the second snapshot of a replica
    journal = Journal(directory)
    rows = []
    try:
        time.sleep(1.0)
        for _ in range(runs):
            if mode == "over":                # the replicas' steps (snapshots.py)
                take_spare(spare, tmp)
            write(tmp, data, how)
            d0 = _disk(stat)
            if mode == "over":
                keep_previous(snap, spare)
            t0 = time.perf_counter()
            os.replace(tmp, snap)
            fd = os.open(directory, os.O_RDONLY)
            os.fsync(fd)                 # as the journal's compaction does after it
            os.close(fd)
            time.sleep(2.0)
            d1 = _disk(stat)
            after = journal.between(t0, t0 + 2.0)
            rows.append({"after_n": len(after), "after_p50_ms": statistics.median(after),
                         "after_max_ms": max(after),
                         "discard_ms": d1[_DISCARD_MS] - d0[_DISCARD_MS]})
    finally:
        journal.close()
        for p in (snap, tmp, spare):
            if os.path.exists(p):
                os.unlink(p)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=100, help="size of the snapshot file")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", help="where to write (default: a new directory here)")
    ap.add_argument("--install", action="store_true",
                    help="measure the install of a snapshot over the last one instead")
    a = ap.parse_args(argv)
    directory = a.dir or tempfile.mkdtemp(prefix="writeback-", dir=".")
    os.makedirs(directory, exist_ok=True)
    try:
        if a.install:
            got = {mode: installs(directory, mode, a.mb << 20, a.runs)
                   for mode in ("fresh", "over")}
        else:
            rows = [(mode, run + 1, one(directory, mode, a.mb << 20))
                    for run in range(a.runs) for mode in ("whole", "paced")]
    finally:
        if not a.dir:
            shutil.rmtree(directory, ignore_errors=True)
    if a.install:
        print(f"| {a.mb} MB snapshot installed | # | journal fsync over the 2 s after: n, "
              "p50, max, ms | disk discarding, ms |")
        print("|---|---:|---:|---:|")
        for mode, installed in got.items():
            for i, r in enumerate(installed, 1):
                print(f"| {mode} | {i} | {r['after_n']}, {r['after_p50_ms']:.2f}, "
                      f"{r['after_max_ms']:.1f} | {r['discard_ms']} |")
        return 0
    print(f"| {a.mb} MB snapshot | run | write + fsync, ms | journal fsync before: max, ms "
          "| during: n, p50, max, ms |")
    print("|---|---:|---:|---:|---:|")
    for mode, run, r in rows:
        print(f"| {mode} | {run} | {r['write_ms']:.0f} | {r['before_max_ms']:.1f} | "
              f"{r['during_n']}, {r['during_p50_ms']:.2f}, {r['during_max_ms']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

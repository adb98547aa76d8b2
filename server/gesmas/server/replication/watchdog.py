"""The runaway watchdog: the last line of defence against a log entry whose native work the
dialect's charging missed (DESIGN §7a).

Theory of operation
-------------------
A thread cannot interrupt C code that holds the GIL. One C call of uploaded code that runs
for minutes freezes the whole replica process (gRPC, Raft heartbeats, metrics: the apply
thread is pysyncobj's tick thread), and since the entry is committed it freezes every
replica again at each restart. So the guard is another process.

* Publishing (the replica: ``ApplyMonitor``). The replica maps a small page, the file
  ``apply.shm`` in its data dir. Around each entry it applies, the apply thread writes a
  sequence number, the entry's index and CRC-32 and its own thread id in one struct write
  (``begin``), and clears the index afterwards (``end``). Nothing else: no lock, no syscall.
* Watching (this file, run as a program: ``main``). A child process started with the replica
  polls the page every ``poll`` seconds. While one entry (same sequence number and index)
  stays in progress it reads the CPU time the apply thread has used (utime + stime in
  /proc/PID/task/TID/stat). Once that thread has burned ``limit`` seconds of CPU on the one
  entry (counted from the first poll that saw it), the entry has run away: the watchdog
  writes the runaway record (``RUNAWAY`` in the data dir: index, CRC, limit; a temporary file,
  fsynced, renamed, directory fsynced), logs a CRITICAL line and SIGKILLs the replica. Only
  CPU time counts, so a replica that is SIGSTOPped, descheduled or swapping is never taken
  for a runaway, however long it stands still. An entry the cluster decided to keep (a
  replica that was slower than the others, applier.py) is published as unguarded.
* After the kill. The replica's supervisor (`gesmas up`, systemd ``Restart=on-failure``,
  compose ``restart:``, a Kubernetes pod) starts it again; it reads the record, holds the
  entry instead of applying it, and has the cluster abort it (applier.py).
* Lifetime. The child asks the kernel for SIGKILL when the thread that started it ends
  (PR_SET_PDEATHSIG; the replica starts it from its main thread) and checks its parent's
  pid at every poll too; the replica stops it on a clean exit. It has a pid of its own, so
  whatever manages the replica by pid (tests, `gesmas up`) still sees only the replica. It
  is run as a file with ``python -I`` and imports only the standard library and logs.py.

A replica that is PID 1 of its PID namespace (a container without an init) ignores SIGKILL
from inside the namespace: the image runs gesmas under tini (deploy/Dockerfile), and the
watchdog says so in its log when it finds itself in that case.

Page layout (little endian, 64 bytes): magic ``GESMASW1`` | u64 replica pid | u64 sequence
| u64 index (0: idle) | u64 thread id | u32 CRC-32 | u32 flags (1: unguarded) | u64 polls
(written by the watchdog) | u64 watchdog pid.
"""
from __future__ import annotations

import argparse
import json
import logging
import mmap
import os
import signal
import struct
import subprocess
import sys
import threading
import time
import zlib
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

log = logging.getLogger("gesmas.watchdog")

PAGE_NAME = "apply.shm"
RECORD_NAME = "RUNAWAY"
MAGIC = b"GESMASW1"
PAGE_SIZE = 64
UNGUARDED = 1
_HEAD = struct.Struct("<8sQ")           # magic, replica pid
_BEGIN = struct.Struct("<QQQII")        # at 16: sequence, index, thread id, crc, flags
_U64 = struct.Struct("<Q")
_INDEX_AT, _POLLS_AT, _WATCHDOG_PID_AT = 24, 48, 56
_PR_SET_PDEATHSIG = 1
_pack_begin, _pack_u64 = _BEGIN.pack_into, _U64.pack_into      # the apply path's two writes
_native_id, _crc32 = threading.get_native_id, zlib.crc32


# ------------------------------------------------------------------------- the runaway record
@dataclass(frozen=True)
class Record:
    """What the watchdog writes before it kills the replica: the entry that ran away."""
    index: int
    crc: int
    limit: float


def write_record(data_dir: str, record: Record, cpu_seconds: float) -> None:
    path = os.path.join(data_dir, RECORD_NAME)
    tmp = path + ".tmp"
    body = {"index": record.index, "crc": record.crc, "limit": record.limit,
            "cpu_seconds": round(cpu_seconds, 3),
            "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(body, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(data_dir)


def read_record(data_dir: str) -> Optional[Record]:
    """The runaway record in `data_dir`, or None (no record, or an unreadable one: logged)."""
    path = os.path.join(data_dir, RECORD_NAME)
    try:
        with open(path, encoding="utf-8") as f:
            body = json.load(f)
        return Record(int(body["index"]), int(body["crc"]), float(body["limit"]))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.error("ignoring the unreadable runaway record %s: %r", path, e)
        return None


def remove_record(data_dir: str) -> None:
    try:
        os.remove(os.path.join(data_dir, RECORD_NAME))
    except FileNotFoundError:
        return
    _fsync_dir(data_dir)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ------------------------------------------------------------------- the replica's side
def _map(path: str) -> mmap.mmap:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        if os.fstat(fd).st_size < PAGE_SIZE:
            os.ftruncate(fd, PAGE_SIZE)
        return mmap.mmap(fd, PAGE_SIZE)
    finally:
        os.close(fd)


class ApplyMonitor:
    """The page the apply thread writes, and the watchdog process that reads it."""

    def __init__(self, data_dir: str, limit: float, node_id: int = 0,
                 log_format: str = "text", poll: Optional[float] = None) -> None:
        self.data_dir, self.limit = data_dir, limit
        self._page = _map(os.path.join(data_dir, PAGE_NAME))
        self._page[:PAGE_SIZE] = bytes(PAGE_SIZE)
        _HEAD.pack_into(self._page, 0, MAGIC, os.getpid())
        self._seq = 0
        poll = poll if poll is not None else min(0.25, max(0.02, limit / 8))
        self.proc: Optional[subprocess.Popen[bytes]] = subprocess.Popen(
            [sys.executable, "-I", os.path.abspath(__file__), "--data-dir", data_dir,
             "--limit", repr(limit), "--poll", repr(poll), "--node", str(node_id),
             "--log-format", log_format],
            stdin=subprocess.DEVNULL, close_fds=True)

    def begin(self, index: int, data: bytes, guarded: bool = True) -> None:
        """The apply thread starts applying entry `index` (`data`: its bytes)."""
        self._seq = seq = self._seq + 1
        _pack_begin(self._page, 16, seq, index, _native_id(), _crc32(data),
                    0 if guarded else UNGUARDED)

    def end(self) -> None:
        _pack_u64(self._page, _INDEX_AT, 0)

    def polls(self) -> int:
        """How many times the watchdog has looked at the page (tests)."""
        return int(_U64.unpack_from(self._page, _POLLS_AT)[0])

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def read_page(path: str) -> Tuple[int, int, int, int, int, int, int]:
    """(replica pid, sequence, index, thread id, crc, flags, polls) of a page (tests, tools)."""
    with open(path, "rb") as f:
        raw = f.read(PAGE_SIZE)
    _, pid = _HEAD.unpack_from(raw, 0)
    seq, index, tid, crc, flags = _BEGIN.unpack_from(raw, 16)
    return pid, seq, index, tid, crc, flags, _U64.unpack_from(raw, _POLLS_AT)[0]


# ------------------------------------------------------------------------- the watchdog
def thread_cpu(pid: int, tid: int) -> Optional[float]:
    """CPU seconds (user + system) used so far by thread `tid` of process `pid`."""
    try:
        with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class Watch:
    """The watchdog's decision, apart from its I/O: fed one reading of the page per poll,
    it says when the entry in progress has burned `limit` seconds of CPU."""

    def __init__(self, limit: float, cpu: Callable[[int], Optional[float]]) -> None:
        self.limit = limit
        self._cpu = cpu                 # thread id -> CPU seconds of the apply thread
        self._key: Optional[Tuple[int, int]] = None
        self._start = 0.0
        self.burned = 0.0

    def step(self, seq: int, index: int, tid: int, flags: int) -> bool:
        if index == 0 or flags & UNGUARDED:
            self._key = None
            return False
        cpu = self._cpu(tid)
        if cpu is None:
            self._key = None
            return False
        if self._key != (seq, index):
            self._key, self._start, self.burned = (seq, index), cpu, 0.0
            return False
        self.burned = cpu - self._start
        return self.burned >= self.limit


def _set_pdeathsig() -> None:
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass                            # not Linux: the parent pid check below remains


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description="gesmas runaway watchdog (started by a replica)")
    p.add_argument("--data-dir", required=True)
    p.add_argument("--limit", type=float, required=True)
    p.add_argument("--poll", type=float, default=0.25)
    p.add_argument("--node", type=int, default=0)
    p.add_argument("--log-format", default="text")
    args = p.parse_args(argv)
    # A Ctrl-C reaches the whole process group: the replica decides when to stop, and this
    # process ends with it (the loop below, and the parent-death signal)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _set_pdeathsig()
    try:
        from gesmas.server import logs
        logs.setup(args.node, "WARNING", args.log_format)
    except Exception:
        logging.basicConfig(level=logging.WARNING)
    page = _map(os.path.join(args.data_dir, PAGE_NAME))
    magic, pid = _HEAD.unpack_from(page, 0)
    if magic != MAGIC or pid != os.getppid():
        log.error("runaway watchdog: %s is not its replica's page; exiting", args.data_dir)
        return 1
    _U64.pack_into(page, _WATCHDOG_PID_AT, os.getpid())
    if pid == 1:
        log.warning("runaway watchdog: the replica is PID 1 of its PID namespace, which "
                    "ignores SIGKILL from inside it: run it under an init (tini, docker "
                    "--init) or a runaway entry cannot be stopped")
    watch = Watch(args.limit, lambda tid: thread_cpu(pid, tid))
    polls = 0
    while os.getppid() == pid:
        time.sleep(args.poll)
        polls += 1
        _U64.pack_into(page, _POLLS_AT, polls)
        seq, index, tid, crc, flags = _BEGIN.unpack_from(page, 16)
        if not watch.step(seq, index, tid, flags):
            continue
        if _BEGIN.unpack_from(page, 16)[:2] != (seq, index):
            continue                    # it ended just now
        write_record(args.data_dir, Record(index, crc, args.limit), watch.burned)
        log.critical("log entry %d has burned %.1f s of CPU on the apply thread (runaway "
                     "limit %g s): killing replica pid %d. Restarted, it holds the entry back "
                     "and the cluster aborts it (README 'A call that runs away')",
                     index, watch.burned, args.limit, pid)
        os.kill(pid, signal.SIGKILL)
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())

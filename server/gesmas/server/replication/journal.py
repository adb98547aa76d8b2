"""A durable Raft journal for pysyncobj (group commit, torn-tail recovery, durable term/vote).

Theory of operation
-------------------
pysyncobj 0.3.17's ``FileJournal`` writes log records into an mmap and never msyncs/fsyncs
them; its meta file (term, vote, commit index) is replaced with a rename and no fsync
(upstream #84, #201; PRs #98/#202). Its compaction (``deleteEntriesTo``) rewrites the live
file in place, so a crash in the middle leaves a truncated log. This journal replaces it.

* ``add()`` only appends the record to an in-memory buffer (and to the list pysyncobj reads).
  Nothing reaches the file until a sync writes the buffer and fsyncs once: group commit.
  Because unsynced records exist only in this process, a ``kill -9`` loses exactly what was
  never synced -- the whole-cluster kill test therefore really checks that nothing is
  acknowledged before its sync (see ``replication._DurableTransport``, which holds every
  outgoing message that claims durable state until the sync that covers it is done).
* The sync runs on a thread of its own (the syncer), never on the tick thread: ``start_sync()``
  hands it the buffered records (``written_seq`` numbers each hand-over) and returns; the
  syncer writes them, fsyncs, then publishes ``durable_seq`` and ``durable_index`` and calls
  ``on_durable`` (which wakes the tick thread). One sync at a time; what is added meanwhile
  goes with the next one. A disk that stalls for a second stalls the syncer, not Raft: the
  tick thread goes on sending heartbeats and reading messages, so no election follows (with
  the fsync on the tick thread, three 1 s stalls of the disk the replicas share raised a
  local cluster's term 1 -> 3, measured: docs/performance.md).
  ``sync()`` still does it all at once on the caller's thread (meta file, tests).
* ``setCurrentTerm()`` syncs the log, then writes the meta file atomically (tmp + fsync +
  rename + fsync of the directory) before returning, i.e. before pysyncobj sends the vote
  request or the vote it reflects.
* Truncation (``deleteEntriesFrom``) is an ``ftruncate``; it becomes durable with the next
  sync, which always precedes any message that depends on it. It, ``clear()`` and the meta
  file first wait for the syncer's jobs (``_idle()``), so the syncer never writes to a file,
  or at an offset, that changed under it.
* Compaction (``deleteEntriesTo``) writes the kept suffix to a new file and renames it over
  the old one: the file is always either the old or the new log. It first fsyncs the directory
  so the snapshot pysyncobj has just renamed into place is durable before log entries go.
  The list pysyncobj reads changes at once; the files are the syncer's next job (queued
  behind a sync under way), which copies the kept records from the old file and adds the
  buffered ones: the tick thread neither encodes nor writes nor fsyncs a compaction. Until
  the job is done the old file holds every kept entry and more, which a restart reads as
  after a crash between the snapshot and the compaction (``Replica._align_journal``).
* Records carry a CRC; on open, a torn or corrupt tail (power loss mid-write) is cut off.

Record format (little endian): ``u32 len(command) | u32 crc32 | u64 index | u64 term |
command``; the CRC covers index, term and command. The file starts with ``MAGIC``.

``fsync=False`` (``--unsafe-no-fsync``) keeps every write and ordering rule and skips only the
fsync calls: data then survives a process crash but not an OS crash or power loss.

``marked`` indexes the entries whose command contains ``mark`` (the replication layer's own
entries, applier.py ``ABORT_PREFIX``): they are few, and the replica looks ahead for them.

Threading: every mutating method runs on pysyncobj's tick thread; the syncer only writes what
it was handed, at the offset it was given, and fsyncs (``_lock`` guards the hand-over and the
durable marks). Readers on other threads (status) only take ``len()``.

Test-only failpoint: with ``GESMAS_FAILPOINT_FSYNC_STALL`` naming a file, every fsync of the
journal first sleeps until the wall-clock time written in that file (a disk that stalls).
"""
from __future__ import annotations

import collections
import fcntl
import logging
import os
import struct
import threading
import time
import zlib
from typing import Any, Deque, Dict, List, Optional, Tuple

from pysyncobj.journal import Journal

from .syncer import Syncer

log = logging.getLogger(__name__)

MAGIC = b"GESMASJ1"
META_MAGIC = b"GESMASM1"
_REC = struct.Struct("<IIQQ")  # len(command), crc32, index, term
_META = struct.Struct("<IQQI")  # crc32, term, commit index, len(votedFor)
LOG_NAME = "raft.log"
META_NAME = "raft.meta"
LOCK_NAME = "LOCK"
#: test-only failpoint (module docstring)
FAILPOINT_FSYNC_STALL = "GESMAS_FAILPOINT_FSYNC_STALL"

Entry = Tuple[bytes, int, int]  # (command, index, term), the shape pysyncobj uses


class JournalError(RuntimeError):
    """The journal cannot keep its invariants (a bug, or a damaged data directory)."""


def _crc(idx: int, term: int, command: bytes) -> int:
    return zlib.crc32(command, zlib.crc32(struct.pack("<QQ", idx, term)))


def _encode(command: bytes, idx: int, term: int) -> bytes:
    return _REC.pack(len(command), _crc(idx, term, command), idx, term) + command


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _stall(path: str) -> None:
    """The fsync failpoint: sleep until the time written in `path`, if any."""
    try:
        with open(path) as f:
            until = float(f.read() or 0)
    except (OSError, ValueError):
        return
    if until > time.time():
        time.sleep(until - time.time())


class DurableJournal(Syncer, Journal):
    """pysyncobj ``Journal`` that fsyncs in groups; see the module docstring."""

    def __init__(self, directory: str, fsync: bool = True,
                 mark: Optional[bytes] = None) -> None:
        self.directory = directory
        self.fsync_enabled = fsync
        self.mark = mark
        self.marked: Dict[int, bytes] = {}  # index -> command, for commands containing mark
        self._path = os.path.join(directory, LOG_NAME)
        self._meta_path = os.path.join(directory, META_NAME)
        os.makedirs(directory, exist_ok=True)
        self._lock_fd = os.open(os.path.join(directory, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._lock_fd)
            raise JournalError(f"{directory} is in use by another replica") from None
        self._entries: List[Entry] = []
        self._offsets: List[int] = []  # file offset of each entry's record
        self._pending = bytearray()  # encoded records not yet written
        self._written_end = len(MAGIC)  # bytes of the file that hold valid data
        self._end = len(MAGIC)  # logical end, including _pending
        self._needs_fsync = False
        self._term, self._commit = 0, 1
        self._voted_for: Optional[str] = None
        self._meta_dirty = False
        self.syncs = 0  # statistics: number of sync() calls that wrote or fsynced
        self.on_sync: Any = None  # called with the seconds each sync() took (metrics)
        self.synced_records = 0  # records made durable by those syncs
        self._pending_records = 0
        # the syncer (module docstring): hand-overs numbered by written_seq; durable_seq and
        # durable_index say what the last finished sync made durable
        self._lock = threading.Condition()
        self.written_seq = 0
        self.durable_seq = 0
        self.durable_index = 0
        # jobs in order: ("sync", fd, offset, records' bytes, written_seq, last index, records,
        # meta file or None) or ("compact", copy from, copy to, buffered bytes, written_seq,
        # last index, records, None)
        self._jobs: Deque[Tuple[Any, ...]] = collections.deque()
        self._meta_due = False          # the syncer writes the meta file with its next sync
        self._busy = False              # a job handed over and not finished (or queued)
        self._waiters = 0               # threads in wait_synced (they need no on_durable)
        self._syncer: Optional[threading.Thread] = None
        self._closing = False
        self.failure: Optional[OSError] = None   # an OSError of the syncer's write or fsync
        self.on_durable: Any = None     # called by the syncer after each sync (wakes Raft)
        self._stall_file = os.environ.get(FAILPOINT_FSYNC_STALL) or None
        try:
            self._load_meta()
            self._fd = self._open_log()
        except BaseException:              # refused (corrupt, newer format): unlock the dir
            os.close(self._lock_fd)
            raise

    # ----------------------------------------------------------------- loading
    def _open_log(self) -> int:
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
        data = b""
        with open(fd, "rb", closefd=False) as f:
            data = f.read()
        if not data:
            _write_all(fd, MAGIC)
            self._fsync(fd)
            if self.fsync_enabled:
                fsync_dir(self.directory)
            return fd
        if not data.startswith(MAGIC):
            os.close(fd)
            if data.startswith(MAGIC[:-1]):
                raise JournalError(
                    f"{self._path}: journal format {data[len(MAGIC) - 1:len(MAGIC)]!r} is not "
                    f"the one this gesmas reads ({MAGIC[-1:]!r}): run the gesmas version that "
                    "wrote it, or a newer one")
            raise JournalError(f"{self._path}: not a gesmas journal")
        pos = len(MAGIC)
        while pos + _REC.size <= len(data):
            n, crc, idx, term = _REC.unpack_from(data, pos)
            end = pos + _REC.size + n
            if end > len(data):
                break
            command = bytes(data[pos + _REC.size:end])
            if _crc(idx, term, command) != crc:
                break
            if self._entries and idx != self._entries[-1][1] + 1:
                break
            self._entries.append((command, idx, term))
            self._offsets.append(pos)
            if self.mark is not None and self.mark in command:
                self.marked[idx] = command
            pos = end
        if pos != len(data):
            log.warning("%s: dropping %d bytes of torn/corrupt tail after index %s",
                        self._path, len(data) - pos,
                        self._entries[-1][1] if self._entries else None)
            os.ftruncate(fd, pos)
            self._fsync(fd)
        self._written_end = self._end = pos
        self.durable_index = self._entries[-1][1] if self._entries else 0
        os.lseek(fd, pos, os.SEEK_SET)
        return fd

    def _load_meta(self) -> None:
        try:
            with open(self._meta_path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return
        body = raw[len(META_MAGIC):]
        if not raw.startswith(META_MAGIC) or len(body) < _META.size:
            raise JournalError(f"{self._meta_path}: damaged")
        crc, term, commit, n = _META.unpack_from(body)
        voted = body[_META.size:_META.size + n]
        if zlib.crc32(body[4:_META.size + n]) != crc or len(voted) != n:
            raise JournalError(f"{self._meta_path}: damaged (bad checksum)")
        self._term, self._commit = term, commit
        self._voted_for = voted.decode() if n else None

    # ------------------------------------------------------------- durability
    def _fsync(self, fd: int) -> None:
        if self._stall_file is not None:
            _stall(self._stall_file)
        if self.fsync_enabled:
            os.fsync(fd)

    @property
    def dirty(self) -> bool:
        """True while some add/truncate is not yet durable (handed to the syncer or not)."""
        return bool(self._pending) or self._needs_fsync or self._busy

    def sync(self) -> bool:
        """Write buffered records and fsync once, on this thread, after any sync under way.
        Returns True if anything was done."""
        self._idle()
        if not self._pending and not self._needs_fsync:
            return False
        started = time.perf_counter()
        if self._pending:
            os.lseek(self._fd, self._written_end, os.SEEK_SET)
            _write_all(self._fd, bytes(self._pending))
            self._written_end = self._end
            self._pending.clear()
        self._fsync(self._fd)
        self._needs_fsync = False
        with self._lock:
            self.written_seq += 1
            self.durable_seq = self.written_seq
            self.durable_index = self.last_index or 0
        self._synced(self._pending_records, time.perf_counter() - started)
        self._pending_records = 0
        return True

    def _synced(self, records: int, seconds: float) -> None:
        self.syncs += 1
        self.synced_records += records
        if self.on_sync is not None:
            self.on_sync(seconds)

    # -- the syncer -------------------------------------------------------------------
    def start_sync(self) -> int:
        """Hand what is not durable yet to the syncer, unless a sync is under way (what is
        added meanwhile goes with the next one). Returns the ``written_seq`` whose end makes
        everything added so far durable: a message claiming that state waits for
        ``durable_seq`` to reach it. Tick thread only."""
        if self.failure is not None:
            raise self.failure
        if not self._pending and not self._needs_fsync and not self._meta_due:
            return self.written_seq          # durable, or covered by the sync under way
        if self._busy:
            return self.written_seq + (1 if self._pending or self._needs_fsync else 0)
        meta = None
        if self._meta_due:
            # never ahead of the durable log: at most the last entry this sync makes durable
            meta = self._meta_bytes(min(self._commit, self.last_index or 0))
            self._meta_due = self._meta_dirty = False
        data = bytes(self._pending)
        self._pending.clear()
        offset, self._written_end = self._written_end, self._end
        self._needs_fsync = False
        self._hand_over(("sync", self._fd, offset, data), meta)
        return self.written_seq

    def _compact(self, start: int, stop: int, tail: bytes) -> None:
        """The syncer's part of a compaction: a new file of MAGIC, the old file's bytes
        [start, stop) and `tail` (records not written yet), fsynced and renamed over the
        old one, which it then replaces as the file later syncs append to."""
        if self.fsync_enabled:
            fsync_dir(self.directory)  # make the snapshot's rename durable first
        tmp = self._path + ".tmp"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_all(fd, MAGIC)
            while start < stop:
                chunk = os.pread(self._fd, min(stop - start, 1 << 20), start)
                if not chunk:
                    raise OSError(f"{self._path}: shorter than its records ({start} < {stop})")
                _write_all(fd, chunk)
                start += len(chunk)
            _write_all(fd, tail)
            self._fsync(fd)
            os.replace(tmp, self._path)
            if self.fsync_enabled:
                fsync_dir(self.directory)
        except BaseException:
            os.close(fd)
            raise
        with self._lock:
            old, self._fd = self._fd, fd
        os.close(old)

    @property
    def size(self) -> int:
        """Bytes of the journal file, buffered records included."""
        return self._end

    def files_size(self) -> int:
        """Bytes of the whole journal: the log file (buffered records included, a compaction's
        new file while it is written too) and the meta file. Read on any thread (a stat of
        each file; a file that is not there counts 0)."""
        total = self._end
        for path in (self._meta_path, self._path + ".tmp"):
            try:
                total += os.stat(path).st_size
            except OSError:
                pass
        return total

    def _store_meta(self) -> None:
        """Term, vote and commit index durable now, on this thread (a vote waits for it)."""
        self.sync()  # the stored commit index never runs ahead of the durable log
        self._write_meta(self._meta_bytes(self._commit))
        self._meta_dirty = False

    def _meta_bytes(self, commit: int) -> bytes:
        voted = (self._voted_for or "").encode()
        body = _META.pack(0, self._term, commit, len(voted))[4:] + voted
        return META_MAGIC + struct.pack("<I", zlib.crc32(body)) + body

    def _write_meta(self, raw: bytes) -> None:
        tmp = self._meta_path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(raw)
            f.flush()
            self._fsync(f.fileno())
        os.replace(tmp, self._meta_path)
        if self.fsync_enabled:
            fsync_dir(self.directory)

    # ------------------------------------------------------- pysyncobj Journal
    def add(self, command, idx, term):
        if isinstance(command, str):
            command = command.encode()
        if self._entries and idx != self._entries[-1][1] + 1:
            raise JournalError(f"non-contiguous append: {idx} after {self._entries[-1][1]}")
        rec = _encode(command, idx, term)
        self._entries.append((command, idx, term))
        if self.mark is not None and self.mark in command:
            self.marked[idx] = command
        self._offsets.append(self._end)
        self._pending += rec
        self._pending_records += 1
        self._end += len(rec)

    def clear(self):
        self._idle()
        self._entries, self._offsets = [], []
        self.marked.clear()
        self._pending.clear()
        self._pending_records = 0
        os.ftruncate(self._fd, len(MAGIC))
        self._written_end = self._end = len(MAGIC)
        self._needs_fsync = True
        self.durable_index = 0

    def deleteEntriesFrom(self, entryFrom):
        """Drop list positions >= entryFrom (pysyncobj passes positions, not Raft indexes)."""
        if entryFrom < 0 or entryFrom >= len(self._entries):
            return
        self._idle()
        cut = self._offsets[entryFrom]
        removed = len(self._entries) - entryFrom
        if self.marked:
            first_cut = self._entries[entryFrom][1]
            self.marked = {i: c for i, c in self.marked.items() if i < first_cut}
        del self._entries[entryFrom:]
        del self._offsets[entryFrom:]
        if cut >= self._written_end:
            del self._pending[cut - self._written_end:]
            self._pending_records = max(0, self._pending_records - removed)
        else:
            self._pending.clear()
            self._pending_records = 0
            os.ftruncate(self._fd, cut)
            self._written_end = cut
            self._needs_fsync = True
        self._end = cut
        self.durable_index = min(self.durable_index, self.last_index or 0)

    def deleteEntriesTo(self, entryTo):
        """Compaction: keep list positions >= entryTo. The list changes now; the new file is
        the syncer's (``_compact``: write-new-file-and-rename)."""
        if entryTo <= 0:
            return
        if self.failure is not None:
            raise self.failure
        kept = self._entries[entryTo:]
        if self.marked:
            first_kept = kept[0][1] if kept else self._entries[-1][1] + 1
            self.marked = {i: c for i, c in self.marked.items() if i >= first_kept}
        start = self._offsets[entryTo] if kept else self._end
        # kept records already handed to the syncer are copied from the old file (a sync under
        # way writes them first: jobs run in order); the buffered ones go with the job
        copy_to = max(start, self._written_end)
        tail = bytes(self._pending[copy_to - self._written_end:])
        shift = start - len(MAGIC)
        self._entries = list(kept)
        self._offsets = [o - shift for o in self._offsets[entryTo:]]
        self._pending.clear()
        self._written_end = self._end = self._end - shift
        self._needs_fsync = False
        self._hand_over(("compact", start, copy_to, tail))

    def __getitem__(self, item):
        return self._entries[item]

    def __len__(self):
        return len(self._entries)

    def _destroy(self):
        if self._fd < 0:
            return
        try:
            self._store_meta()
        finally:
            self._stop_syncer()
            os.close(self._fd)
            self._fd = -1  # closed
            os.close(self._lock_fd)  # releases the flock

    def setRaftCommitIndex(self, raftCommitIndex):
        if raftCommitIndex != self._commit:
            self._commit = raftCommitIndex
            self._meta_dirty = True

    def getRaftCommitIndex(self):
        return self._commit

    def setCurrentTerm(self, term, votedForNodeId):
        self._term, self._voted_for = term, votedForNodeId
        self._store_meta()  # durable before pysyncobj sends anything reflecting it

    def getCurrentTerm(self):
        return self._term

    def getVotedForNodeId(self):
        return self._voted_for

    def onOneSecondTimer(self):
        # the commit index, once a second: the syncer writes it after its next sync (a file
        # written, fsynced and renamed on the tick thread stalled Raft with the disk)
        if self._meta_dirty:
            self._meta_due = True

    # ------------------------------------------------------ gesmas helpers
    @property
    def first_index(self) -> Optional[int]:
        return self._entries[0][1] if self._entries else None

    @property
    def last_index(self) -> Optional[int]:
        return self._entries[-1][1] if self._entries else None

    def term_at(self, idx: int) -> Optional[int]:
        """Term of the entry at Raft index ``idx``, or None if not in the journal."""
        if not self._entries:
            return None
        pos = idx - self._entries[0][1]
        if 0 <= pos < len(self._entries):
            return self._entries[pos][2]
        return None

    def entry_at(self, idx: int) -> Optional[Entry]:
        if not self._entries:
            return None
        pos = idx - self._entries[0][1]
        return self._entries[pos] if 0 <= pos < len(self._entries) else None

"""Snapshot files written beside Raft, not on its thread (override 13).

pysyncobj takes a snapshot (log compaction) on its tick thread: with a custom serializer it
calls it there, waits for it, and renames the file into place. Heartbeats, votes and the
applying of entries all wait meanwhile, and a snapshot holds the whole state machine's last
checkpoint: at 10^5 objects ~10 MB pickled, written and fsynced, at 10^6 ten times that.
Past the election timeout the followers start an election against a healthy leader.

`BackgroundSerializer` replaces pysyncobj's `Serializer` (same interface). On the tick
thread it only gathers what the snapshot holds (`prepare`: references to immutable bytes
and a copy of the commands list, cheap); a thread of its own pickles, writes and fsyncs it
(`write`) and renames it into place. `checkSerializing` answers SERIALIZING until then, as
pysyncobj's forking serializer does, so the log is compacted (`__deleteEntriesTo`, which
fsyncs the directory first) only after the file is durable, and no snapshot is sent to a
follower from a file being replaced.

Written to disk a megabyte at a time (`PacedFile`, `SYNC_EVERY`). A snapshot written whole and
then fsynced (105 MB at 10^6 objects) makes the filesystem write it all back at once, and on
ext4 a journal's small fsync waits behind that writeback: 50-70 ms for 100 MB, 22 ms for 30 MB
(measured on this host, a thread fsyncing 200-byte appends while another writes the file;
docs/performance.md), and a commit waits for the leader's journal fsync. Synced a megabyte
at a time, the journal's fsync waited at most 2 ms, and the file took as long to write. A
snapshot received from the leader is synced likewise, chunk by chunk as it arrives (all
the replicas of a local cluster share one disk).

Written over the blocks of the snapshot before last (`SPARE`, `written_over`). A snapshot
that replaces the last one frees its blocks, and on a filesystem mounted with `discard`
(this host's ext4) they are trimmed at the journal's next commit, which the journal's fsyncs
wait for: 15-32 ms after each 100 MB snapshot installed (bench/writeback_bench.py
--install), 170-190 ms seen in the 10^6 benchmark. So the file a snapshot replaces is kept
under a second name, and the next snapshot is written over it, in place, cut to its length
at the end: nothing is freed but a shorter tail, at the cost of a second snapshot's size on
disk. A spare that is still a second name of the snapshot in place (a crash between the
link and the rename) is dropped, never written over.

Sent to a follower from the file, a chunk at a time as it goes out (`Chunk`). pysyncobj's
leader reads a follower's whole snapshot in its first rounds of sending, and the transport
holds what it cannot send yet in the node's backlog (paced at 40 MB/s: ~2.6 s for 105 MB at
10^6 objects), so the leader held the snapshot's size in memory for each follower it sent it
to. A chunk is now the place of its bytes in the file (`_Source`, kept open while a chunk or
the transfer needs it), read by the transport when it frames the chunk. The file is not
changed under it: the snapshot in place is only ever renamed away, and the spare, written
over by the next snapshot, is not written over while a chunk of it may still be read (a new
file is written instead).

A snapshot received from the leader while one is being written wins: the writer's job is
cancelled under `_lock` before the received file is installed, so the older snapshot is
never renamed over the newer one, and the cancelled job reports NOT_SERIALIZING (nothing was
compacted) instead of SUCCESS.
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import weakref
from typing import Any, Callable, Iterator, Optional, Tuple

from pysyncobj.atomic_replace import atomicReplace
from pysyncobj.config import SERIALIZER_STATE
from pysyncobj.serializer import Serializer

log = logging.getLogger(__name__)

_BUSY = -3      # the parent's private "pid" while a job runs (getTransmissionData waits)


#: bytes of a snapshot written between two syncs (module docstring)
SYNC_EVERY = 1 << 20


class PacedFile:
    """A binary file open for writing whose data is synced to disk every SYNC_EVERY bytes
    (fdatasync), so that the sync at its end has little left to write back (module
    docstring). `sync`: False writes without syncing (--unsafe-no-fsync)."""

    def __init__(self, f: Any, sync: bool) -> None:
        self.f = f
        self.sync = sync
        self.unsynced = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        n, pos = len(view), 0
        while pos < n:
            part = view[pos:pos + SYNC_EVERY - self.unsynced]
            self.f.write(part)
            pos += len(part)
            self.unsynced += len(part)
            if self.unsynced >= SYNC_EVERY:
                self.flush_to_disk()
        return n

    def flush_to_disk(self) -> None:
        self.f.flush()
        if self.sync:
            os.fdatasync(self.f.fileno())
        self.unsynced = 0


@contextlib.contextmanager
def written_over(path: str, sync: bool) -> Iterator[PacedFile]:
    """`path` open for writing from its start over the blocks it already has (no truncation
    first: module docstring), as a PacedFile; at the end cut to what was written, synced
    and fsynced (unless `sync` is False)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    with os.fdopen(fd, "wb") as f:         # an fd's "wb" does not truncate
        paced = PacedFile(f, sync)
        yield paced
        f.truncate()                       # at what was written: a longer old tail goes
        paced.flush_to_disk()
        if sync:
            os.fsync(f.fileno())


#: the name (after the snapshot's) of the file the last snapshot replaced, which the next
#: one is written over (module docstring)
SPARE = ".spare"


class _Source:
    """A snapshot file open for the chunks of the transfers that send it (module docstring):
    closed once neither a transfer nor a chunk waiting to be sent holds it."""

    __slots__ = ("fd", "ino", "size", "__weakref__")

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_RDONLY)
        weakref.finalize(self, os.close, self.fd)
        st = os.fstat(self.fd)
        self.ino = (st.st_dev, st.st_ino)
        self.size = st.st_size


class Chunk:
    """``size`` bytes of a snapshot file at ``offset``: what pysyncobj's leader sends as a
    chunk's data, read (``read``) when the transport frames it (module docstring)."""

    __slots__ = ("source", "offset", "size")

    def __init__(self, source: _Source, offset: int, size: int) -> None:
        self.source = source
        self.offset = offset
        self.size = size

    def __len__(self) -> int:
        return self.size

    def read(self) -> bytes:
        """The chunk's bytes; OSError if the file cannot give them all."""
        parts, at, left = [], self.offset, self.size
        while left:
            part = os.pread(self.source.fd, left, at)
            if not part:
                raise OSError(f"the snapshot file ends at {at}, before its chunk's end "
                              f"({self.offset + self.size})")
            parts.append(part)
            at += len(part)
            left -= len(part)
        return b"".join(parts)


class _Job:
    __slots__ = ("id", "done", "result", "cancelled")

    def __init__(self, id: int) -> None:
        self.id = id
        self.done = threading.Event()
        self.result = SERIALIZER_STATE.FAILED
        self.cancelled = False


class BackgroundSerializer(Serializer):
    """pysyncobj's Serializer for a file, writing on a thread (module docstring).

    ``prepare(raft_data)`` runs on the tick thread and returns what ``write(path, payload)``
    writes (fsynced) on the writer thread; ``deserializer(path)`` is pysyncobj's."""

    def __init__(self, file_name: str, batch_size: int,
                 prepare: Callable[[Any], Any], write: Callable[[str, Any], None],
                 deserializer: Callable[[str], Any], sync: bool = True) -> None:
        super().__init__(file_name, batch_size, False, write, deserializer, None)
        self._file = file_name
        self._spare = file_name + SPARE
        self._sync = sync                # received chunks synced as they come (docstring)
        self._prepare = prepare
        self._write = write
        self._lock = threading.Lock()
        self._job: Optional[_Job] = None
        self.written = 0                 # snapshots written and renamed into place
        self.last_seconds = 0.0          # how long the last one took on its thread
        self._sources: "weakref.WeakSet[_Source]" = weakref.WeakSet()   # under _lock

    # -- taking a snapshot (tick thread) --------------------------------------------------

    def serialize(self, data: Any, id: int) -> None:
        if self._job is not None:
            return
        self._Serializer__currentID = id
        job = self._job = _Job(id)
        self._Serializer__pid = _BUSY
        try:
            payload = self._prepare(data[1:])
        except BaseException:
            log.exception("snapshot at index %d not taken", id)
            job.done.set()
            return
        threading.Thread(target=self._run, args=(job, payload), daemon=True,
                         name=f"gesmas-snapshot-{id}").start()

    def _run(self, job: _Job, payload: Any) -> None:
        started = time.monotonic()
        tmp = self._file + ".tmp"
        try:
            with self._lock:
                read = {source.ino for source in self._sources}
            take_spare(self._spare, tmp, read)
            self._write(tmp, payload)
            with self._lock:
                if job.cancelled:
                    _move(tmp, self._spare)      # kept to be written over next time
                    return
                keep_previous(self._file, self._spare)
                atomicReplace(tmp, self._file)
            job.result = SERIALIZER_STATE.SUCCESS
            self.written += 1
            self.last_seconds = time.monotonic() - started
        except BaseException:
            log.exception("writing the snapshot at index %d failed", job.id)
        finally:
            job.done.set()

    def checkSerializing(self) -> Tuple[int, int]:
        job = self._job
        if job is None:
            return SERIALIZER_STATE.NOT_SERIALIZING, self._Serializer__currentID
        if not job.done.is_set():
            return SERIALIZER_STATE.SERIALIZING, job.id
        self._job = None
        self._Serializer__pid = 0
        if job.cancelled:
            return SERIALIZER_STATE.NOT_SERIALIZING, job.id
        self._Serializer__transmissions: dict = {}
        return job.result, job.id

    def under_way(self) -> Optional[str]:
        """Where the snapshot this serializer was last asked for stands until
        `checkSerializing` reads its end: None (none), "writing", "replaced" (a snapshot
        received from the leader cancelled it) or "ended" (written, or failed)."""
        job = self._job
        if job is None:
            return None
        if not job.done.is_set():
            return "writing"
        return "replaced" if job.cancelled else "ended"

    def sending_paused(self) -> bool:
        """Whether ``getTransmissionData`` gives no chunk now: a snapshot is being written
        (until ``checkSerializing`` reads its end) or there is none to send
        (``_RaftNode._gesmas_hold_snapshot_sends``, override 24)."""
        return self._Serializer__pid != 0 or not os.path.exists(self._file)

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Wait for the snapshot being written, if any (tests, shutdown)."""
        job = self._job
        return job is None or job.done.wait(timeout)

    # -- a snapshot to a follower (tick thread) -------------------------------------------

    def getTransmissionData(self, transmissionID: Any) -> Any:
        """pysyncobj's next chunk for a follower, (data, is_first, is_last), the last one
        empty; None while a snapshot is being written (or none can be opened). The data is
        a `Chunk`, read when it is sent (module docstring)."""
        if self._Serializer__pid != 0:
            return None
        transmissions = self._Serializer__transmissions
        transmission = transmissions.get(transmissionID)
        if transmission is None:
            try:
                source = _Source(self._file)
            except OSError:
                log.exception("the snapshot cannot be opened to be sent")
                return None
            with self._lock:
                self._sources.add(source)
            transmission = transmissions[transmissionID] = {"source": source, "transmitted": 0}
        source, at = transmission["source"], transmission["transmitted"]
        size = min(self._Serializer__transmissionBatchSize, source.size - at)
        transmission["transmitted"] = at + size
        if size == 0:
            del transmissions[transmissionID]
        return Chunk(source, at, size), at == 0, size == 0

    # -- a snapshot from the leader (tick thread) -----------------------------------------

    def setTransmissionData(self, data: Any) -> bool:
        if data is not None and data[2]:                 # the last chunk: it is installed now
            with self._lock:
                job = self._job
                if job is not None:
                    job.cancelled = True
        done = bool(super().setTransmissionData(data))
        incoming = self._Serializer__incomingTransmissionFile
        if self._sync and hasattr(incoming, "fileno") and not done:   # a chunk written to it
            try:
                incoming.flush()
                os.fdatasync(incoming.fileno())
            except OSError:    # the load's fsync of the whole file says whether it is durable
                log.warning("syncing a received snapshot chunk failed", exc_info=True)
        return done


def take_spare(spare: str, tmp: str, read: Any = frozenset()) -> None:
    """Make the spare (if any) the file the next snapshot is written over (`tmp`, which may
    also be left from a write a crash cut short). A file that has another name besides
    `tmp` is never written over: the spare can be a second name of the snapshot in place
    (a crash between `keep_previous`'s link and the rename), so that name is dropped. Nor
    is one whose (device, inode) is in `read`: chunks of it may still be read to be sent."""
    _move(spare, tmp)
    try:
        st = os.stat(tmp)
        if st.st_nlink > 1 or (st.st_dev, st.st_ino) in read:
            os.unlink(tmp)
    except FileNotFoundError:
        pass


def keep_previous(path: str, spare: str) -> None:
    """Keep the snapshot about to be replaced (`path`) as the spare: a second name, which
    the rename that replaces it leaves holding its blocks. Without one (the first snapshot)
    or on a filesystem without hard links, the replaced file is freed, as it was before."""
    _remove(spare)
    try:
        os.link(path, spare)
    except FileNotFoundError:
        pass
    except OSError as e:
        log.debug("the replaced snapshot is not kept to be written over: %s", e)


def _move(src: str, dst: str) -> None:
    try:
        os.replace(src, dst)
    except FileNotFoundError:
        pass


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass

"""The journal's sync thread (DurableJournal's syncer; journal.py explains why it exists).

``Syncer`` is a mixin of ``DurableJournal``: its jobs run one after the other on one thread,
in the order the tick thread queued them (``_hand_over``), and each publishes what it made
durable (``durable_seq``, ``durable_index``) under ``_lock``. The host class provides the
state (``_lock``, ``_jobs``, ``_busy``, ``_waiters``, ``_syncer``, ``_closing``,
``failure``, ``on_durable``, ``written_seq``, ``last_index``, ``_pending_records``) and the
file work (``_fsync``, ``_compact``, ``_write_meta``, ``_synced``).
"""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Deque, Optional, Tuple

log = logging.getLogger("gesmas.server.replication.journal")


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


class Syncer:
    """The syncer's methods (module docstring)."""

    # the host's state (DurableJournal.__init__)
    directory: str
    _lock: threading.Condition
    _jobs: Deque[Tuple[Any, ...]]
    _busy: bool
    _waiters: int
    _syncer: Optional[threading.Thread]
    _closing: bool
    failure: Optional[OSError]
    on_durable: Any
    written_seq: int
    durable_seq: int
    durable_index: int
    _pending_records: int

    # the host's file work
    @property
    def last_index(self) -> Optional[int]:
        raise NotImplementedError

    def _fsync(self, fd: int) -> None:
        raise NotImplementedError

    def _compact(self, start: int, stop: int, tail: bytes) -> None:
        raise NotImplementedError

    def _write_meta(self, raw: bytes) -> None:
        raise NotImplementedError

    def _synced(self, records: int, seconds: float) -> None:
        raise NotImplementedError

    def _hand_over(self, job: Tuple[Any, ...], meta: Optional[bytes] = None) -> None:
        """Queue `job` for the syncer with the next written_seq, covering every record added
        so far (tick thread)."""
        with self._lock:
            self.written_seq += 1
            self._jobs.append(job + (self.written_seq, self.last_index or 0,
                                     self._pending_records, meta))
            self._pending_records = 0
            self._busy = True
            if self._syncer is None:
                self._syncer = threading.Thread(target=self._sync_loop, daemon=True,
                                                name=f"gesmas-journal-sync {self.directory}")
                self._syncer.start()
            self._lock.notify_all()

    def _persist(self, fd: int, offset: int, data: bytes) -> None:
        """What the syncer does with a hand-over (tests slow it down to simulate a disk)."""
        if data:
            _pwrite_all(fd, data, offset)
        self._fsync(fd)

    def _sync_loop(self) -> None:
        while True:
            with self._lock:
                while not self._jobs and not self._closing:
                    self._lock.wait()
                if not self._jobs:
                    return
                job = self._jobs[0]
            kind, a, b, data, seq, last, records, meta = job
            started = time.perf_counter()
            try:
                if kind == "sync":
                    self._persist(a, b, data)
                else:
                    self._compact(a, b, data)
                if meta is not None:
                    self._write_meta(meta)
            except OSError as exc:
                # the kernel may have dropped the dirty pages: nothing held may go out
                with self._lock:
                    self.failure = exc
                    self._jobs.clear()
                    self._busy = False
                    self._lock.notify_all()
                log.critical("journal write/fsync failed in %s: %s", self.directory, exc)
                self._wake()
                return
            with self._lock:
                self.durable_seq, self.durable_index = seq, last
                self._jobs.popleft()
                self._busy = bool(self._jobs)
                self._lock.notify_all()
                waited_for = self._waiters > 0
            self._synced(records, time.perf_counter() - started)
            if not waited_for:       # the tick thread is not in wait_synced: wake its poll
                self._wake()

    def _wake(self) -> None:
        if self.on_durable is not None:
            try:
                self.on_durable()
            except Exception:  # pragma: no cover - a closed notifier at shutdown
                log.debug("on_durable failed", exc_info=True)

    def wait_synced(self, timeout: Optional[float] = None) -> bool:
        """Wait for the sync under way, if any, at most `timeout` seconds (None: for good);
        True if none is under way any more. Raises its failure."""
        if timeout is None:
            self._idle()
            return True
        with self._lock:
            self._waiters += 1
            try:
                self._lock.wait_for(lambda: not self._busy, timeout)
            finally:
                self._waiters -= 1
        if self.failure is not None:
            raise self.failure
        return not self._busy

    def _idle(self) -> None:
        """Wait for the sync under way, if any (before the file or its offsets change)."""
        if not self._busy:
            return
        with self._lock:
            while self._busy:
                self._lock.wait()
        if self.failure is not None:
            raise self.failure

    def _stop_syncer(self) -> None:
        with self._lock:
            self._closing = True
            self._lock.notify_all()
        if self._syncer is not None and self._syncer is not threading.current_thread():
            self._syncer.join()

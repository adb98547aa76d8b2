"""ReadWriteLock: many readers or one writer, phase-fair.

Guarantees
- No writer starvation: once a writer waits, new readers wait behind it.
- No reader starvation: when a writer releases, every reader waiting at that moment is admitted
  together before the next writer.
- Writers are served in arrival order. Holds belong to the session; a session that ends
  releases everything it holds.
"""
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gesmas.server.kernel.dialect import Semaphore, Timeout, SessionEnded, context



class LockNotOwned(RuntimeError):
    """A release by a session that does not hold that side of the lock."""

class ReadWriteLock:
    _restartable = ("acquire_read", "acquire_write")  # waits a checkpoint leaves in place
    _readers = ('state',)  # read-only: served without a log entry
    def __init__(self):
        self._readq = Semaphore(0)
        self._writeq = Semaphore(0)
        self._readers = {}                # session -> read holds (not the class's _readers)
        self._admitted = 0                # read holds granted (including not yet recorded)
        self._writer = None               # session holding the write lock
        self._writing = False             # the write lock is granted (maybe not yet recorded)

    def acquire_read(self):
        if not self._writing and not self._writeq.waiters:
            self._admitted += 1
        else:
            self._readq.acquire()         # the releaser counted us in _admitted
        me = context().session
        self._readers[me] = self._readers.get(me, 0) + 1
        return True

    def release_read(self):
        me = context().session
        held = self._readers.get(me, 0)
        if not held:
            raise LockNotOwned("this session holds no read lock")
        self._drop_reader(me, 1)
        return True

    def acquire_write(self):
        me = context().session
        if self._writer == me:
            raise RuntimeError("this session already holds the write lock")
        if not self._writing and self._admitted == 0 and not self._writeq.waiters:
            self._writing = True
        else:
            try:
                self._writeq.acquire()    # the releaser set _writing for us
            except (Timeout, SessionEnded):
                self._after_writer_left()
                raise
        self._writer = me
        return True

    def release_write(self):
        if self._writer != context().session:
            raise LockNotOwned("this session does not hold the write lock")
        self._writer = None
        self._writing = False
        self._hand_over(readers_first=True)
        return True

    def state(self):
        return {"readers": self._admitted, "writer": self._writer,
                "waiting_readers": self._readq.waiters, "waiting_writers": self._writeq.waiters}

    def _drop_reader(self, session, n):
        left = self._readers.get(session, 0) - n
        if left > 0:
            self._readers[session] = left
        else:
            self._readers.pop(session, None)
        self._admitted -= n
        if self._admitted == 0:
            self._hand_over(readers_first=False)

    def _hand_over(self, readers_first):
        """The lock is free. After a writer: admit the waiting readers, else one writer.
        After the last reader: one waiting writer, else the waiting readers."""
        if self._writing or self._admitted:
            return
        n = self._readq.waiters
        if self._writeq.waiters and not (readers_first and n):
            self._writing = True
            self._writeq.release()
        elif n:
            self._admitted += n
            self._readq.release(n)

    def _after_writer_left(self):
        # A waiting writer gave up: readers held back only because it waited may go now.
        if not self._writing and not self._writeq.waiters and self._readq.waiters:
            n = self._readq.waiters
            self._admitted += n
            self._readq.release(n)

    def _on_session_end(self, session):
        held = self._readers.get(session, 0)
        if held:
            self._drop_reader(session, held)
        if self._writer == session:
            self._writer = None
            self._writing = False
            self._hand_over(readers_first=True)

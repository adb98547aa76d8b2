"""Lock: a mutual-exclusion lock owned by a session, with fencing tokens.

Guarantees
- Fair: waiters are granted in arrival order; a release hands the lock to exactly one waiter.
- Fencing: `acquire` returns the log index of the grant, strictly increasing across grants;
  pass it to the resource you protect so that it can refuse a stale holder.
- Owned by the session: if the holder's session ends (expired or closed), the lock is released
  and the next waiter gets it. A waiter whose session ended is removed before any grant, so
  the lock is never granted to a dead session.
- Optional reentrancy (reentrant=True): the holding session may acquire again; it must release
  as many times. Without it, a second acquire by the holder is an error, not a deadlock.
"""
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gesmas.server.kernel.dialect import Semaphore, context


class LockNotOwned(RuntimeError):
    """release() by a session that does not hold the lock (threading raises RuntimeError
    there too; the client's exception is both ApplicationError and RuntimeError)."""


class Lock:
    _restartable = ("acquire",)  # waits a checkpoint leaves in place
    _parked = ("acquire",)       # waits that hold no greenlet
    _readers = ('holder', 'waiters')  # read-only: served without a log entry
    _constructor_args = ("reentrant",)    # a get-or-create naming another one is refused

    def __init__(self, reentrant=False):
        self.reentrant = bool(reentrant)
        self._gate = Semaphore(1)
        self._owner = None
        self._depth = 0
        self._fence = 0

    def acquire(self):
        """Wait for the lock; returns its fencing token."""
        me = context().session
        if self._owner == me:
            if not self.reentrant:
                raise RuntimeError("this session already holds the lock (not reentrant)")
            self._depth += 1
            return self._fence
        self._gate.acquire()
        self._owner = me
        self._depth = 1
        self._fence = context().index
        return self._fence

    def try_acquire(self):
        """The fencing token if the lock was free, else None, without waiting."""
        me = context().session
        if self._owner == me and self.reentrant:
            self._depth += 1
            return self._fence
        if self._owner is not None or not self._gate.try_acquire():
            return None
        self._owner = me
        self._depth = 1
        self._fence = context().index
        return self._fence

    def release(self):
        if self._owner != context().session:
            raise LockNotOwned("this session does not hold the lock")
        self._depth -= 1
        if self._depth == 0:
            self._owner = None
            self._gate.release()
        return True

    def is_owner(self):
        return self._owner == context().session

    def holder(self):
        """{"session", "fence"} of the current holder, or None."""
        if self._owner is None:
            return None
        return {"session": self._owner, "fence": self._fence}

    def waiters(self):
        return self._gate.waiters

    def _on_session_end(self, session):
        if self._owner == session:
            self._owner = None
            self._depth = 0
            self._gate.release()

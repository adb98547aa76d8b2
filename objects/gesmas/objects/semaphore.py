"""Semaphore: counting permits leased to sessions.

Guarantees
- Fair: waiters get permits in arrival order, one permit per acquire; a release wakes exactly
  one waiter.
- Leases: a permit belongs to the session that took it; only that session can release it, and
  every permit a session holds comes back when the session ends.
"""
from typing import TYPE_CHECKING

# This module's class is also called Semaphore: keep the dialect's primitive under another name.
if TYPE_CHECKING:
    from gesmas.server.kernel.dialect import Semaphore as _Permits
    from gesmas.server.kernel.dialect import context
else:
    _Permits = Semaphore  # noqa: F821  (provided by the dialect)


class Semaphore:
    def __init__(self, permits=1):
        if type(permits) is not int or permits < 1:
            raise ValueError("permits must be a positive int")
        self.permits = permits
        self._free = _Permits(permits)
        self._leases = {}                 # session -> permits held

    def acquire(self):
        """Wait for a permit; returns the number of permits this session now holds."""
        self._free.acquire()
        me = context().session
        self._leases[me] = self._leases.get(me, 0) + 1
        return self._leases[me]

    def try_acquire(self):
        if not self._free.try_acquire():
            return False
        me = context().session
        self._leases[me] = self._leases.get(me, 0) + 1
        return True

    def release(self):
        me = context().session
        held = self._leases.get(me, 0)
        if held == 0:
            raise PermissionError("this session holds no permit")
        if held == 1:
            del self._leases[me]
        else:
            self._leases[me] = held - 1
        self._free.release()
        return True

    def available(self):
        return self._free.value

    def holders(self):
        """{session id as str: permits held}."""
        return {str(s): n for s, n in self._leases.items()}

    def _on_session_end(self, session):
        held = self._leases.pop(session, 0)
        if held:
            self._free.release(held)

"""Semaphore: counting permits, leased to sessions (the default) or unowned like
threading.Semaphore / BoundedSemaphore.

Guarantees
- Fair: waiters get permits in arrival order, one permit per acquire; a release of n permits
  wakes at most n waiters.
- Leases (owned=True, the default): a permit belongs to the session that took it; only that
  session can release it (PermissionError otherwise), and every permit a session holds comes
  back when the session ends.
- Unowned (owned=False): any session may release, as with threading.Semaphore, so one side
  can release what the other acquires (producer/consumer); permits do not come back when a
  session ends. With bounded=True a release that would take the count above the initial
  value is a ValueError and changes nothing, as with threading.BoundedSemaphore.
"""
from typing import TYPE_CHECKING

# This module's class is also called Semaphore: keep the dialect's primitive under another name.
if TYPE_CHECKING:
    from gesmas.server.kernel.dialect import Semaphore as _Permits
    from gesmas.server.kernel.dialect import context
else:
    _Permits = Semaphore  # noqa: F821  (provided by the dialect)


class Semaphore:
    _restartable = ("acquire",)  # waits a checkpoint leaves in place
    _parked = ("acquire",)       # waits that hold no greenlet
    _readers = ('available', 'waiters', 'holders')  # read-only: served without a log entry
    _constructor_args = ("permits", "owned", "bounded")  # a get-or-create naming others: refused
    owned = True                          # class defaults: objects saved before these existed
    bounded = False

    def __init__(self, permits=1, owned=True, bounded=False):
        if type(permits) is not int or permits < 0 or (owned and permits < 1):
            raise ValueError("permits must be an int >= 1 (>= 0 when owned=False)")
        if bounded and owned:
            raise ValueError("bounded=True is for owned=False (an owned semaphore is bounded "
                             "by its leases already)")
        self.permits = permits
        self.owned = bool(owned)
        self.bounded = bool(bounded)
        self._free = _Permits(permits)
        self._leases = {}                 # session -> permits held (owned only)

    def acquire(self):
        """Wait for a permit; returns the number of permits this session now holds (owned),
        or True."""
        self._free.acquire()
        if not self.owned:
            return True
        me = context().session
        self._leases[me] = self._leases.get(me, 0) + 1
        return self._leases[me]

    def try_acquire(self):
        if not self._free.try_acquire():
            return False
        if self.owned:
            me = context().session
            self._leases[me] = self._leases.get(me, 0) + 1
        return True

    def release(self, n=1):
        """Give back n permits (of this session's, when owned)."""
        if type(n) is not int or n < 1:
            raise ValueError("n must be an int >= 1")
        if not self.owned:
            if self.bounded and self._free.value + n > self.permits:
                raise ValueError(f"Semaphore released too many times (bounded: "
                                 f"{self._free.value} + {n} > {self.permits})")
            self._free.release(n)
            return True
        me = context().session
        held = self._leases.get(me, 0)
        if held < n:
            raise PermissionError(f"this session holds {held} permit(s), not {n}")
        if held == n:
            del self._leases[me]
        else:
            self._leases[me] = held - n
        self._free.release(n)
        return True

    def available(self):
        return self._free.value

    def waiters(self):
        return self._free.waiters

    def holders(self):
        """{session id as str: permits held}."""
        return {str(s): n for s, n in self._leases.items()}

    def _on_session_end(self, session):
        if not self.owned:
            return
        held = self._leases.pop(session, 0)
        if held:
            self._free.release(held)

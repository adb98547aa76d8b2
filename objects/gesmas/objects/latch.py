"""CountDownLatch: `wait()` blocks until `count_down()` has been called `count` times.

Guarantees: once the count reaches zero every waiter is released (each wakes once) and later
waits return at once; the latch does not reset. Waiters are released in arrival order.
"""
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gesmas.server.kernel.dialect import Semaphore


class CountDownLatch:
    _restartable = ("wait",)  # waits a checkpoint leaves in place
    _readers = ('count',)  # read-only: served without a log entry
    _constructor_args = (("count", "_initial"),)   # a get-or-create naming another is refused

    def __init__(self, count):
        if type(count) is not int or count < 0:
            raise ValueError("count must be an int >= 0")
        self._initial = count
        self._count = count
        self._gate = Semaphore(0)

    def count_down(self):
        """Decrement the count; returns the count left."""
        if self._count > 0:
            self._count -= 1
            if self._count == 0 and self._gate.waiters:
                self._gate.release(self._gate.waiters)
        return self._count

    def wait(self):
        if self._count > 0:
            self._gate.acquire()
        return True

    def count(self):
        return self._count

"""Barrier (cyclic) and DoubleBarrier (enter / leave, as in ZooKeeper's recipe).

Barrier(parties): threading.Barrier's semantics (and Java's CyclicBarrier's). `wait()` blocks
  until `parties` callers are waiting, then releases them all together and resets for the
  next round. It returns the caller's arrival index in the round (0 for the first). One
  request per party, one wake-up per party: no herd. A party that times out, `abort()`, or a
  waiting party's session ending *breaks* the barrier: every waiter, and every later
  `wait()`, fails with BrokenBarrierError (a RuntimeError) until `reset()`, which also breaks
  the waits of the current round, atomically. `broken()`, `n_waiting()`, `size()` (parties).
DoubleBarrier(parties): `enter()` blocks until `parties` callers have entered, `leave()` blocks
  until every party of the round has called leave. A party whose session ends counts as left.

Both count arrivals with the semaphore's waiter count, so a waiting party has changed nothing
and a checkpoint needs no undo.
"""
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gesmas.server.kernel.dialect import SessionEnded, Semaphore, Timeout, context


class BrokenBarrierError(RuntimeError):
    """The barrier is broken; the client raises it as threading.BrokenBarrierError too."""


class Barrier:
    _restartable = ("wait",)  # waits a checkpoint leaves in place
    _readers = ('broken', 'n_waiting', 'size', 'waiting')  # read-only: served without a log entry
    _constructor_args = ("parties",)      # a get-or-create naming another one is refused
    _broken = False                       # class defaults: barriers saved before they existed
    _gen = 0                              # rounds begun: completed, broken or reset
    _failed = -1                          # the last round that was broken or reset

    def __init__(self, parties):
        if type(parties) is not int or parties < 1:
            raise ValueError("parties must be a positive int")
        self.parties = parties
        self._gate = Semaphore(0)
        self.rounds = 0
        self._handed = 0                  # indices given to the woken parties of the round
        self._broken = False
        self._gen = 0
        self._failed = -1

    def wait(self):
        if self._broken:
            raise BrokenBarrierError("the barrier is broken: reset() it")
        arrived = self._gate.waiters
        if arrived + 1 >= self.parties:
            self.rounds += 1
            self._handed = 0
            self._gen += 1
            if arrived:
                self._gate.release(arrived)
            return arrived
        gen = self._gen                   # a waiting party changes nothing before it waits
        try:
            self._gate.acquire()
        except Timeout:
            self._break()
            raise BrokenBarrierError("wait() timed out: the barrier is now broken")
        except SessionEnded:
            self._break()
            raise
        if self._failed >= gen:
            raise BrokenBarrierError("the barrier was broken or reset while waiting")
        # Woken in arrival order, right after the last party: number the survivors
        index = self._handed
        self._handed += 1
        return index

    def abort(self):
        """Break the barrier: the waiting parties and every later wait() fail until reset()."""
        self._break()
        return True

    def reset(self):
        """Back to a fresh round, atomically: the waiting parties fail with
        BrokenBarrierError, later wait()s count from zero."""
        waiting = self._gate.waiters
        if waiting:
            self._failed = self._gen
            self._gen += 1
            self._gate.release(waiting)
        self._broken = False
        self._handed = 0
        return True

    def broken(self):
        return self._broken

    def n_waiting(self):
        return 0 if self._broken else self._gate.waiters

    def size(self):
        return self.parties

    def waiting(self):
        return self._gate.waiters

    def _break(self):
        self._broken = True
        waiting = self._gate.waiters
        self._failed = self._gen
        self._gen += 1
        if waiting:
            self._gate.release(waiting)


class DoubleBarrier:
    _restartable = ("enter", "leave")  # waits a checkpoint leaves in place
    _readers = ('inside',)  # read-only: served without a log entry
    _constructor_args = ("parties",)      # a get-or-create naming another one is refused

    def __init__(self, parties):
        if type(parties) is not int or parties < 1:
            raise ValueError("parties must be a positive int")
        self.parties = parties
        self._enter = Semaphore(0)
        self._leave = Semaphore(0)
        self._inside = {}                 # session -> parties it has inside

    def enter(self):
        waiting = self._enter.waiters
        if waiting + 1 >= self.parties:
            if waiting:
                self._enter.release(waiting)
        else:
            self._enter.acquire()
        me = context().session
        self._inside[me] = self._inside.get(me, 0) + 1
        return True

    def leave(self):
        me = context().session
        if not self._inside.get(me):
            raise RuntimeError("this session has not entered the barrier")
        waiting = self._leave.waiters
        if waiting + 1 >= self._count():
            if waiting:
                self._leave.release(waiting)
        else:
            self._leave.acquire()
        self._drop(me)
        return True

    def inside(self):
        return self._count()

    def _count(self):
        return sum(self._inside.values())

    def _drop(self, session):
        n = self._inside.get(session, 0)
        if n <= 1:
            self._inside.pop(session, None)
        else:
            self._inside[session] = n - 1

    def _on_session_end(self, session):
        self._inside.pop(session, None)
        waiting = self._leave.waiters
        if waiting and waiting >= self._count():
            self._leave.release(waiting)

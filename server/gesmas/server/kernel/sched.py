"""The one blocking primitive: a FIFO semaphore, and what a running request can see.

Every wait in gesmas goes through `Semaphore.acquire` (P). Invariants, asserted in tests:

  I1. A waiter exists only while the semaphore has no permit: `value > 0` implies no live
      waiter. `release` hands permits to waiters directly, oldest first (no barging).
  I2. `release` (V) never switches coroutines: it moves the woken requests to the tail of the
      kernel's ready queue and returns. The kernel runs them after the current coroutine blocks
      or ends, in that order (GESMAS Algorithm 1).
  I3. A waiter leaves its queue exactly once: granted (by V), timed out (by a command whose time
      passes its deadline), aborted (its session ended, its object was deleted), or interrupted
      (a checkpoint). The last three are delivered as exceptions raised by `acquire`.

A request is a greenlet of class `Task`; it carries the part of its kernel that runs it (a
`Host`: runner.Runner), so this module needs no global state and several kernels can live in
one process. `Host` and `Call` say all that this module needs of the runner and of a request,
so that it imports neither.
"""
from __future__ import annotations

import contextvars
from collections import deque
from typing import Any, Generic, Protocol, TypeVar

import greenlet

_M64 = (1 << 64) - 1

#: True while a checkpoint pickles the kernel. The waiters it leaves in place are written as
#: its pending calls (re-run on restore), so semaphores and sessions then pickle as if nobody
#: waited. A context variable, not a global: kernels in other threads are not affected.
SAVING: contextvars.ContextVar[bool] = contextvars.ContextVar("gesmas_saving", default=False)


# -- exceptions delivered at the blocking point --------------------------------------------------

class WaitError(BaseException):
    """Base of the exceptions `Semaphore.acquire` raises instead of returning. Like trio's
    Cancelled, a BaseException: `except Exception` in object code does not swallow a
    checkpoint's Interrupted or a session's end by accident; catch them by name."""


class Timeout(WaitError):
    """The wait reached its deadline (the call's timeout, or acquire's own)."""


class Aborted(WaitError):
    """The wait was abandoned for good: the caller's session ended or the object was deleted."""


class SessionEnded(Aborted):
    """The calling session expired or was closed while waiting."""


class Interrupted(WaitError):
    """A checkpoint interrupts every waiter; the request is re-run right after, in the same
    order. A method that changed state before it blocked must undo that change here."""


class Parked(BaseException):
    """Raised by the kernel at the blocking point of a call it parks (runner.py): the call's
    greenlet unwinds and ends, and only its waiter stays queued. Not in the dialect: object
    code can neither raise nor name it, and only the standard classes' `_parked` methods,
    which hold no handler around their wait, are parked."""


class BudgetExceeded(BaseException):
    """The request used more steps than its budget. A BaseException so that `except Exception`
    in object code does not swallow it; every later step raises it again."""


# -- what this module needs of the runner and of a request ------------------------------------

class Host(Protocol):
    """The part of a kernel that runs requests (runner.Runner), as a semaphore and a context
    see it: the log's position and time, and the two calls of the wait queue."""

    @property
    def index(self) -> int: ...

    @property
    def now(self) -> float: ...

    topics: dict[str, list[str] | None]   # what objects announced they changed (changed())

    def block(self, request: Any, semaphore: Semaphore, timeout: float | None) -> bool: ...

    def wake(self, waiter: Waiter[Any]) -> None: ...

    def granted(self) -> None: ...


class Call(Protocol):
    """A request (request.Request), as a semaphore and a context see it."""

    index: int
    session: int
    draws: int
    obj: str
    runner: Host


R = TypeVar("R", bound=Call)


class Task(greenlet.greenlet):
    """The greenlet that runs a request: a worker of the runner, which runs one request
    after another (runner.py)."""

    __slots__ = ("runner", "request", "job")
    runner: Host
    request: Call
    job: Any        # what a worker runs next (runner.py)


#: the reader running now (its label), else None: a reader may not wait, wake or draw
READING: list[str | None] = [None]


class NotYet(Exception):
    """Raised by a reader whose condition does not hold yet: the replica runs it again
    after the next entry that runs on its object (readers.py). `NotYet(topic)` narrows
    that: after the next entry on the object that announced a changed topic starting with
    `topic` (Context.changed), or that announced none."""

    def __init__(self, topic: str | None = None) -> None:
        super().__init__(topic)
        self.topic = topic if type(topic) is str else None


#: Topics one object may announce in one entry; past it the entry counts as changing all.
MAX_TOPICS = 1000


def _no_writes(what: str) -> None:
    raise RuntimeError(f"{what} is not available in a reader ({READING[0]}): a reader may "
                       "not change anything")


def current_task() -> Task:
    g = greenlet.getcurrent()
    if not isinstance(g, Task):
        if READING[0] is not None:
            _no_writes("context() or a wait")
        raise RuntimeError("this operation is only available inside a gesmas request")
    return g


# -- the primitive ------------------------------------------------------------------------------

class Waiter(Generic[R]):
    __slots__ = ("request", "semaphore", "deadline", "order", "live")

    def __init__(self, request: R, semaphore: Semaphore, deadline: float | None,
                 order: int) -> None:
        self.request = request
        self.semaphore = semaphore
        self.deadline = deadline
        self.order = order      # kernel-wide block sequence number: who blocked first
        self.live = True

    def forget(self) -> None:
        """The wait is over: drop what it points to. A dead waiter may stay in its
        semaphore's queue (removed lazily) and in the deadline heap; pointing back at the
        semaphore it would make a cycle, which a replica's collector may never look at again
        once frozen (server/main.py tune_gc)."""
        self.request = self.semaphore = None    # type: ignore[assignment]

    def __lt__(self, other: Waiter[Any]) -> bool:  # deadline-heap tie-break
        return self.order < other.order


class Semaphore:
    """A counting semaphore with a FIFO wait queue.

    acquire(timeout=None): take a permit, blocking server-side while there is none. `timeout`
      (seconds) is capped by the calling request's own timeout; 0 means do not block. Raises
      Timeout, SessionEnded / Aborted, or Interrupted instead of returning.
    try_acquire(): take a permit if one is free now; returns bool, never blocks.
    release(n=1): add n permits, handing each to the oldest waiter first.
    value / waiters: free permits / number of requests waiting.
    """

    __slots__ = ("_value", "_queue", "_live", "_grant")

    def __init__(self, value: int = 1) -> None:
        if type(value) is not int or value < 0:
            raise ValueError(f"semaphore value must be an int >= 0, not {value!r}")
        self._value = value
        self._queue: deque[Waiter[Any]] = deque()   # may hold dead waiters, skipped lazily
        self._live = 0
        # the task re-running a parked call this semaphore handed a permit to: its first
        # acquire here takes that permit (runner.py, parked calls); not part of the state
        self._grant: Task | None = None

    @property
    def value(self) -> int:
        return self._value

    @property
    def waiters(self) -> int:
        return self._live

    def try_acquire(self) -> bool:
        if READING[0] is not None and self._value > 0:
            _no_writes("Semaphore.try_acquire (it would take a permit)")
        if self._value > 0:
            self._value -= 1
            return True
        return False

    def acquire(self, timeout: float | None = None) -> bool:
        if READING[0] is not None:               # a reader: waiting is NotYet (readers.py)
            if self._value > 0:
                _no_writes("Semaphore.acquire (it would take a permit)")
            if timeout == 0:
                return False
            raise NotYet()
        grant = self._grant
        if grant is not None and grant is greenlet.getcurrent():
            self._grant = None                   # the permit handed to a parked call
            grant.runner.granted()
            return True
        if self._value > 0:                      # I1: value > 0 means nobody is waiting
            self._value -= 1
            return True
        task = current_task()
        return task.runner.block(task.request, self, timeout)

    def release(self, n: int = 1) -> None:
        if READING[0] is not None:
            _no_writes("Semaphore.release")
        if type(n) is not int or n < 1:
            raise ValueError(f"release count must be an int >= 1, not {n!r}")
        self._value += n
        q = self._queue
        while self._value and self._live:
            w = q.popleft()
            if not w.live:
                continue
            self._value -= 1
            self._live -= 1
            w.live = False
            w.request.runner.wake(w)

    # kernel side -------------------------------------------------------------------------------

    def _enqueue(self, w: Waiter[Any]) -> None:
        self._queue.append(w)
        self._live += 1

    def _drop(self, w: Waiter[Any]) -> None:
        """Remove a live waiter that leaves without a permit (timeout, abort, interrupt)."""
        w.live = False
        self._live -= 1
        w.forget()
        if len(self._queue) > 32 and len(self._queue) > 2 * self._live:
            self._queue = deque(x for x in self._queue if x.live)

    def _live_waiters(self) -> list[Waiter[Any]]:
        return [w for w in self._queue if w.live]

    def __getstate__(self) -> dict[str, Any]:
        # A checkpoint writes its waiters as pending calls (SAVING). The state digest pickles
        # live kernels too, so there waiters are described by who they are, in queue order.
        if SAVING.get():
            return {"value": self._value, "waiting": []}
        return {"value": self._value,
                "waiting": [w.request.index for w in self._queue if w.live]}

    def __setstate__(self, state: dict[str, Any]) -> None:
        if state["waiting"] and READING[0] is None:
            raise ValueError("cannot restore a semaphore that had waiters")
        self._value = state["value"]
        self._queue = deque()
        self._grant = None
        self._live = len(state["waiting"])     # a reader's copy: counted, never woken

    def __repr__(self) -> str:
        return f"<Semaphore value={self._value} waiters={self._live}>"


# -- what object code can ask -------------------------------------------------------------------

class Context:
    """What a method may know about the call it runs in. Obtained with `context()`.

    session     the calling session id (for a session hook: the session that ended)
    request     the log index of the command that started this call
    index       the log index of the command being applied right now (a lock grant's fence)
    now()       kernel time in seconds: command timestamps, made monotonic
    random()    a float in [0, 1), the same on every replica
    changed(*topics)  announce what this entry changed in the object (strings: a Map's
                keys), so that readers waiting with NotYet(prefix) for other topics sleep
                on; an object that announces nothing wakes every waiting reader
    """

    __slots__ = ("_task",)

    def __init__(self, task: Task) -> None:
        self._task = task

    @property
    def session(self) -> int:
        return self._task.request.session

    @property
    def request(self) -> int:
        return self._task.request.index

    @property
    def index(self) -> int:
        return self._task.runner.index

    def now(self) -> float:
        return self._task.runner.now

    def random(self) -> float:
        req = self._task.request
        req.draws += 1
        return _splitmix64((req.index << 20) + req.draws) / 18446744073709551616.0

    def changed(self, *topics: str) -> None:
        """Not part of the state: what the node wakes waiting readers for (runner.topics)."""
        got = self._task.runner.topics
        name = self._task.request.obj
        have = got.get(name, [])
        if have is None:
            return
        for t in topics:
            if type(t) is not str:
                raise TypeError(f"a changed topic must be a str, not {type(t).__name__}")
        if len(have) + len(topics) > MAX_TOPICS:
            got[name] = None                  # too many: the entry changed everything
            return
        have.extend(topics)
        got[name] = have


def context() -> Context:
    return Context(current_task())


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)

"""Running requests: each in a greenlet (a worker, workers.py), until it returns or blocks
(GESMAS Algorithm 1, DESIGN §3.4).

Theory of operation
-------------------
`spawn` starts a request (a call, a constructor or a session hook) in a worker and runs it
until it returns or blocks in `Semaphore.acquire`, which calls `block`: the request's waiter
joins the semaphore's FIFO queue (and the deadline heap when it has a deadline) and the
greenlet switches back here, or, for a parked call (below), unwinds and ends. `Semaphore.release` calls `wake`, which only moves the woken
request to the tail of the ready queue; `drain` runs the ready requests in FIFO order, and the
kernel drains after every command, so at every command boundary each request in flight is
blocked on exactly one semaphore. `abort` takes a waiter out of its queue and readies it with
the exception its `acquire` raises (Timeout, SessionEnded, Aborted); `detach` takes it out
without readying it (a checkpoint then unwinds it with `Interrupted`, see checkpoint.py).
A finished call's result is stored in its session (exactly-once) and sent to every tag that
waits for it; a call unwound by a checkpoint lands in `pending` instead.

Interface: the kernel's other parts call `spawn`, `drain`, `abort`, `detach`, `blocked`,
`deadline`, `complete`, `finish_error`, `expire_due`, `next_deadline`; the semaphores call
`block`, `wake` and `granted` (the `sched.Host` protocol); `close` when the kernel is dropped. The runner owns the ready queue, the deadline
heap, the count of live waiters (`waiting`), the block numbers (`order`, saved by a checkpoint),
the completions of the command being applied (`out`) and the budget of the running request.
It reads the shared `State` (sessions and objects, the clock) and writes the sessions' results
and in-flight tables and the users' waiter counts. After a run it charges the steps spent to
the object run on, and calls `grown(record)` when they may have grown it by a quarter of
max_object_bytes (lifecycle.py measures it again).
"""
from __future__ import annotations

import heapq
import logging
from collections import deque
from typing import Any, Callable

import greenlet

from . import codec
from .budget import Budget
from .errors import Code, Error, KernelError
from .records import Completion, Config, ObjectRecord, PendingCall, State
from .request import Kind, Request
from .sched import Interrupted, Parked, Semaphore, SessionEnded, Task, Timeout, Waiter
from .workers import INTERRUPTED, PARKED, Workers

log = logging.getLogger("gesmas.server.kernel.kernel")



def _ANY(r: Request) -> bool:
    return True


class Runner:
    def __init__(self, state: State, config: Config, budget: Budget,
                 grown: Callable[[ObjectRecord], None]) -> None:
        self.state = state
        self.config = config
        self.budget = budget
        self.grown = grown
        self.measure_every = (config.max_object_bytes >> 2) // 64   # steps between measures
        self.order = 0                   # block sequence number
        self.waiting = 0                 # live waiters
        # the waiting requests by block number, oldest first (blocked(): no sort, no scan)
        self.by_order: dict[int, Request] = {}
        # per object with waiters: how many wait in each method, under None those that a
        # checkpoint cannot keep waiting whatever their class (Waiters.kept_objects)
        self.blocked_methods: dict[str, dict[str | None, int]] = {}
        self.deadlines: list[tuple[float, int, Waiter[Request]]] = []
        self.ready: deque[tuple[Request, BaseException | None]] = deque()
        self.out: list[Completion] = []  # completions of the command being applied
        self.pending: list[PendingCall] = []   # calls unwound by a checkpoint, to re-run
        self.touched: set[str] = set()   # objects run on by the command being applied
        # ... and the topics their code announced (Context.changed; None: too many)
        self.topics: dict[str, list[str] | None] = {}
        self.changed: set[str] = set()   # objects run on, made or removed since the last
        #                                  checkpoint taken or loaded (checkpoint.py)
        # ... those of them of uploaded classes (or of a class not known when marked): a
        # checkpoint saves these at its index, and may leave the others to its capture
        self.changed_uploaded: set[str] = set()
        # set while a restore re-runs a call that the live replicas kept waiting through the
        # checkpoint (Checkpoints._rerun): they did not run it, so the re-run is not charged
        self.quiet = False
        # park the waits of the standard classes' `_parked` methods (see Parked calls, below);
        # off, every waiting call keeps its greenlet (the tests compare the two)
        self.park = True
        self.workers = Workers(self)     # the greenlets requests run in (workers.py)
        # saves an object for an open checkpoint capture before code runs on it (capture.py;
        # set by Checkpoints): seal(name, running)
        self.seal: Callable[..., None] = lambda name, running=False: None
        # ... and keeps the table of frames (State.frames) as objects are made and removed
        # (capture.py: a capture may hold it as it was at its checkpoint)
        self.made: Callable[[str], None] = lambda name: state.frames.__setitem__(name, None)
        self.removed: Callable[[str], None] = lambda name: state.frames.pop(name, None)
        # ... and is told of an object measured again (capture.py: Deferred.measured)
        self.measured: Callable[[str], None] = lambda name: None

    # -- the log's position and time (sched.Host) -----------------------------------------------

    @property
    def index(self) -> int:
        return self.state.index

    @property
    def now(self) -> float:
        return self.state.now

    # -- running a request ---------------------------------------------------------------------

    def spawn(self, req: Request, fn: Callable[..., Any], args: tuple[Any, ...],
              kwargs: dict[str, Any]) -> None:
        """Start `req` in a greenlet of its own that runs `fn(*args, **kwargs)`."""
        self.workers.assign(req, fn, args, kwargs)
        self.run(req, start=True)

    def use_limit(self) -> greenlet.greenlet:
        """Set the recursion limit requests run under; returns the launcher."""
        return self.workers.use_limit()

    def close(self) -> None:
        """The kernel is dropped: let its memory go (Workers.close)."""
        self.workers.close()

    def run(self, req: Request, throw: BaseException | None = None,
            woken: bool = False, start: bool = False) -> None:
        """Run `req` until it blocks or ends: start it, wake it (`woken`: its acquire returns
        True) or raise `throw` at its blocking point."""
        if not start:
            self.seal(req.obj, True)           # a kept waiter's object (capture.py)
        self.budget.steps = 0
        if req.parked:
            self._unpark(req, throw)
            return
        task = req.task
        assert task is not None
        launcher = self.use_limit()
        if start:
            outcome = launcher.switch(task)
        elif throw is None:
            outcome = task.switch(True) if woken else task.switch()
        else:
            req.interrupting = isinstance(throw, Interrupted)
            outcome = task.throw(throw)
            req.interrupting = False
        if not self.quiet:
            self._charge(req.obj)
        self._after(req, task, outcome)

    def _after(self, req: Request, task: Task, outcome: Any) -> None:
        """A run of `req` in `task` stopped with `outcome`: it waits, or it was parked, or
        it ended."""
        ended = self.workers.ended(task, outcome)
        if ended is None:
            return                               # it waits in its worker
        if ended[1] is PARKED:
            req.task = None
        else:
            self._finish(req, ended[1])

    # -- parked calls --------------------------------------------------------------------------
    #
    # A waiting call costs its greenlet (~6 KB of RSS on CPython 3.11: the page of frames
    # CPython gives each greenlet, and its saved C stack), more than the rest of its records.
    # A standard class lists in `_parked` the methods for which resuming the wait and running
    # the method again from its start give the same outcome and state: nothing before the wait
    # changes anything, what it reads before the wait reads the same when the wait is granted,
    # and no handler surrounds the wait. Such a call is parked when it blocks: `block` raises
    # Parked, its greenlet unwinds and ends, and only its waiter (with the call's command)
    # stays queued. Granted, it runs again from its start in a new greenlet, and its first
    # acquire of the semaphore that granted it takes the permit handed to it; the steps
    # spent before that acquire are not charged (they were when it blocked). Timed out,
    # aborted or interrupted, it ends with the outcome its acquire's exception gives
    # (`Workers.failed`), as it would have unwound, without running again.

    def _parks(self, req: Request) -> bool:
        if not self.park or req.cmd is None:
            return False
        rec = self.state.objects.get(req.obj)
        if rec is None or rec.cls.name not in self.config.reserved_classes:
            return False
        parked = getattr(rec.cls.cls, "_parked", ())
        return type(parked) is tuple and req.cmd.method in parked

    def _unpark(self, req: Request, throw: BaseException | None) -> None:
        """Run a parked call again (granted) or end it with `throw`'s outcome."""
        req.parked = False
        if throw is not None:
            req.interrupting = isinstance(throw, Interrupted)
            outcome = self.workers.failed(req, throw)
            req.interrupting = False
            if not self.quiet:
                self._charge(req.obj)
            self._finish(req, outcome)
            return
        sem, req.grant = req.grant, None
        assert sem is not None and req.cmd is not None
        rec = self.state.objects[req.obj]        # its waiters are aborted when it is deleted
        found = rec.cls.method(req.cmd.method)
        assert found is not None
        fn = found[0]
        task = self.workers.assign(req, fn, (rec.instance, *req.cmd.args), req.cmd.kwargs)
        sem._grant = task
        try:
            outcome = self.use_limit().switch(task)
        finally:
            sem._grant = None                   # not taken: the method did not wait there again
        if not self.quiet:
            self._charge(req.obj)
        self._after(req, task, outcome)

    def granted(self) -> None:
        """A parked call run again took the permit handed to it (Semaphore.acquire): what
        it spent to get there was charged when it first blocked."""
        self.budget.steps = 0

    def _charge(self, name: str) -> None:
        """A run on object `name` ended: it is changed (and touched), and charged the run's
        steps."""
        rec = self.state.objects.get(name)
        self.touched.add(name)
        self.changed.add(name)
        if rec is not None:
            if rec.cls.name not in self.config.reserved_classes:
                self.changed_uploaded.add(name)
            rec.runs += 1
            rec.steps += self.budget.steps
            if rec.steps > self.measure_every:
                self.grown(rec)

    def _finish(self, req: Request, outcome: Any) -> None:
        req.task = None
        s = self.state.sessions.get(req.session)
        call = req.kind is Kind.CALL
        if s is not None and call:
            s.inflight.pop(req.seq, None)
        if outcome is INTERRUPTED:
            assert call and req.cmd is not None   # only waiters are interrupted; calls alone wait
            # the re-run waits again where it was waiting, until the same deadline; with
            # the command decoded again from its log bytes, as a restored replica re-runs it:
            # the arguments the method was given are the command's, and it may have changed
            # them (a list it appended to) before it waited
            cmd = req.cmd if req.raw is None else codec.decode(req.raw)
            assert isinstance(cmd, codec.Invoke)
            self.pending.append(PendingCall(req.index, cmd, tuple(req.tags),
                                            req.deadline, tuple(req.deadlines[-1:]),
                                            req.raw))
            return
        req.outcome = outcome
        value, error = outcome
        if call:
            if s is not None:
                s.results[req.seq] = (value, error)
                if len(s.results) > self.config.max_results:
                    old = next(iter(s.results))
                    del s.results[old]
                    s.dropped = max(s.dropped, old)
        elif error is not None and req.kind is Kind.HOOK:
            log.warning("%s failed: %s", req.label, error)
        for tag in req.tags:
            self.out.append(Completion(tag, value, error))

    def finish_error(self, req: Request, error: Error) -> None:
        """End a call that is no longer run with `error`, stored as its result."""
        s = self.state.sessions.get(req.session)
        if s is not None and req.kind is Kind.CALL:
            s.results[req.seq] = (None, error)
        for tag in req.tags:
            self.out.append(Completion(tag, None, error))

    def complete(self, tag: str, value: Any, error: Error | None = None) -> None:
        """Answer the command tagged `tag` (nobody waits for an empty tag)."""
        if tag:
            self.out.append(Completion(tag, value, error))

    # -- waiting -------------------------------------------------------------------------------

    def block(self, req: Request, sem: Semaphore, timeout: float | None) -> bool:
        """Called by Semaphore.acquire inside `req`'s greenlet: wait for a permit."""
        if req.kind is not Kind.CALL:
            raise RuntimeError(f"a {req.kind.value} may not wait")
        if req.session not in self.state.sessions:
            raise SessionEnded(f"session {req.session} has ended")
        if req.replay:                                  # re-run after a checkpoint
            deadline = req.replay.pop(0)
        else:
            if req.nowait:
                raise Timeout(req.nowait)
            if timeout == 0:
                raise Timeout("would wait, and acquire's timeout is 0")
            deadline = req.deadline
            own = self.deadline(timeout, ValueError)
            if own is not None:
                deadline = own if deadline is None else min(deadline, own)
            if deadline is not None and deadline <= self.state.now:
                raise Timeout("deadline passed")
            if self.waiting >= self.config.max_waiters:
                raise KernelError(Code.RESOURCE_EXHAUSTED,
                                  f"too many waiting requests ({self.waiting})")
            self.state.within(req.user, "waiters")
        req.deadlines.append(deadline)
        req.saved = None
        req.saved_form()                     # what a checkpoint writes of it (records.py)
        self.order += 1
        w = Waiter(req, sem, deadline, self.order)
        sem._enqueue(w)
        req.waiter = w
        self.waiting += 1
        self.by_order[w.order] = req
        # a call waiting for the first time can be kept by a checkpoint, if its method is
        # one its class lists in _restartable (checked at the checkpoint)
        counted = req.counted = req.cmd.method if len(req.deadlines) == 1 and \
            req.cmd is not None else None
        methods = self.blocked_methods.get(req.obj)
        if methods is None:
            methods = self.blocked_methods[req.obj] = {}
        methods[counted] = methods.get(counted, 0) + 1
        self.state.usage.add(req.user, "waiters", 1)
        if deadline is not None:
            heapq.heappush(self.deadlines, (deadline, w.order, w))
        if self._parks(req):
            req.parked = True
            raise Parked()
        assert req.task is not None and req.task.parent is not None
        return req.task.parent.switch()

    @property
    def waiting_on(self) -> dict[str, int]:
        """Live waiters per object with any (listings)."""
        return {name: sum(methods.values()) for name, methods in self.blocked_methods.items()}

    def deadline(self, timeout: Any, error: type[Exception]) -> float | None:
        """The kernel time at which a wait of `timeout` seconds ends; None for no timeout or
        an infinite one. The one place where timeouts (a call's, or acquire's) are checked:
        NaN, negative or non-numbers are refused with `error`."""
        if timeout is None:
            return None
        if type(timeout) not in (int, float) or not timeout >= 0:     # NaN fails `>= 0`
            message = f"timeout must be a number of seconds >= 0, not {timeout!r}"
            if error is KernelError:
                raise KernelError(Code.INVALID_ARGUMENT, message)
            raise error(message)
        deadline = self.state.now + timeout
        return deadline if deadline < 1e15 else None    # inf or astronomically far: no limit

    def wake(self, w: Waiter[Request]) -> None:
        """Semaphore.release handed a permit to `w`: run it after the current request."""
        req = w.request
        if req.parked:
            req.grant = w.semaphore             # its re-run takes the permit there
        w.forget()
        req.waiter = None
        self._unwait(req, w.order)
        self.state.usage.add(req.user, "waiters", -1)
        self.ready.append((req, None))

    def abort(self, req: Request, exc: BaseException) -> None:
        """Take `req` out of its wait; its acquire raises `exc` when the ready queue runs it."""
        w = req.waiter
        if w is not None and w.live:
            w.semaphore._drop(w)
            req.waiter = None
            self._unwait(req, w.order)
            self.state.usage.add(req.user, "waiters", -1)
            self.ready.append((req, exc))

    def detach(self, req: Request) -> None:
        """Take `req` out of its wait without readying it (a checkpoint unwinds it)."""
        w = req.waiter
        if w is not None and w.live:
            w.semaphore._drop(w)
            self._unwait(req, w.order)
            self.state.usage.add(req.user, "waiters", -1)
        req.waiter = None

    def _unwait(self, req: Request, order: int) -> None:
        """Count `req` out of the waiters (its waiter, of block number `order`, left its
        semaphore)."""
        self.waiting -= 1
        del self.by_order[order]
        methods = self.blocked_methods[req.obj]
        n = methods[req.counted] - 1
        if n:
            methods[req.counted] = n
        elif len(methods) > 1:
            del methods[req.counted]
        else:
            del self.blocked_methods[req.obj]

    def expire_due(self) -> None:
        """Time out the waits whose deadline is not after kernel time."""
        dl = self.deadlines
        while dl and dl[0][0] <= self.state.now:
            _, _, w = heapq.heappop(dl)
            if w.live:
                self.abort(w.request, Timeout("no result within the timeout"))
        if len(dl) > 64 and len(dl) > 2 * self.waiting:
            self.prune_deadlines()

    def prune_deadlines(self) -> None:
        """Forget the deadlines of waits that ended."""
        self.deadlines = [e for e in self.deadlines if e[2].live]
        heapq.heapify(self.deadlines)

    def next_deadline(self) -> float | None:
        """The earliest time at which a wait times out (the leader proposes a Tick then)."""
        while self.deadlines and not self.deadlines[0][2].live:
            heapq.heappop(self.deadlines)
        return self.deadlines[0][0] if self.deadlines else None

    def renumber(self, req: Request) -> None:
        """Give the waiting `req` the next block number, as if it had blocked again now (its
        place in its session's in-flight table moves to the end too). Call `reorder_deadlines`
        after: the deadline heap is ordered by these numbers."""
        assert req.waiter is not None
        self.order += 1
        del self.by_order[req.waiter.order]
        req.waiter.order = self.order
        self.by_order[self.order] = req
        inflight = self.state.sessions[req.session].inflight
        inflight[req.seq] = inflight.pop(req.seq)

    def reorder_deadlines(self) -> None:
        self.deadlines = [(w.deadline, w.order, w) for w in (r.waiter for r in
                          self.blocked()) if w is not None and w.deadline is not None]
        heapq.heapify(self.deadlines)

    def drain(self) -> None:
        """Run the ready requests, in FIFO order, until none is ready."""
        ready = self.ready
        while ready:
            req, exc = ready.popleft()
            self.run(req, exc, woken=exc is None)

    def blocked(self, pred: Callable[[Request], bool] = _ANY) -> list[Request]:
        """Requests waiting that satisfy `pred`, oldest block first."""
        if pred is _ANY:
            return list(self.by_order.values())
        return [r for r in self.by_order.values() if pred(r)]

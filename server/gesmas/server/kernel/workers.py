"""The greenlets requests run in, and what a run of a request's method gives (a part of
the runner, runner.py).

A request runs in a worker: a `sched.Task` greenlet that runs one request after another
(`_work`). A request that waits keeps its worker until it ends; one that ends hands its
worker back for the next (at most IDLE_WORKERS kept, per thread: greenlets belong to the
thread that made them). Starting a new greenlet costs ~10 µs on CPython 3.11 (the chunk of
frames CPython maps for it), switching into a waiting one under 1 µs. Every request is first
switched to from one launcher greenlet, so every run starts at the same depth (the
launcher's, plus `_work`, as a greenlet of its own once did plus its lambda): the recursion
limit requests meet does not depend on who applies the entry, nor on the worker.

Interface: `Workers(runner)`; `assign` a request to a worker, `ended` tells a worker's
hand-back from a wait, `use_limit` (the launcher), `failed` (a raised exception's outcome),
`close`. The runner keeps the outcomes' markers here: INTERRUPTED, PARKED.
"""
from __future__ import annotations

from typing import Any, Callable

import greenlet

from . import codec, stack
from .budget import ResourceLimit
from .errors import Code, Error, KernelError
from .request import Request
from .registry import safe_str, type_name
from .sched import (Aborted, BudgetExceeded, Interrupted, Parked, SessionEnded, Task,
                    Timeout)

INTERRUPTED = object()          # a request's outcome: interrupted by a checkpoint
PARKED = object()               # ... parked: its greenlet ended, its waiter stays queued
DONE = object()                 # a worker's run ended: (DONE, outcome) is what it hands back
IDLE_WORKERS = 4                # workers kept for the next runs (each holds ~6 KB)


class Workers:
    def __init__(self, runner: Any) -> None:
        self.runner = runner    # runner.Runner (its budget and config; it is the tasks' host)
        self._launch: tuple[greenlet.greenlet, int, greenlet.greenlet] | None = None
        # workers whose last run ended, and the main greenlet of the thread they belong to
        self.idle: list[Task] = []
        self._idle_root: greenlet.greenlet | None = None

    def assign(self, req: Request, fn: Callable[..., Any], args: tuple[Any, ...],
               kwargs: dict[str, Any]) -> Task:
        """Give `req` a worker that will run `fn(*args, **kwargs)` when switched to."""
        idle = self.idle
        task = idle.pop() if idle and self._idle_root is self.root() else None
        if task is None:
            task = Task(self._work)
            task.runner = self.runner
        task.request = req
        task.job = (req, fn, args, kwargs)
        req.task = task
        return task

    def _work(self) -> None:
        """A worker's loop: run its job, hand back (DONE, outcome), wait for the next."""
        me = greenlet.getcurrent()
        assert isinstance(me, Task)
        while True:
            req, fn, args, kwargs = me.job
            me.job = None
            outcome = self.body(req, fn, args, kwargs)
            me.parent.switch((DONE, outcome))   # type: ignore[union-attr]

    def ended(self, task: Task, outcome: Any) -> Any:
        """The outcome a worker handed back, once its request ended (None if it did not);
        the worker is kept for the next runs."""
        if type(outcome) is not tuple or len(outcome) != 2 or outcome[0] is not DONE:
            return None
        task.request = None     # type: ignore[assignment]
        root = self.root()
        if self._idle_root is not root:
            self.idle, self._idle_root = [], root
        if len(self.idle) < IDLE_WORKERS:
            self.idle.append(task)
        return outcome

    def close(self) -> None:
        """The kernel is dropped (a snapshot installed over it, a rollback): end the
        greenlets only it uses, its launcher and its idle workers, which run no object code
        now, so that it can be freed (CPython's collector never frees a suspended greenlet,
        and theirs refer to the runner). A call still waiting in its greenlet (not parked)
        keeps it: ending that would run its object code (finally blocks). From another
        thread than theirs, nothing is ended (a greenlet is switched to in its own)."""
        root = self.root()
        idle, self.idle = self.idle, []
        launch, self._launch = self._launch, None
        if self._idle_root is root:
            for w in idle:
                w.throw(greenlet.GreenletExit)
        if launch is not None and launch[2] is root:
            launch[0].throw(greenlet.GreenletExit)

    @staticmethod
    def root() -> greenlet.greenlet:
        root = greenlet.getcurrent()
        while root.parent is not None:
            root = root.parent
        return root

    def _launcher(self) -> tuple[greenlet.greenlet, int]:
        """The greenlet every request is first switched to from, and the recursion limit
        that puts stack.HEADROOM frames above it. A greenlet starts at the call depth of the
        switch that starts it, so starting every request from this one greenlet, which never
        returns from its loop, starts them all at one depth, whoever applies the entry; its
        depth is read once (per thread: greenlets belong to the thread that made them)."""
        root = greenlet.getcurrent()
        while root.parent is not None:
            root = root.parent               # this thread's main greenlet
        got = self._launch
        if got is not None and got[2] is root and not got[0].dead:
            return got[0], got[1]
        limit: list[int] = []

        def launch(task: greenlet.greenlet) -> None:
            limit.append(stack.limit_for(stack.depth()))
            parent = greenlet.getcurrent().parent
            assert parent is not None
            task = parent.switch()
            while True:         # the request runs, then its parent (the kernel) gets control
                task = task.switch()

        g = greenlet.greenlet(launch)
        g.switch(None)
        self._launch = (g, limit[0], root)
        return g, limit[0]

    def use_limit(self) -> greenlet.greenlet:
        """Set the recursion limit requests run under; returns the launcher."""
        launcher, limit = self._launcher()
        stack.use(limit)
        return launcher

    def body(self, req: Request, fn: Callable[..., Any], args: tuple[Any, ...],
              kwargs: dict[str, Any]) -> Any:
        """Runs inside the request's greenlet; returns (value, error) or INTERRUPTED.
        Whatever the method raises, BaseException included, is the caller's error."""
        budget = self.runner.budget
        config = self.runner.config
        try:
            value = fn(*args, **kwargs)
            if budget.steps > budget.limit:
                raise BudgetExceeded(budget.limit)
            value = codec.plain_copy(value, "result")
            if codec.may_exceed(value, config.max_result_bytes) and \
                    codec.encoded_size(value) > config.max_result_bytes:
                return None, Error(Code.RESOURCE_EXHAUSTED,
                                   f"{req.label} returned more than "
                                   f"{config.max_result_bytes} bytes", "ResourceLimit")
            return value, None
        except greenlet.GreenletExit:
            raise                            # the kernel ends this greenlet (waiters.end)
        except Parked as e:
            if req.parked:                   # raised by block(), for this call
                return PARKED
            return self.failed(req, e)
        except BaseException as e:
            return self.failed(req, e)

    def failed(self, req: Request, e: BaseException) -> Any:
        """The outcome of a call whose method raised `e` (BaseException included: it is the
        caller's error), or INTERRUPTED for a checkpoint's Interrupted."""
        if isinstance(e, BudgetExceeded):
            return None, Error(Code.RESOURCE_EXHAUSTED,
                               f"{req.label} exceeded its budget of {self.runner.budget.limit} steps",
                               "BudgetExceeded")
        if isinstance(e, Interrupted):
            if req.interrupting:
                return INTERRUPTED
            return None, Error(Code.APPLICATION, f"{req.label} raised Interrupted itself "
                               "(only a checkpoint may)", "Interrupted")
        if isinstance(e, Timeout):
            return None, Error(Code.TIMEOUT, f"{req.label}: {safe_str(e) or 'timed out'}",
                               "Timeout")
        if isinstance(e, SessionEnded):
            return None, Error(Code.ABORTED, f"{req.label}: {safe_str(e)}", "SessionExpired")
        if isinstance(e, Aborted):
            return None, Error(Code.ABORTED, f"{req.label}: {safe_str(e)}", "Aborted")
        if isinstance(e, KernelError):
            return None, e.error
        if isinstance(e, codec.NotPlainValue):
            return None, Error(Code.APPLICATION, f"{req.label} returned {e}", "TypeError")
        if isinstance(e, (ResourceLimit, codec.TooLarge)):
            return None, Error(Code.RESOURCE_EXHAUSTED, f"{req.label}: {safe_str(e)}",
                               "ResourceLimit")
        if isinstance(e, MemoryError):
            return None, Error(Code.RESOURCE_EXHAUSTED, f"{req.label}: out of memory",
                               "MemoryError")
        return None, Error(Code.APPLICATION, safe_str(e), type_name(e))

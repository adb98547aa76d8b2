"""The waiting calls at a checkpoint (DESIGN §5): which stay waiting in place, unwinding the
others with Interrupted, ending those that cannot be re-run, and running the waiting calls
again when a checkpoint is restored. A part of the checkpoints (checkpoint.py), which decide
when; it owns no state of its own.

Interface: `Waiters(state, config, runner, restart)`; `restart(p, session)` starts a pending
call again (Kernel._start, with the call's saved deadlines).
"""
from __future__ import annotations

from typing import Callable

import greenlet

from .errors import Code, Error, KernelError
from .records import Completion, Config, PendingCall, Session, State
from .request import Request
from .runner import Runner
from .sched import Interrupted


class Waiters:
    def __init__(self, state: State, config: Config, runner: Runner,
                 restart: Callable[[PendingCall, Session], None]) -> None:
        self.state = state
        self.config = config
        self.runner = runner
        self.restart = restart

    def rerun(self, pending: list[PendingCall], kept: frozenset[str] = frozenset()) -> None:
        """Run the pending calls again, in order. Those on the `kept` objects waited in
        place through the checkpoint on a live replica (Checkpoints.take), which neither ran
        them nor marked their objects changed: re-run here, they are not charged either, and
        block again with the next block numbers, which Checkpoints.take counts."""
        runner = self.runner
        for p in pending:
            s = self.state.sessions[p.cmd.session]
            runner.quiet = p.cmd.name in kept
            try:
                self.restart(p, s)
            except KernelError as e:         # its object was dropped by this checkpoint
                s.results[p.cmd.seq] = (None, e.error)
                for tag in p.tags:
                    runner.out.append(Completion(tag, None, e.error))
            finally:
                runner.quiet = False
            runner.drain()

    def kept_objects(self) -> set[str]:
        """The objects whose waiters a checkpoint leaves waiting instead of interrupting them.

        Running such a call again from its start, in the state of the checkpoint, must end in
        the same wait with nothing else changed, so that a replica restored from the checkpoint
        (which re-runs it) and one that kept it waiting are the same. Only the standard classes
        (names that only the replicas may register) are trusted to say so: their methods listed
        in the class's `_restartable` block before they change anything, and while they wait,
        what made them wait still holds. A call waiting for the second time (woken and blocked
        again) is not kept: its first wait is behind it. One object's waiters are kept all or
        none, so that an interrupted call's handler can never wake a kept waiter.

        The runner counts the waiters of each object by method as they block (None, never a
        restartable method: waiting again, or no command), so this looks at the objects, not
        at every waiter."""
        kept: set[str] = set()
        reserved = self.config.reserved_classes
        for name, methods in self.runner.blocked_methods.items():
            rec = self.state.objects.get(name)
            if rec is None or rec.cls.name not in reserved:
                continue
            names = tuple(getattr(rec.cls.cls, "_restartable", ()))
            if all(m in names for m in methods):
                kept.add(name)
        return kept

    def abandon(self, req: Request) -> None:
        """A kept waiter whose object the checkpoint dropped: end it with the error its re-run
        meets on a restored replica (`rerun`, object not found)."""
        self.end(req, Error(Code.NOT_FOUND, self.state.dropped[req.obj]))

    def interrupt(self, req: Request) -> None:
        """Unwind a detached waiter with Interrupted; it lands in the runner's `pending`."""
        for _ in range(3):
            self.runner.run(req, Interrupted("checkpoint"))
            if req.task is None:
                return
            self.runner.detach(req)          # it caught Interrupted and waited again
        self.end(req, Error(Code.APPLICATION, f"{req.label} caught Interrupted and waited "
                                               "again, so a checkpoint cannot re-run it",
                             "Interrupted"))

    def end(self, req: Request, error: Error) -> None:
        """End a waiting call for good with `error`: its greenlet is closed now,
        deterministically, not whenever the garbage collector runs."""
        task, req.task = req.task, None
        if task is not None:
            self.runner.use_limit()          # its finally blocks are uploaded code
            task.throw(greenlet.GreenletExit)
        self.runner.detach(req)
        s = self.state.sessions.get(req.session)
        if s is not None:
            s.inflight.pop(req.seq, None)
        self.runner.finish_error(req, error)

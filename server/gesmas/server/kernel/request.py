"""The requests the kernel runs (of three kinds: a call, a constructor, a session hook).
Runtime only: a checkpoint writes a waiting call as records.PendingCall's form
(`Request.saved_form`), never a Request."""
from __future__ import annotations

import enum
from typing import Any

from . import codec
from .sched import Host, Task, Waiter


class Kind(enum.Enum):
    """What a request runs. Only a CALL (an Invoke) may wait, has a (session, seq) and a
    stored result, and can be interrupted by a checkpoint and re-run."""

    CALL = "call"
    CONSTRUCTOR = "constructor"
    HOOK = "session hook"


class Request:
    """One call being run. `index` (the log index of the command that started it) is its id."""

    __slots__ = ("runner", "kind", "index", "session", "seq", "tags", "task", "deadline",
                 "deadlines", "replay", "draws", "waiter", "obj", "cmd", "nowait", "label",
                 "outcome", "interrupting", "user", "raw", "counted", "saved", "parked",
                 "grant")

    def __init__(self, runner: Host, kind: Kind, index: int, session: int, label: str,
                 obj: str) -> None:
        self.runner = runner                       # what runs it (runner.Runner)
        self.kind = kind
        self.index = index
        self.session = session
        self.seq = 0
        self.tags: list[str] = []
        self.task: Task | None = None
        self.deadline: float | None = None         # from the call's timeout
        self.deadlines: list[float | None] = []    # each wait's deadline, for exact re-runs
        self.replay: list[float | None] = []
        self.draws = 0
        self.waiter: Waiter[Request] | None = None
        self.obj = obj
        self.cmd: codec.Invoke | None = None       # a CALL's command, for its re-run
        self.raw: bytes | None = None              # ... as the log holds it, if known
        self.nowait = ""         # why a CALL may not wait (its timeout is 0), if it may not
        self.label = label
        self.outcome: Any = None
        self.interrupting = False  # the kernel is throwing a checkpoint's Interrupted into it
        self.user = ""             # the user of its session (quotas)
        self.counted: str | None = None    # while it waits: its method, None if it cannot be
        #                                    kept by a checkpoint (Runner.blocked_methods)
        # PendingCall.saved() of it while it waits (`saved_form`): made when it blocks, so
        # that a checkpoint does not make 10^5 of them at its entry; cleared when its tags
        # change (made again when a checkpoint asks)
        self.saved: tuple[Any, ...] | None = None
        self.parked = False        # waiting without a greenlet (runner.py, parked calls)
        self.grant: Any = None     # ... granted: the semaphore whose permit it was handed

    def saved_form(self) -> tuple[Any, ...]:
        """How a checkpoint writes this call while it waits: PendingCall.saved() of it."""
        saved = self.saved
        if saved is None:
            saved = self.saved = (self.index, self.raw if self.raw is not None else self.cmd,
                                  tuple(self.tags), self.deadline, tuple(self.deadlines))
        return saved

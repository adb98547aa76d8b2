"""Calls waiting on this replica, and the hand-off of their answers between threads.

A call that a client made here is proposed under a tag unique to this run of this replica
(`new_tag`) and waits on a future in `PendingCalls` until the command is applied. Threads:
the apply thread (pysyncobj's) calls `applied` / `post`; the event loop (gRPC and the leader's
duties) calls everything else. Completions cross over in batches, one `call_soon_threadsafe`
per batch, never one per command.

`CallFailed` is how this layer and the node below say that a call cannot be answered here
(no leader, not committed, too large...): the gateway turns it into the gRPC status.
"""
from __future__ import annotations

import asyncio
import itertools
import threading
from dataclasses import dataclass, field

from .kernel.errors import Code, Error
from .kernel.kernel import Completion


#: What a call waiting on a replica that stops gets (its client retries on another replica)
STOPPING = Error(Code.UNAVAILABLE, "this replica is stopping; retry on another", "Stopping")


class CallFailed(Exception):
    """The call gets `error` without an answer from the kernel; `leader_hint` is the leader's
    client address when the caller should go there."""

    def __init__(self, error: Error, leader_hint: str = "") -> None:
        super().__init__(str(error))
        self.error = error
        self.leader_hint = leader_hint


@dataclass
class Pending:
    """One call waiting on this replica. Its future's result is (the completion, the log
    index of the entry whose applying produced it: the state the answer reflects)."""

    future: asyncio.Future[tuple[Completion, int]]
    proposed_at: float                 # monotonic time of the proposal
    applied: bool = False              # its command was applied here (its answer may wait on)


@dataclass
class PendingCalls:
    prefix: str                        # this run's tag prefix: "node.random:"
    loop: asyncio.AbstractEventLoop | None = None
    _table: dict[str, Pending] = field(default_factory=dict)
    # the calls whose command is not applied here yet, in the order they were proposed:
    # fail_stale looks at these only, oldest first, not at every call waiting here
    _unapplied: dict[str, Pending] = field(default_factory=dict)
    _tags: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _ready_lock: threading.Lock = field(default_factory=threading.Lock)
    _ready: list[tuple[list[Completion], str, int]] = field(default_factory=list)
    _ready_scheduled: bool = False

    def new_tag(self) -> str:
        return f"{self.prefix}{next(self._tags)}"

    # -- apply thread ---------------------------------------------------------------------------

    def applied(self, out: list[Completion], applied_tag: str, index: int) -> None:
        """The command `applied_tag` was applied at log `index` with completions `out`: hand
        over the ones this run of this replica waits for (other replicas answer their own
        calls)."""
        prefix = self.prefix
        mine = [c for c in out if c.tag.startswith(prefix)]
        if mine or applied_tag.startswith(prefix):
            self.post(mine, applied_tag, index)

    def post(self, out: list[Completion], applied_tag: str, index: int = 0) -> None:
        """Hand completions (made when applying log `index`; 0: none, a failure) to the
        event loop; one wake-up per batch."""
        if self.loop is None:
            return
        with self._ready_lock:
            self._ready.append((out, applied_tag, index))
            if self._ready_scheduled:
                return
            self._ready_scheduled = True
        self.loop.call_soon_threadsafe(self._deliver_ready)

    # -- event loop -----------------------------------------------------------------------------

    def _deliver_ready(self) -> None:
        with self._ready_lock:
            ready, self._ready = self._ready, []
            self._ready_scheduled = False
        for out, tag, index in ready:
            p = self._table.get(tag)
            if p is not None:
                p.applied = True
                self._unapplied.pop(tag, None)
            for c in out:
                p = self._table.get(c.tag)
                if p is not None and not p.future.done():
                    p.future.set_result((c, index))

    def open(self, tag: str, now: float) -> asyncio.Future[tuple[Completion, int]]:
        """Start waiting for the call `tag`, proposed at monotonic time `now`."""
        assert self.loop is not None
        fut: asyncio.Future[tuple[Completion, int]] = self.loop.create_future()
        self._table[tag] = self._unapplied[tag] = Pending(fut, now)
        return fut

    def close(self, tag: str) -> None:
        self._table.pop(tag, None)
        self._unapplied.pop(tag, None)

    def fail_stale(self, now: float, timeout: float) -> None:
        """Fail the calls whose command was not applied within `timeout` seconds (lost in a
        leader change): the client retries with the same (session, seq)."""
        limit = now - timeout
        unapplied = self._unapplied
        while unapplied:
            tag = next(iter(unapplied))
            p = unapplied[tag]
            if p.proposed_at >= limit:       # the rest were proposed later
                break
            del unapplied[tag]
            if not p.applied and not p.future.done():
                p.future.set_result((Completion(tag, None, Error(
                    Code.UNAVAILABLE, "the command was not committed in time; retry",
                    "NotCommitted")), 0))

    def fail_all(self, error: Error) -> None:
        """Answer every call waiting here with `error` (the replica is stopping: its callers
        retry elsewhere with the same (session, seq) and join the same wait there)."""
        for tag, p in list(self._table.items()):
            if not p.future.done():
                p.future.set_result((Completion(tag, None, error), 0))

    def __len__(self) -> int:
        return len(self._table)

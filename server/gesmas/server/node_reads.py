"""Reads without a log entry, as a node serves them (the protocol: replication/reads.py).

`NodeReads(node).read(fn, consistency, min_index, wait)` runs `fn(kernel)` on the replica's
applied state between two entries and returns (value, the index it reflects): for a
linearizable read once the replica has applied the leader's read index, for a sequential one
once it has applied `min_index`; UNAVAILABLE (with the leader as a hint) past `wait` seconds.
It uses the node's replica and event loop, and nothing else of it.
"""
from __future__ import annotations

import asyncio
import logging
import threading
from typing import TYPE_CHECKING, Any, Callable

from .calls import CallFailed
from .kernel import Kernel
from .kernel.errors import Code, Error, KernelError
from .replication.reads import LINEARIZABLE, SEQUENTIAL

if TYPE_CHECKING:
    from .node import Node

log = logging.getLogger(__name__)

#: Seconds a read without a log entry may wait (for the leader's quorum round, the leader's
#: read index, or this replica to apply the index it needs) before it is refused UNAVAILABLE.
READ_WAIT = 2.0


class NodeReads:
    def __init__(self, node: Node) -> None:
        self.node = node
        self.changes = ObjectChanges()     # waiting readers: which objects entries change
        self.memo = ReadMemo()             # identical reader calls at one index share a run
        self.followed = 0                  # followed calls in flight (Gateway.follow; metrics)
        self.merged = 0                    # their answers sent in another's message (metrics)

    async def read(self, fn: Callable[[Kernel], Any], consistency: str = LINEARIZABLE,
                   min_index: int = 0, wait: float = READ_WAIT) -> tuple[Any, int]:
        """Run ``fn(kernel)`` against this replica's applied state, serialized with the
        applying of entries, without proposing anything; return (its value, the log index
        of the state it saw). ``fn`` must only read, and return a plain value.

        ``linearizable``: the state reflects every write acknowledged before this call
        (ReadIndex: the leader confirms its leadership with a quorum round started after
        the read arrived; a follower asks the leader for that index and waits to apply it).
        ``sequential``: this replica's state, once it has applied ``min_index`` (the highest
        index the client has seen), however recent the leader's is. Both wait at most
        ``wait`` seconds, then raise CallFailed(UNAVAILABLE) with the leader's address as a
        hint, so that the client tries another replica. A KernelError of ``fn`` is the
        read's error."""
        if consistency not in (LINEARIZABLE, SEQUENTIAL):
            raise CallFailed(Error(Code.INVALID_ARGUMENT, "consistency must be "
                                   f"'linearizable' or 'sequential', not {consistency!r}"))
        if self.node.replica is None or self.node._loop is None:
            raise CallFailed(Error(Code.UNAVAILABLE, "replica not started yet; retry",
                                   "NotStarted"))
        deadline = self.node._loop.time() + wait
        need = min_index
        if consistency == LINEARIZABLE:
            need = max(need, await self._read_index(wait))
        return await self._read_applied(need, fn, max(0.0, deadline - self.node._loop.time()),
                                        consistency)

    async def _read_index(self, wait: float) -> int:
        from .replication import ReplicaStopped
        loop = self.node._loop
        assert loop is not None
        fut: asyncio.Future[tuple[int | None, str | None]] = loop.create_future()

        def settle(index: int | None, reason: str | None) -> None:     # the tick thread
            loop.call_soon_threadsafe(_set_once, fut, (index, reason))
        try:
            self.node.replica.request_read_index(settle)
        except ReplicaStopped as e:
            raise CallFailed(Error(Code.UNAVAILABLE, f"replica cannot serve reads: {e}",
                                   "ReplicaStopped")) from None
        try:
            index, reason = await asyncio.wait_for(fut, wait)
        except TimeoutError:
            index, reason = None, f"no read index within {wait:g} s"
        if index is None:
            raise CallFailed(Error(Code.UNAVAILABLE, f"linearizable read refused: {reason}; "
                                   "retry", "NoReadIndex"), self.node._hint())
        return index

    async def _read_applied(self, need: int, fn: Callable[[Kernel], Any], wait: float,
                            consistency: str) -> tuple[Any, int]:
        loop = self.node._loop
        assert loop is not None
        fut: asyncio.Future[tuple[Any, int, BaseException | None]] = loop.create_future()
        here = threading.get_ident()

        def done(value: Any, index: int, error: BaseException | None) -> None:
            if threading.get_ident() == here:
                _set_once(fut, (value, index, error))
            else:                                                 # the tick thread
                loop.call_soon_threadsafe(_set_once, fut, (value, index, error))
        handle = self.node.replica.read_applied(need, lambda sm: fn(sm.kernel), done)
        try:
            value, index, error = await asyncio.wait_for(fut, wait) if not fut.done() \
                else fut.result()
        except TimeoutError:
            handle.cancelled = True
            applied = self.node.replica.applied_index()
            raise CallFailed(Error(Code.UNAVAILABLE, f"this replica has applied the log up to "
                                   f"{applied}, and the {consistency} read needs {need}: not "
                                   f"within {wait:g} s; retry another replica", "Lagging"),
                             self.node._hint()) from None
        except asyncio.CancelledError:
            handle.cancelled = True
            raise
        if error is not None:
            if isinstance(error, KernelError):
                raise CallFailed(error.error)
            if isinstance(error, CallFailed):
                raise error
            log.error("a read failed: %r", error, exc_info=error)
            raise CallFailed(Error(Code.INTERNAL, f"the server failed this read: "
                                   f"{type(error).__name__}", type(error).__name__))
        return value, index


class ObjectChanges:
    """Which objects the entries applied here change, for readers that wait (NotYet): such a
    reader runs again only after an entry that ran on its object, made it or removed it
    (Kernel.touched), not after every entry. The apply thread calls `applied` after each
    entry and `everything` when the state is replaced (a snapshot, a restore); readers wait
    on the event loop with `wait`. Only the names some reader waits for are looked at.

    A reader that waits for a topic (NotYet(topic): a Map's watch, for its prefix) sleeps
    on through entries on its object whose code announced changed topics (Kernel.topics),
    none of them starting with its own; an entry that announced none wakes it, as does a
    replaced state. A change to one key of a map watched by a thousand readers on other
    keys wakes the readers of that key only."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        # event loop only: name -> topic ("" for every change) -> the readers' futures
        self._waiters: dict[str, dict[str, list[asyncio.Future[int]]]] = {}
        self._names: frozenset[str] = frozenset()   # their names, read by the apply thread
        self._count = 0                  # readers waiting (metrics read it from their thread)
        self.wakes = 0                   # readers woken so far: each runs again (metrics)

    def applied(self, index: int, touched: set[str],
                topics: dict[str, list[str] | None] | None = None) -> None:
        """The apply thread: entry `index` ran on, made or removed `touched`; its object
        code announced `topics` changed (Kernel.topics: a dict the kernel does not reuse)."""
        names, loop = self._names, self._loop
        if not names or loop is None:
            return
        hit = names.intersection(touched)
        if hit:
            loop.call_soon_threadsafe(self._wake, hit, index, topics or {})

    def everything(self, index: int) -> None:
        """The apply thread: the whole state was replaced (at `index`)."""
        names, loop = self._names, self._loop
        if names and loop is not None:
            loop.call_soon_threadsafe(self._wake, names, index, {})

    def _wake(self, names: Any, index: int, topics: dict[str, list[str] | None]) -> None:
        for name in names:
            by_topic = self._waiters.get(name)
            if not by_topic:
                continue
            changed = topics.get(name)
            if not changed:               # nothing announced (or too much): wake them all
                for futs in by_topic.values():
                    self._wake_all(futs, index)
                continue
            self._wake_all(by_topic.get("", ()), index)
            for topic in _matching(by_topic, changed):
                self._wake_all(by_topic[topic], index)

    def _wake_all(self, futs: Any, index: int) -> None:
        for fut in futs:
            if not fut.done():
                fut.set_result(index)
                self.wakes += 1

    async def wait(self, name: str, after: int, applied: Callable[[], int],
                   timeout: float | None, topic: str | None = None) -> int | None:
        """Wait for an entry after index `after` that changes `name` (and, with `topic`,
        announced a changed topic starting with it, or none); its index, or None when
        `timeout` (seconds) passed first. `applied()` is this replica's applied index: an
        entry applied between the reader's run and this call may have changed the object
        unseen, so then the reader runs again at once (returns the applied index)."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        fut: asyncio.Future[int] = loop.create_future()
        key = topic or ""
        by_topic = self._waiters.setdefault(name, {})
        by_topic.setdefault(key, []).append(fut)
        self._names = frozenset(self._waiters)
        self._count += 1
        try:
            now = applied()
            if now > after:               # maybe changed before we were watching
                return now
            try:
                return await asyncio.wait_for(fut, timeout)
            except TimeoutError:
                return None
        finally:
            self._count -= 1
            futs = by_topic.get(key)
            if futs is not None:
                futs.remove(fut)
                if not futs:
                    del by_topic[key]
            if not by_topic and self._waiters.get(name) is by_topic:
                del self._waiters[name]
                self._names = frozenset(self._waiters)

    def waiting(self) -> int:
        """Readers waiting (tests, metrics)."""
        return self._count


class ReadMemo:
    """The answers of declared readers at the state of one applied index, for identical
    calls that come at that index: a change to a key watched by a hundred readers wakes a
    hundred identical `watch` calls, which then run once, and their re-arming calls too.
    A reader's answer depends on the state, the caller's user (its rights), the object, the
    method and the arguments, nothing else (sched.READING refuses context() in a reader), so
    calls equal in all of these get the same answer. Runs only under the apply lock (where
    readers run), so one thread at a time; holds the answers of one state, at most SIZE."""

    SIZE = 32

    def __init__(self) -> None:
        self._state: tuple[Any, int] = (None, -1)      # the kernel and its index
        self._answers: dict[Any, Any] = {}
        self.hits = 0                    # calls answered from the memo (tests, metrics)

    def get(self, kernel: Kernel, key: Any) -> Any:
        """The answer memoized for `key` at `kernel`'s current state, or None."""
        st = self._state
        if st[0] is not kernel or st[1] != kernel.index:
            return None
        got = self._answers.get(key)
        if got is not None:
            self.hits += 1
        return got

    def put(self, kernel: Kernel, key: Any, answer: Any) -> None:
        st = self._state
        if st[0] is not kernel or st[1] != kernel.index:
            self._state = (kernel, kernel.index)
            self._answers = {}
        elif len(self._answers) >= self.SIZE:
            del self._answers[next(iter(self._answers))]
        self._answers[key] = answer


#: Work bound of one entry's wake-ups on the event loop: past (changed topics) x (waited-for
#: topics) comparisons every reader of the object is woken instead (each runs again once).
MATCH_WORK = 200_000
SHORT_TOPIC = 128


def _matching(by_topic: dict[str, Any], changed: list[str]) -> Any:
    """The waited-for topics (non-empty) that some changed topic starts with: a short changed
    topic's prefixes looked up, else each waited-for topic tried; all of them past
    MATCH_WORK (an uploaded class may announce many long topics)."""
    if len(changed) * len(by_topic) > MATCH_WORK:
        return list(by_topic)
    out: set[str] = set()
    for c in changed:
        if len(c) <= SHORT_TOPIC and len(c) < len(by_topic):
            out.update(c[:i] for i in range(1, len(c) + 1) if c[:i] in by_topic)
        else:
            out.update(t for t in by_topic if t and c.startswith(t))
    return out


def _set_once(fut: asyncio.Future[Any], result: Any) -> None:
    if not fut.done():
        fut.set_result(result)

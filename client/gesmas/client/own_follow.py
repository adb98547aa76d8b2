"""A followed call on a Calls RPC of its own, read by the thread that iterates it (sync client).

On the client's shared Calls stream (``streams.CallStream``) each answer of a followed call
(a watch stream) is handed between threads once more than a call's: grpc's thread wakes the
stream's reader thread, which puts the answer on the follower's queue, whose thread takes
it. With a hundred watchers in a process that hand-over is a good part of what an answer
costs the client (docs/performance.md, "what a watcher costs beside bare gRPC"). Here the
followed call has an RPC to itself and ``next`` reads it on the caller's thread.

The rules do not change (``streams.FollowedAnswers``): the same answers, the same failures
(``core.Failure``: follow again elsewhere from the last cursor), and a deadline on each
answer. That deadline is kept by one thread per client (``Deadlines``), which cancels the
RPC of an answer overdue; ``next`` then raises ``streams.no_answer``. Closing the iterator
cancels the RPC, which withdraws the call on the replica.

Each such RPC is a stream of the HTTP/2 connection that every Client of a process shares
with a replica, and a replica takes at most 1,000 of those at once per connection (the
server's grpclimits.MAX_CONCURRENT_STREAMS; past it grpc queues further calls, which would
stall). So a process gives RPCs of their own to at most OWN_PER_REPLICA followed calls per
replica (``Slots``); further ones go on the shared stream as before.

Followed calls come here with GESMAS_FOLLOW_STREAM=own; by default they go on the process's
merged streams (merged_follow), and =shared keeps them on the client's shared stream.
"""
from __future__ import annotations

import heapq
import itertools
import os
import threading
import time
import weakref
from typing import Any, Callable, Iterator, Protocol

import grpc

from gesmas.client import core, exiting
from gesmas.client.errors import Unavailable
from gesmas.client.security import Login
from gesmas.client.streams import FollowedAnswers, call_message, no_answer, stream_failure

__all__ = ["Deadlines", "FOLLOW_STREAMS", "OwnFollowing", "OwnRpc", "SLOTS", "Slots",
           "OWN_PER_REPLICA", "follow_stream_setting"]

#: Followed calls on RPCs of their own per replica, in this process (see the module doc).
OWN_PER_REPLICA = 256


#: Where followed calls go (GESMAS_FOLLOW_STREAM): one stream per replica for the process,
#: with their answers merged (merged_follow, the default), an RPC of their own each (here),
#: or the client's shared Calls stream.
FOLLOW_STREAMS = ("merged", "own", "shared")


def follow_stream_setting() -> str:
    """Where followed calls go: GESMAS_FOLLOW_STREAM, one of FOLLOW_STREAMS ("merged" when
    unset)."""
    value = os.environ.get("GESMAS_FOLLOW_STREAM", "merged").strip().lower()
    if value not in FOLLOW_STREAMS:
        raise ValueError(f"GESMAS_FOLLOW_STREAM must be 'merged', 'own' or 'shared', "
                         f"not {value!r}")
    return value


class Slots:
    """How many followed calls of this process have an RPC of their own, per replica."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._taken: dict[str, int] = {}

    def take(self, address: str) -> bool:
        """One more at ``address``, unless it has ``limit``."""
        with self._lock:
            n = self._taken.get(address, 0)
            if n >= self.limit:
                return False
            self._taken[address] = n + 1
            return True

    def give(self, address: str) -> None:
        with self._lock:
            n = self._taken.get(address, 0) - 1
            if n > 0:
                self._taken[address] = n
            else:
                self._taken.pop(address, None)

    def taken(self, address: str) -> int:
        with self._lock:
            return self._taken.get(address, 0)


SLOTS = Slots(OWN_PER_REPLICA)


class OwnRpc:
    """A Calls RPC of its own, read by its caller's thread (``OwnFollowing``,
    ``thread_streams.ThreadStream``): where it goes, its login, the fields ``Deadlines``
    keeps under its lock (when the awaited answer is due, whether the RPC is in its heap,
    whether it passed), and its reading. The subclass opens ``_rpc``."""
    _rpc: Any

    def __init__(self, address: str, metadata: tuple[tuple[str, str], ...], login: Login,
                 deadlines: Deadlines) -> None:
        self.address = address
        self.metadata = metadata
        self._login = login
        self._deadlines = deadlines
        self.due: float | None = None
        self.queued = False
        self.timed_out = False

    def _next_answer(self) -> Any:
        """The RPC's next CallAnswer, or the failure it ended with (``core.Failure``, or
        ``Unsupported`` from a replica without the Calls stream)."""
        try:
            return next(self._rpc)
        except StopIteration:
            return core.Failure(Unavailable(f"{self.address}: the call stream ended"))
        except grpc.RpcError as e:
            return stream_failure(e, self.address, self._login, self.metadata)


class OwnFollowing(FollowedAnswers, OwnRpc):
    """One followed call alone on a Calls RPC to ``address``; it is its own stream for
    ``FollowedAnswers`` (address, login, metadata). It holds one of ``SLOTS`` at
    ``address``, which its maker took, until it ends; ``on_end`` is told then, once."""

    def __init__(self, stub: Any, address: str, metadata: tuple[tuple[str, str], ...],
                 login: Login, max_message: int, request: Any, argument: str, key: str,
                 deadline: float | None, deadlines: Deadlines,
                 on_end: Callable[[OwnFollowing], None]) -> None:
        FollowedAnswers.__init__(self, self, deadline)
        OwnRpc.__init__(self, address, metadata, login, deadlines)
        self._on_end = on_end
        self._ended = False
        msg = call_message(request, deadline, max_message)
        msg.follow.argument, msg.follow.key = argument, key
        msg.id = self.id = 1
        self._half_close = threading.Event()
        self._rpc = stub.Calls(self._messages(msg), metadata=metadata)

    def _messages(self, msg: Any) -> Iterator[Any]:
        yield msg
        self._half_close.wait()          # grpc's request thread parks here until the end
        exiting.ending()                 # and ends: a program's exit waits for it

    def next(self) -> Any:
        """The next InvokeResponse; raises as ``CallStream.call`` does (``core.Failure``:
        follow again elsewhere, from the last answer's cursor), ``no_answer`` past the
        deadline."""
        if self.deadline is not None:
            self._deadlines.arm(self, self.deadline)
        answer = self._next_answer()
        if self.deadline is not None and self._deadlines.disarm(self):
            self.close()                 # late: the replica is a suspect, as on a shared
            raise no_answer(self.address, self.deadline)   # stream (the answer is dropped)
        try:
            return self.taken(answer)
        finally:
            if self.finished:
                self._end()

    def cancel(self) -> None:
        """End the RPC now (the replica is unresponsive, the client closes): ``next`` fails
        with ``core.Failure``."""
        self._rpc.cancel()

    def close(self) -> None:
        """Withdraw the call (cancel its RPC), unless it ended."""
        if not self.finished:
            self.finished = True
            self._rpc.cancel()
        self._end()

    def _end(self) -> None:
        if not self._ended:
            self._ended = True
            self._half_close.set()
            SLOTS.give(self.address)
            self._on_end(self)


class Timed(Protocol):
    """What ``Deadlines`` keeps: an RPC awaiting an answer (an ``OwnFollowing``, a
    ``thread_streams.ThreadStream``); the fields are Deadlines' own, under its lock."""
    due: float | None
    queued: bool
    timed_out: bool
    finished: bool

    def cancel(self) -> None: ...


class Deadlines:
    """Cancels the RPC of each ``OwnFollowing`` or ``ThreadStream`` whose awaited answer is
    overdue, from one thread (started at the first deadline). A call writes when its answer
    is due (``arm``) and clears it when it comes (``disarm``); the thread keeps one heap
    entry per RPC and, when an entry's time comes, looks at what is due then, so an answer
    costs no wake-up of this thread (about one per deadline's length and RPC)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        # weakly: a stream its thread dropped ends (its RPC, its slot) without waiting here
        self._heap: list[tuple[float, int, weakref.ref[Timed]]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._closed = False

    def arm(self, following: Timed, seconds: float) -> None:
        due = time.monotonic() + seconds
        with self._cond:
            following.due = due
            if following.queued or self._closed:
                return
            following.queued = True
            heapq.heappush(self._heap, (due, next(self._seq), weakref.ref(following)))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="gesmas-deadlines",
                                                daemon=True)
                self._thread.start()
            elif self._heap[0][2]() is following:
                self._cond.notify()

    def disarm(self, following: Timed) -> bool:
        """The awaited answer came (or the RPC ended): whether it came too late (the RPC
        was cancelled for it)."""
        with self._cond:
            following.due = None
            return following.timed_out

    def _run(self) -> None:
        while True:
            overdue: list[Timed] = []
            with self._cond:
                while not overdue:
                    if self._closed:
                        return
                    now = time.monotonic()
                    if not self._heap:
                        self._cond.wait()
                        continue
                    if self._heap[0][0] > now:
                        self._cond.wait(self._heap[0][0] - now)
                        continue
                    _, _, ref = heapq.heappop(self._heap)
                    f = ref()
                    if f is None:
                        continue
                    if f.due is not None and f.due > now and not f.finished:
                        heapq.heappush(self._heap, (f.due, next(self._seq), ref))   # re-armed
                        continue
                    f.queued = False
                    if f.due is not None and not f.finished:
                        f.timed_out = True
                        overdue.append(f)
            for f in overdue:
                f.cancel()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

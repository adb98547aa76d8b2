"""A thread's calls on a Calls RPC of its own, each answer read by that thread (sync client).

On the client's shared Calls stream (``streams.CallStream``) an answer crosses one thread
more than the call needs: grpc's thread hands it to the stream's reader thread, which
resolves the caller's future, whose thread then wakes. A synchronous caller has one call in
flight at a time, so once a thread has made a few calls to a replica it gets a Calls RPC of
its own there (``ThreadStream``), on which it sends each call and reads the answer itself:
one thread wake-up less per call, 5-10 % of a short read's round trip on this host
(docs/performance.md, "A thread's calls on an RPC of its own").

The rules of a call do not change (those of ``CallStream.call``): the answer or the error
the replica stated; ``core.Failure`` when the call may be sent again elsewhere with the same
seq (the RPC ended or broke, no answer within the call's deadline); a caller that gives up
(KeyboardInterrupt and the like) cancels the RPC, which withdraws its call on the replica.
The deadline is kept by the client's ``own_follow.Deadlines`` thread, which cancels the RPC
of an answer overdue. An RPC that ended is replaced at the thread's next call.

Each such RPC is a stream of the HTTP/2 connection every Client of a process shares with a
replica, and holds grpc's request thread while it lives: a process gives them to at most
``PER_REPLICA`` threads per replica (``SLOTS``), and only from a thread's ``AFTER``-th call
to that replica, so a thread that makes one call and ends costs no RPC; the other calls go
on the shared stream. The RPC ends with its thread (``weakref.finalize``), when the client
closes (half-closed: the call in flight is answered) or finds the replica unresponsive
(cancelled).

GESMAS_THREAD_STREAM=shared sends every call on the shared stream (to compare).
"""
from __future__ import annotations

import itertools
import os
import queue
import threading
import weakref
from typing import Any, Callable, Iterator

from gesmas.client import core, exiting
from gesmas.client.errors import Unavailable
from gesmas.client.own_follow import Deadlines, OwnRpc, Slots
from gesmas.client.security import Login
from gesmas.client.session import ClientClosed
from gesmas.client.streams import call_message, ended, no_answer, response

__all__ = ["AFTER", "PER_REPLICA", "SLOTS", "ThreadStream", "ThreadStreams",
           "thread_stream_setting"]

#: Threads of this process with a Calls RPC of their own, per replica (see the module doc).
PER_REPLICA = 128
#: A thread's calls to a replica before it gets one (its first ones go on the shared stream).
AFTER = 2

SLOTS = Slots(PER_REPLICA)


def thread_stream_setting() -> bool:
    """Whether threads get Calls RPCs of their own: yes unless GESMAS_THREAD_STREAM is
    "shared"."""
    value = os.environ.get("GESMAS_THREAD_STREAM", "own").strip().lower()
    if value not in ("own", "shared"):
        raise ValueError(f"GESMAS_THREAD_STREAM must be 'own' or 'shared', not {value!r}")
    return value == "own"


def _messages(outgoing: queue.SimpleQueue[Any]) -> Iterator[Any]:
    """The RPC's requests (grpc's request thread iterates it); None half-closes. It holds
    the queue, not the ThreadStream, so that a thread's end can free its stream."""
    while True:
        msg = outgoing.get()
        if msg is None:
            exiting.ending()             # grpc's request thread: a program's exit waits
            return
        yield msg


def _release(outgoing: queue.SimpleQueue[Any], address: str) -> None:
    """Half-close the RPC (grpc's request thread ends) and give its slot back; run once."""
    outgoing.put(None)
    SLOTS.give(address)


class ThreadStream(OwnRpc):
    """One thread's Calls RPC to ``address``, authenticated by ``metadata``, carrying that
    thread's calls one at a time. It holds one of ``SLOTS`` at ``address``, which its maker
    took, until it ends."""

    def __init__(self, stub: Any, address: str, metadata: tuple[tuple[str, str], ...],
                 login: Login, max_message: int, deadlines: Deadlines) -> None:
        super().__init__(address, metadata, login, deadlines)
        self.max_message = max_message
        self.finished = False            # no call will come (Deadlines reads it too)
        self._ids = itertools.count(1)
        outgoing: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._outgoing = outgoing
        self._rpc = stub.Calls(_messages(outgoing), metadata=metadata)
        self._release = weakref.finalize(self, _release, outgoing, address)

    @property
    def usable(self) -> bool:
        return not self.finished

    def call(self, request: Any, deadline: float | None) -> Any:
        """Send the InvokeRequest and read its InvokeResponse on this thread; raises as
        ``CallStream.call`` does. ``deadline`` in seconds (None: as long as the replica
        holds the call)."""
        msg = call_message(request, deadline, self.max_message)
        if self.finished:
            raise ended(self.address, None)
        msg.id = next(self._ids)
        self._outgoing.put(msg)
        if deadline is not None:
            self._deadlines.arm(self, deadline)
        try:
            answer = self._next_answer()
        except BaseException:            # KeyboardInterrupt and the like: withdraw the call
            self._disarm(deadline)
            self.cancel()
            raise
        if self._disarm(deadline):       # late: the RPC was cancelled for it
            self.cancel()
            raise no_answer(self.address, deadline)
        if isinstance(answer, BaseException):
            self.finish()
            raise answer
        if answer.id != msg.id or answer.more:   # a replica that broke the protocol
            self.cancel()
            raise core.Failure(Unavailable(
                f"{self.address}: answered call {answer.id} (more={answer.more}) on a "
                f"stream that carried call {msg.id}"))
        return response(answer, self.address, self._login, self.metadata)

    def _disarm(self, deadline: float | None) -> bool:
        return deadline is not None and self._deadlines.disarm(self)

    def finish(self) -> None:
        """Half-close: the call in flight is answered, then the RPC ends."""
        self.finished = True
        self._release()

    def cancel(self) -> None:
        """End the RPC now: the call in flight fails (and is withdrawn on the replica)."""
        self.finished = True
        self._rpc.cancel()
        self._release()


class ThreadStreams:
    """A client's ``ThreadStream``s: the calling thread's, by replica (``get``), and all of
    them, weakly, for the client to end (``end``)."""

    def __init__(self, login: Login, max_message: int, deadlines: Deadlines) -> None:
        self._login = login
        self._max_message = max_message
        self._deadlines = deadlines
        self._local = threading.local()
        self._lock = threading.Lock()
        self._all: dict[str, weakref.WeakSet[ThreadStream]] = {}
        self._closed = False

    def get(self, address: str, metadata: tuple[tuple[str, str], ...],
            stub: Callable[[str], Any]) -> ThreadStream | None:
        """The calling thread's stream to ``address`` opened with ``metadata`` (one opened
        with an older login is finished and replaced), or None: the shared stream carries
        the call (the thread's first calls there, no slot left). ``stub(address)`` gives
        the stub to open one with; raises ClientClosed once the client is closed."""
        local = self._local
        streams: dict[str, ThreadStream] | None = getattr(local, "streams", None)
        if streams is None:
            streams = local.streams = {}
            local.calls = {}
        stream = streams.get(address)
        if stream is not None:
            if stream.usable and stream.metadata == metadata:
                return stream
            del streams[address]
            stream.finish()
        calls = local.calls[address] = local.calls.get(address, 0) + 1
        if calls < AFTER or not SLOTS.take(address):
            return None
        try:
            stream = ThreadStream(stub(address), address, metadata, self._login,
                                  self._max_message, self._deadlines)
        except BaseException:
            SLOTS.give(address)
            raise
        with self._lock:
            closed = self._closed
            if not closed:
                self._all.setdefault(address, weakref.WeakSet()).add(stream)
        if closed:
            stream.finish()
            raise ClientClosed()
        streams[address] = stream
        return stream

    def end(self, address: str | None = None, cancel: bool = False) -> None:
        """End the streams to ``address`` (None: every stream, and no more are opened):
        half-closed (their calls in flight are answered), or with ``cancel`` cancelled
        (those calls fail, to be sent elsewhere)."""
        with self._lock:
            if address is None:
                self._closed = True
                ended_, self._all = list(self._all.values()), {}
            else:
                ended_ = [self._all.pop(address, weakref.WeakSet())]
        for streams in ended_:
            for stream in list(streams):
                if cancel:
                    stream.cancel()
                else:
                    stream.finish()

"""Invocations over the ``Calls`` stream (synchronous client).

A ``Client`` keeps one ``CallStream`` per replica it invokes on and sends each invocation
as a message on it, which costs the client and the replica less than a unary ``Invoke``
(see ``gesmas.server.streams``). The rules of a call do not change: ``CallStream.call``
raises ``core.Failure`` when the call may be retried elsewhere with the same seq (the stream
broke, the replica did not answer within the call's deadline, the answer is UNAVAILABLE) and
the ``GesmasError`` the replica stated otherwise, exactly as a unary attempt does.

Threads: callers put ``Call`` messages on a queue that grpc's request thread sends; one
reader thread per stream takes the answers and resolves the callers' futures by id. When
the stream ends, every call still waiting on it fails with ``Failure`` at once (fail-over),
and the stream is replaced at the next call. A caller that gives up on a call (its deadline,
an exception such as KeyboardInterrupt) sends a cancel for it, which withdraws its wait on
the replica.
"""
from __future__ import annotations

import contextvars
import itertools
import queue
import threading
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Iterator

import grpc

from gesmas.client import core, exiting
from gesmas.client.errors import ResourceExhausted, Unavailable, error_from_detail
from gesmas.client.security import Login
from gesmas.v1 import gesmas_pb2 as pb

__all__ = ["CallStream", "FollowedAnswers", "next_cursor", "Following", "Unsupported",
           "call_message", "ended", "stream_failure", "response", "no_answer", "pick_stream",
           "settled", "CALLS_PER_STREAM"]

#: Calls in flight on one Calls stream before the client opens another to the same replica
#: (a replica takes 1000 at a time from one stream: gesmas.server.streams.MAX_IN_FLIGHT).
CALLS_PER_STREAM = 900


class Unsupported(Exception):
    """The replica does not know the Calls stream (an older version): use unary Invoke."""


# -- the rules of a stream call, shared with gesmas.aio.streams (no I/O) -----------------------

def call_message(request: Any, deadline: float | None, max_message: int) -> Any:
    """The Call carrying ``request``; one over the size limit is refused here, since sent it
    would end the stream with every call on it."""
    msg = pb.Call(invoke=request, deadline=deadline or 0.0)
    size = msg.ByteSize() + 16                  # with the id
    if size > max_message:
        raise ResourceExhausted(f"the call's message is {size} bytes, over the "
                                f"{max_message} byte limit")
    return msg


def ended(address: str, broken: BaseException | None) -> BaseException:
    """What a call on a stream that cannot take it raises."""
    if isinstance(broken, Unsupported):
        return Unsupported(str(broken))
    if isinstance(broken, core.Failure) and broken.unreachable:   # say why: refused, ...
        return core.Failure(broken.error, unreachable=True)
    return core.Failure(Unavailable(f"{address}: the call stream ended"))


def stream_failure(e: grpc.RpcError, address: str, login: Login,
                   metadata: tuple[tuple[str, str], ...]) -> BaseException:
    """What the calls of a stream that ended with ``e`` fail with: Unsupported (an older
    replica), else a Failure (retried elsewhere with the same seq)."""
    if e.code() == grpc.StatusCode.UNIMPLEMENTED:
        return Unsupported(f"{address} does not serve the Calls stream")
    failure = core.classify(e, address, login, metadata)
    if not isinstance(failure, core.Failure):   # the RPC itself was refused
        failure = core.Failure(Unavailable(f"{address}: {failure}"))
    return failure


def response(answer: Any, address: str, login: Login,
             metadata: tuple[tuple[str, str], ...]) -> Any:
    """The InvokeResponse of ``answer``, or the error it carries, classified as for unary."""
    if answer.HasField("error"):
        raise core.classify_error(error_from_detail(answer.error), address, login, metadata)
    return answer.response


def settled(answer: Any, pending: dict[int, Any]) -> list[Any]:
    """What ``answer`` settles among ``pending`` (call id to its future or Following): its
    call's (taken out of ``pending`` unless more answers come), and with ``also`` (merged:
    Follow.merge) those of the other followed calls it answers too."""
    if not answer.more:
        fut = pending.pop(answer.id, None)
        return [] if fut is None else [fut]
    ids = (answer.id, *answer.also) if answer.also else (answer.id,)
    return [f for f in map(pending.get, ids) if f is not None]


def no_answer(address: str, deadline: float | None) -> core.Failure:
    return core.Failure(Unavailable(f"{address}: no answer within {deadline:g} s"),
                        unresponsive=True)


def pick_stream(pool: list[Any], metadata: tuple[tuple[str, str], ...]) -> Any | None:
    """The least busy stream of ``pool`` opened with ``metadata`` and with room for a call;
    streams that ended or carry older credentials are finished and dropped (a stream's
    metadata is fixed when it opens: after a new login the older ones finish their calls).
    None: open a new one."""
    best = None
    for stream in list(pool):
        if not stream.usable or stream.metadata != metadata:
            stream.finish()
            pool.remove(stream)
        elif best is None or stream.in_flight < best.in_flight:
            best = stream
    return best if best is not None and best.in_flight < CALLS_PER_STREAM else None


class CallStream:
    """One ``Calls`` RPC to the replica at ``address``, authenticated by ``metadata``."""

    def __init__(self, stub: Any, address: str, metadata: tuple[tuple[str, str], ...],
                 login: Login, max_message: int) -> None:
        self.address = address
        self.max_message = max_message
        self.metadata = metadata
        self._login = login
        self._outgoing: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._pending: dict[int, Future[Any]] = {}
        self._ids = itertools.count(1)
        self.broken: BaseException | None = None
        self._closing = False
        self._rpc = stub.Calls(self._messages(), metadata=metadata)
        self._reader = threading.Thread(target=self._read, name=f"gesmas-calls-{address}",
                                        daemon=True)
        self._reader.start()

    def _messages(self) -> Iterator[Any]:
        while True:
            msg = self._outgoing.get()
            if msg is None:
                exiting.ending()         # grpc's request thread: a program's exit waits
                return
            yield msg

    def _read(self) -> None:
        failure: BaseException
        try:
            for answer in self._rpc:
                with self._lock:
                    futs = settled(answer, self._pending)
                for fut in futs:
                    fut.set_result(answer)
            failure = core.Failure(Unavailable(f"{self.address}: the call stream ended"))
        except grpc.RpcError as e:
            failure = stream_failure(e, self.address, self._login, self.metadata)
        except BaseException as e:                         # pragma: no cover - a bug
            failure = core.Failure(Unavailable(f"{self.address}: call stream failed: {e!r}"))
        with self._lock:
            self.broken = failure
            pending, self._pending = self._pending, {}
        self._outgoing.put(None)        # ends grpc's request thread
        for fut in pending.values():
            fut.set_exception(failure)

    def call(self, request: Any, deadline: float | None) -> Any:
        """Send the InvokeRequest and return its InvokeResponse; ``deadline`` in seconds
        (None: wait as long as the replica holds the call)."""
        msg = call_message(request, deadline, self.max_message)
        fut: Future[Any] = Future()
        with self._lock:       # with the put: no message goes after finish()'s end mark
            if self.broken is not None or self._closing:
                raise ended(self.address, self.broken)
            call_id = msg.id = next(self._ids)
            self._pending[call_id] = fut
            self._outgoing.put(msg)
        try:
            answer = fut.result(timeout=deadline)
        except FutureTimeout:
            self._withdraw(call_id)
            raise no_answer(self.address, deadline) from None
        except (core.Failure, Unsupported):
            raise
        except BaseException:           # KeyboardInterrupt and the like: withdraw the wait
            self._withdraw(call_id)
            raise
        return response(answer, self.address, self._login, self.metadata)

    def follow(self, request: Any, argument: str, key: str, deadline: float | None,
               following: Following | None = None) -> tuple[Following, Any]:
        """Send the InvokeRequest of a declared reader as a followed call (Call.follow) and
        return (its Following, its first InvokeResponse); ``deadline`` bounds that first
        answer, and each later one (``Following.next``); ``following`` is made here unless
        given (made for this stream). Its answers may come merged with other follows' on
        this stream (Follow.merge: the reader thread hands each its copy)."""
        msg = call_message(request, deadline, self.max_message)
        msg.follow.argument, msg.follow.key, msg.follow.merge = argument, key, True
        if following is None:
            following = Following(self, deadline)
        with self._lock:
            if self.broken is not None or self._closing:
                raise ended(self.address, self.broken)
            call_id = msg.id = following.id = next(self._ids)
            self._pending[call_id] = following      # type: ignore[assignment]
            self._outgoing.put(msg)
        try:
            starting(following)
            return following, following.next()
        except BaseException:
            following.close()
            raise

    def _withdraw(self, call_id: int) -> None:
        with self._lock:
            if self._pending.pop(call_id, None) is not None and self.broken is None \
                    and not self._closing:
                self._outgoing.put(pb.Call(id=call_id, cancel=True))

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    @property
    def usable(self) -> bool:
        return self.broken is None and not self._closing

    def finish(self) -> None:
        """Half-close: the calls in flight are answered, then the RPC ends."""
        with self._lock:
            if not self._closing:
                self._closing = True
                self._outgoing.put(None)
        exiting.ending(self._reader)     # reads the RPC's end next: a program's exit waits

    def cancel(self) -> None:
        """End the RPC now: its calls in flight fail (and are withdrawn on the replica)."""
        self._rpc.cancel()
        exiting.ending(self._reader)


class FollowStopped(Exception):
    """The handle of a followed call was stopped before its first answer."""


class FollowHandle:
    """A way to end a followed call from another thread (``Client._follow``'s ``handle``):
    ``stop`` cancels the follow under way (also while its first answer is awaited: the
    transport tells the handle of the calling thread, ``starting``), and the follow's
    generator returns instead of following again. What a ``MapMirror`` closes its watch
    with."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.stopped = False
        self._current: Any = None

    def started(self, following: Any) -> bool:
        """Note the follow under way; False if ``stop`` came first (end it, do not read)."""
        with self._lock:
            if self.stopped:
                return False
            self._current = following
            return True

    def stop(self) -> None:
        with self._lock:
            self.stopped = True
            following, self._current = self._current, None
        if following is not None:
            following.cancel()


#: The FollowHandle of the followed call this thread is starting (``Client._follow``).
STARTING: contextvars.ContextVar[FollowHandle | None] = contextvars.ContextVar(
    "gesmas_follow_handle", default=None)


def starting(following: Any) -> None:
    """``following`` is about to await its first answer: its thread's handle (if any)
    notes it, so that a stop cancels it; FollowStopped if the handle was stopped."""
    handle = STARTING.get()
    if handle is not None and not handle.started(following):
        raise FollowStopped()


def next_cursor(value: Any, key: str, finished: bool, label: str) -> tuple[bool, Any]:
    """(whether ``value``, an answer of the followed reader ``label``, gives a cursor, the
    cursor). An answer without one ends the follow: the replica says so next (its error),
    unless nothing more comes (a replica that answered once), and then this raises."""
    if type(value) is dict and key in value:
        return True, value[key]
    if finished:
        raise TypeError(f"{label} answered {type(value).__name__}, not a dict with the key "
                        f"{key!r}: it cannot be followed")
    return False, None


class FollowedAnswers:
    """What the sync and asyncio ``Following`` share: the rules of a followed call's
    answers (``taken``) and its withdrawal (``close``)."""

    def __init__(self, stream: Any, deadline: float | None) -> None:
        self.stream = stream
        self.deadline = deadline
        self.id = 0
        self.finished = False

    def taken(self, answer: Any) -> Any:
        """The InvokeResponse of ``answer`` (a CallAnswer, or the failure the stream ended
        with), which it raises as ``CallStream.call`` does; ``finished`` once no more come."""
        if isinstance(answer, BaseException):
            self.finished = True
            raise answer
        if not answer.more:
            self.finished = True
        stream = self.stream
        return response(answer, stream.address, stream._login, stream.metadata)

    def close(self) -> None:
        """Withdraw the call on the replica, unless it ended."""
        if not self.finished:
            self.finished = True
            self.stream._withdraw(self.id)


class Following(FollowedAnswers):
    """The answers of a followed call (``CallStream.follow``), in order: the stream's reader
    thread puts them (``set_result``, as on a Future), the caller takes them with ``next``.
    ``finished`` once an answer without ``more`` came (an error, or a replica that does not
    follow: it answered once), or the stream ended."""

    def __init__(self, stream: CallStream, deadline: float | None) -> None:
        super().__init__(stream, deadline)
        self._answers: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def set_result(self, answer: Any) -> None:
        self._answers.put(answer)

    def set_exception(self, failure: BaseException) -> None:
        self._answers.put(failure)

    def cancel(self) -> None:
        """End it now (its client closes, found the replica unresponsive, or its follower
        stops): the call is withdrawn and the next answer is a ``core.Failure`` (follow
        again, elsewhere, unless the follower stopped)."""
        if not self.finished:
            self.stream._withdraw(self.id)
        self.set_exception(core.Failure(Unavailable(f"{self.stream.address}: the follow was "
                                                    "ended by its client")))

    def next(self) -> Any:
        """The next InvokeResponse; raises as ``CallStream.call`` does (``core.Failure``:
        follow again elsewhere, from the last answer's cursor), ``no_answer`` past the
        deadline."""
        try:
            answer = self._answers.get(timeout=self.deadline)
        except queue.Empty:
            self.close()
            raise no_answer(self.stream.address, self.deadline) from None
        return self.taken(answer)

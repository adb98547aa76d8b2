"""The Calls stream: invocations as messages on one long-lived gRPC stream.

A unary Invoke costs the replica a new HTTP/2 stream, a call object, a task and their
teardown in grpc's aio layer, about 150 µs of the event loop's CPU per call on this
project's test machine (docs/performance.md, "Calls on one stream"). A client that keeps one
`Calls` stream per replica sends each invocation as a `Call` message instead and gets a
`CallAnswer` back under the id it chose.

Theory of operation. One `CallStream` per RPC, all on the event loop:

- the reader (`_read`) takes messages in arrival order. An invocation starts a task
  (`_one`) that does exactly what the unary Invoke does (`Gateway._invoke`: the same
  validation, authentication from the stream's metadata, command, exactly-once); a cancel
  cancels the task of that id. While `MAX_IN_FLIGHT` calls of the stream are unanswered the
  reader stops reading, so HTTP/2 flow control holds the peer back;
- each finished call queues its answer; the writer (`serve`'s loop) writes them one at a
  time, in completion order. `write` returns once the core has taken the message, so a peer
  that does not read stalls the writer, not the replica's memory: the answers queued behind
  it are bounded by `MAX_IN_FLIGHT` and, in bytes, by `answer_budget` (an answer that would
  go over it is replaced by UNAVAILABLE "AnswerBudget", which the client retries with the
  same seq and the kernel answers from the stored result, as for the unary AnswerBudget);
- a call's own deadline (`Call.deadline`) withdraws it when it passes (UNAVAILABLE
  "CallDeadline": retried like a gRPC deadline);
- a followed call (`Call.follow`: a declared reader with a cursor, a Map's watch) stays in
  flight and is answered again at each change (`_follow`, `Gateway.follow`), each answer
  with `more` set and written before the reader runs again, so a peer that does not read
  holds back its own follows, one answer each; it ends with an error answer (its cancel,
  the replica stopping, an AnswerBudget) after which the peer follows again from its last
  answer's cursor: a watch stream, one message per change instead of an answer and a
  re-armed call;
- the peer half-closes: the calls in flight finish and are answered, then the RPC ends. The
  RPC is cancelled or breaks: every call in flight is cancelled, which withdraws its wait in
  the kernel (`Node.call` proposes a Cancel), as for a cancelled unary Invoke;
- the replica stops (`Gateway.stopping`): the reader stops, the calls in flight are answered
  UNAVAILABLE "Stopping" (`Node.serve`; the client retries them elsewhere, where they join
  their waits), then the RPC ends, before grpc's grace runs out.

Calls of all streams of the replica count together against `--max-stream-calls`
(`NodeConfig.max_stream_calls`, 150,000 by default: the default quota of waiting calls,
100,000, and room for the calls that do not wait; `Gateway.stream_calls`): over it a call is answered RESOURCE_EXHAUSTED at once. A call on
a stream costs the replica less than a unary call (no core call object): ~5 KB against ~20.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import TYPE_CHECKING, Any, NoReturn

import grpc

from gesmas.v1 import gesmas_pb2 as pb

from . import grpclimits, wire
from .calls import CallFailed
from .kernel.errors import Code, Error

if TYPE_CHECKING:  # pragma: no cover
    from .gateway import Gateway

log = logging.getLogger(__name__)

#: Calls of one stream that may be unanswered at once; the reader waits below it.
MAX_IN_FLIGHT = grpclimits.MAX_CONCURRENT_STREAMS
CANCELLED = Error(Code.ABORTED, "cancelled by the caller", "Cancelled")
#: A deadline beyond this many seconds is refused (it would overflow timers).
MAX_DEADLINE = 10.0 ** 8

#: Calls of a stream that ends cancelled per turn of the event loop: a stream that breaks
#: with 20,000 waiting calls would otherwise hold the loop for about a second at once
#: (each cancelled call runs its end), and keep-alives waiting behind it would be late.
CANCEL_SLICE = 64
_CANCELLING: set[asyncio.Task[None]] = set()     # _cancel_slices tasks (kept referenced)


async def _cancel_slices(tasks: list[asyncio.Task[Any]]) -> None:
    for i in range(0, len(tasks), CANCEL_SLICE):
        await asyncio.sleep(0)    # the ends before run, and whatever else is ready (keep-alives)
        for task in tasks[i:i + CANCEL_SLICE]:
            task.cancel()


class _Merged:
    """Followed answers of one stream that are one message (`CallStream._send_merged`): the
    response they share and the ids it answers; `sent` when written (or failed)."""
    __slots__ = ("response", "ids", "sent", "flushed")

    def __init__(self, response: Any) -> None:
        self.response = response
        self.ids: list[int] = []
        self.sent: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.flushed = False


class CallStream:
    def __init__(self, gateway: Gateway, context: grpc.aio.ServicerContext,
                 answer_budget: int) -> None:
        self.gateway = gateway
        self.context = context
        self.answer_budget = answer_budget
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.withdrawn: set[int] = set()       # ids cancelled by the peer
        self.senders: set[asyncio.Task[None]] = set()   # answers of refused calls
        self.sending: set[int] = set()         # calls whose answer went to _send
        self.merging: dict[int, _Merged] = {}  # _send_merged's batches, by id(response)
        self.write_lock = asyncio.Lock()       # grpc.aio: one write at a time
        self.queued_bytes = 0                  # answers waiting for the write lock
        self.in_flight = 0                     # calls taken and not yet written
        self.room = asyncio.Event()
        self.room.set()
        self.finished = asyncio.Event()        # nothing more to read, nothing in flight
        self.reading = True
        self.closed = False

    async def serve(self) -> None:
        reader = asyncio.create_task(self._read())
        finished = asyncio.create_task(self.finished.wait())
        stopping = asyncio.create_task(self.gateway.stopping.wait())
        try:
            await asyncio.wait((finished, stopping), return_when=asyncio.FIRST_COMPLETED)
            if not self.finished.is_set():    # the replica stops: read no more calls, answer
                reader.cancel()                 # those in flight (Node.serve fails them)
                await finished
        except asyncio.CancelledError:
            # grpc cancels the RPC when its client goes away; a client told "Stopping" does
            # so at once, and its retry elsewhere is the expected end, not an error (grpc
            # logs a cancellation that leaves the servicer as an unhandled exception)
            if not self.gateway.stopping.is_set():
                raise
        finally:
            finished.cancel()
            stopping.cancel()
            self.closed = True
            reader.cancel()
            tasks = [*self.tasks.values(), *self.senders]
            for task in tasks[:CANCEL_SLICE]:
                task.cancel()             # each proposes a Cancel of its wait (Node.call)
            if len(tasks) > CANCEL_SLICE:     # thousands: a slice per turn of the event loop
                canceller = asyncio.get_running_loop().create_task(
                    _cancel_slices(tasks[CANCEL_SLICE:]))
                _CANCELLING.add(canceller)
                canceller.add_done_callback(_CANCELLING.discard)
            self.gateway.stream_calls -= self.in_flight
            self.in_flight = 0

    def _answered(self) -> None:
        if self.closed:
            return
        self.in_flight -= 1
        self.gateway.stream_calls -= 1
        if self.in_flight < MAX_IN_FLIGHT:
            self.room.set()
        if not self.in_flight and not self.reading:
            self.finished.set()

    async def _read(self) -> None:
        try:
            while True:
                if self.in_flight >= MAX_IN_FLIGHT:
                    self.room.clear()
                    await self.room.wait()
                msg = await self.context.read()
                if msg is grpc.aio.EOF:
                    return
                self._take(msg)
        finally:
            self.reading = False
            if not self.in_flight:
                self.finished.set()

    def _take(self, msg: Any) -> None:
        if msg.cancel:
            task = self.tasks.get(msg.id)
            if task is not None:
                self.withdrawn.add(msg.id)
                task.cancel()
            return
        self.in_flight += 1
        self.gateway.stream_calls += 1
        problem = None
        if not msg.HasField("invoke"):
            problem = Error(Code.INVALID_ARGUMENT, "a Call carries an invoke or a cancel")
        elif msg.id in self.tasks:
            problem = Error(Code.INVALID_ARGUMENT, f"call id {msg.id} is already in flight "
                            "on this stream")
        elif not 0 <= msg.deadline <= MAX_DEADLINE:
            problem = Error(Code.INVALID_ARGUMENT, f"deadline must be 0 (none) to "
                            f"{MAX_DEADLINE:g} seconds, not {msg.deadline}")
        elif self.gateway.stream_calls > self.gateway.max_stream_calls:
            problem = Error(Code.RESOURCE_EXHAUSTED, f"this replica serves "
                            f"{self.gateway.max_stream_calls} stream calls at once "
                            "(--max-stream-calls): retry later", "TooManyCalls")
        if problem is not None:
            task = asyncio.create_task(self._send(self._failure(msg, problem)))
            self.senders.add(task)
            task.add_done_callback(self.senders.discard)
            return
        task = asyncio.create_task(self._one(msg))
        self.tasks[msg.id] = task
        task.add_done_callback(functools.partial(self._call_done, msg))

    def _call_done(self, msg: Any, task: asyncio.Task[None]) -> None:
        """A call's task ended. Its answer was sent (`_send` counted it), or it ended
        without one: cancelled by the peer before it ran (answered now), or the stream
        ends (nobody to answer)."""
        if self.tasks.get(msg.id) is task:
            del self.tasks[msg.id]
        withdrawn = msg.id in self.withdrawn
        self.withdrawn.discard(msg.id)
        if msg.id in self.sending:
            self.sending.discard(msg.id)
        elif withdrawn and not self.closed:
            sender = asyncio.create_task(self._send(self._failure(msg, CANCELLED)))
            self.senders.add(sender)
            sender.add_done_callback(self.senders.discard)
        else:
            self._answered()

    async def _one(self, msg: Any) -> None:
        metrics = self.gateway.node.metrics
        started = time.perf_counter() if metrics is not None else 0.0
        code: str | None = None
        try:
            if msg.HasField("follow"):
                await self._follow(msg)       # answers until it fails
            if msg.deadline:
                async with asyncio.timeout(msg.deadline):
                    response = await self.gateway._invoke(msg.invoke, self.context)
            else:
                response = await self.gateway._invoke(msg.invoke, self.context)
            answer = pb.CallAnswer(id=msg.id, response=response)
        except CallFailed as e:
            answer = self._failure(msg, e.error, e.leader_hint)
        except (ValueError, TypeError) as e:   # a value the wire conversion refused
            answer = self._failure(msg, Error(Code.INVALID_ARGUMENT, str(e)))
        except TimeoutError:
            answer = self._failure(msg, Error(
                Code.UNAVAILABLE, f"no answer within the call's deadline of "
                f"{msg.deadline:g} s; retry", "CallDeadline"))
        except asyncio.CancelledError:
            if msg.id not in self.withdrawn:
                raise                       # the stream ends: nobody to answer
            self.withdrawn.discard(msg.id)
            answer = self._failure(msg, CANCELLED)
        if answer.HasField("error"):
            code = Code(answer.error.code).name
        if metrics is not None:
            metrics.observe("invoke", started, code)     # as a unary Invoke
        await self._send(answer, msg.id)     # a cancel now (the peer gave up) skips it

    async def _follow(self, msg: Any) -> NoReturn:
        """A followed reader (Call.follow): each answer written with `more` set, the next
        run only once it is written (a peer that does not read holds its follow back, one
        answer queued at most); the deadline bounds the first answer. Ends with the error
        that ends the answers (CallFailed, or CancelledError)."""
        if msg.deadline:
            async with asyncio.timeout(msg.deadline):
                response, answers = await self.gateway.follow(msg.invoke, self.context,
                                                              msg.follow)
        else:
            response, answers = await self.gateway.follow(msg.invoke, self.context, msg.follow)
        try:
            while True:
                if msg.follow.merge:
                    await self._send_merged(msg.id, response)
                else:
                    await self._send(pb.CallAnswer(id=msg.id, response=response, more=True),
                                     more=True)
                response = await anext(answers)
        finally:
            await answers.aclose()

    async def _send_merged(self, call_id: int, response: Any) -> None:
        """Write `response` as the next answer of the followed call `call_id` (Follow.merge)
        in one message with the other merged follows of this stream given the same response
        object in this turn of the event loop: the followers of one shared run of a reader
        (ReaderCalls._shared) are settled together, so a hundred watches of one key on one
        stream cost one write per change. Returns once it is written, as `_send` does."""
        batch = self.merging.get(id(response))
        if batch is None:
            batch = self.merging[id(response)] = _Merged(response)
            asyncio.get_running_loop().call_soon(self._flush_merged, batch)
        batch.ids.append(call_id)
        try:
            await asyncio.shield(batch.sent)
        except asyncio.CancelledError:
            if not batch.flushed:               # withdrawn before the write: not in it
                batch.ids.remove(call_id)
            raise

    def _flush_merged(self, batch: _Merged) -> None:
        if self.merging.get(id(batch.response)) is batch:
            del self.merging[id(batch.response)]
        batch.flushed = True
        if not batch.ids or self.closed:
            batch.sent.cancel()
            return
        task = asyncio.create_task(self._write_merged(batch))
        self.senders.add(task)
        task.add_done_callback(self.senders.discard)

    async def _write_merged(self, batch: _Merged) -> None:
        answer = pb.CallAnswer(id=batch.ids[0], response=batch.response, more=True)
        answer.also.extend(batch.ids[1:])
        self.gateway.node.reads.merged += len(batch.ids) - 1
        try:
            await self._send(answer, more=True)
        except asyncio.CancelledError:
            batch.sent.cancel()
            raise
        except Exception as e:                  # an AnswerBudget: each follow ends with it
            batch.sent.set_exception(e)
        else:
            batch.sent.set_result(None)

    def _failure(self, msg: Any, error: Error, leader_hint: str = "") -> Any:
        if log.isEnabledFor(logging.INFO):
            inv = msg.invoke
            log.info("call failed: InvokeRequest session=%s seq=%s %s (Calls stream, id %s)",
                     inv.session, inv.seq, error, msg.id)
        return pb.CallAnswer(id=msg.id, error=wire.error_detail(error, leader_hint))

    async def _send(self, answer: Any, call_id: int | None = None, more: bool = False) -> None:
        """Write `answer` when the writes before it are done (most often at once); it counts
        as the answer of the call (`_answered`) whether or not the write succeeds, unless
        `more` answers of the call follow (Call.follow)."""
        if call_id is not None:
            self.sending.add(call_id)
        size = answer.ByteSize()
        if self.queued_bytes and self.queued_bytes + size > self.answer_budget:
            over = Error(
                Code.UNAVAILABLE, f"this stream has not read {self.queued_bytes} bytes of "
                f"answers (limit {self.answer_budget}): read them before asking for more",
                "AnswerBudget")
            if more:                 # a follow ends (its caller follows again from here)
                raise CallFailed(over)
            answer = pb.CallAnswer(id=answer.id, error=wire.error_detail(over))
            size = answer.ByteSize()
        self.queued_bytes += size
        try:
            async with self.write_lock:
                self.queued_bytes -= size
                size = 0
                await self.context.write(answer)
        finally:
            self.queued_bytes -= size
            if not more:
                self._answered()

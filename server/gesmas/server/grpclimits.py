"""How much one gRPC connection can make a replica hold: the options of the grpc.aio server,
its bound on concurrent calls, and a budget for answers the peer has not taken yet.

What costs memory on a grpc.aio server (grpcio 1.85), and what bounds it here:

- A call in progress (a blocked Invoke may wait for hours) costs ~20 KB: the core call, the
  Python task, the gateway's pending future. Per connection `max_concurrent_streams` bounds
  the calls (a raw HTTP/2 peer going over has its streams refused, REFUSED_STREAM; a grpc
  client queues its extra calls until a stream frees: a process with more calls waiting
  on one replica than that stalls its further calls to it); per replica
  `MAXIMUM_CONCURRENT_RPCS` does (grpc.aio answers the call over it RESOURCE_EXHAUSTED
  "Concurrent RPC limit exceeded!"). The core itself sheds calls arriving faster than the
  event loop takes them (over 1000-3000 waiting: RESOURCE_EXHAUSTED "Too many pending
  requests for this server").
- An answer the peer does not read. HTTP/2 flow control only limits what goes on the wire
  (64 KB per stream and per connection until the peer sends WINDOW_UPDATE): the core keeps
  the whole serialized answer of each stream, and the call (with the Python answer and its
  bytes) lives until the last byte has been handed to TCP. So 1000 unread answers of 1 MB
  cost 2 GB. `AnswerBudget` bounds the bytes of answers not yet handed over, per connection
  and in total, answering RESOURCE_EXHAUSTED instead. A peer that stopped reading at all
  never acknowledges the server's pings: it is disconnected, its calls and answers freed.
- There is no memory cap to set from Python: the core's ResourceQuota is a pointer channel
  argument ("grpc.resource_quota") and grpcio has no way to create one.

Exceeding a bound never stops the replica: the call gets RESOURCE_EXHAUSTED (or, for a
stream over the connection's limit, the HTTP/2 refusal), everything else goes on.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable

import grpc

from .kernel.errors import Code, Error
from .wire import error_to_status

#: Calls served at once by one replica, over all connections; one more gets
#: RESOURCE_EXHAUSTED. Blocked calls count: 10,000 of them cost ~200 MB.
MAXIMUM_CONCURRENT_RPCS = 10_000

#: Streams (calls) at once on one HTTP/2 connection. Every gesmas Client of one process
#: shares one connection per replica (grpc shares subchannels), so this is how many calls a
#: process may have waiting on one replica; the tests go to ~100.
MAX_CONCURRENT_STREAMS = 1_000

#: The server pings each connection with calls this often ...
KEEPALIVE_TIME_MS = 20_000
#: ... and closes it when the ping is not acknowledged within this.
KEEPALIVE_TIMEOUT_MS = 10_000


def server_options(max_message: int) -> list[tuple[str, Any]]:
    """The channel options of a replica's grpc.aio server."""
    return [
        # one request or answer, serialized: bigger ones fail RESOURCE_EXHAUSTED
        ("grpc.max_receive_message_length", max_message),
        ("grpc.max_send_message_length", max_message),
        # a second replica started on the same port must fail, not share it
        ("grpc.so_reuseport", 0),
        # clients ping every 2 s during long waits so that they notice a hung replica:
        # allow it (pings closer than 1 s would otherwise count as abuse)
        ("grpc.http2.min_ping_interval_without_data_ms", 1000),
        ("grpc.http2.max_ping_strikes", 0),
        # calls at once on one connection: 1000 blocked calls cost ~20 MB; a grpc client
        # queues the calls over it, a raw peer has them refused (REFUSED_STREAM)
        ("grpc.max_concurrent_streams", MAX_CONCURRENT_STREAMS),
        # a peer that stopped reading never acknowledges the server's pings: its connection
        # is closed and its calls and unsent answers freed. A ping goes out 20 s after the
        # last one (keepalive) or when a request arrives (BDP probe); one ping at a time,
        # so each must time out quickly (the default for non-keepalive pings is 60 s)
        ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.http2.ping_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        # ... also on a connection where only blocked calls wait (no data either way): by
        # default the server stops pinging after 2 pings without data
        ("grpc.http2.max_pings_without_data", 0),
    ]


def maximum_concurrent_rpcs() -> int:
    """The `maximum_concurrent_rpcs` of grpc.aio.server."""
    return MAXIMUM_CONCURRENT_RPCS


#: An answer this small fits the HTTP/2 window a peer opens at first (64 KB): a peer that
#: reads takes it at once.
SMALL_ANSWER = 64 * 1024

#: An answer this small is not held in the budget: it costs less than the call that carries
#: it (~20 KB, bounded by MAX_CONCURRENT_STREAMS and MAXIMUM_CONCURRENT_RPCS), and holding
#: it needs a done callback, which grpc.aio keeps as a partial of the call's context in the
#: call's own state: a reference cycle, 9 objects a call left to the collector (a create, a
#: keep-alive), whose young passes then took 6-13 ms every second while 16 threads made
#: objects (a probe with gc.DEBUG_SAVEALL).
UNCOUNTED_ANSWER = 1024


class AnswerBudget(grpc.aio.ServerInterceptor):
    """Bounds the bytes of unary answers computed but not yet handed to TCP: per connection
    (the peer string) and in total. An answer that would go over is dropped and the call
    answered UNAVAILABLE (type "AnswerBudget"). The call had run, so nothing may be lost:
    the client retries the same (session, seq), which the kernel answers from the result it
    keeps until the client acknowledges it, as after a connection broken before the answer
    arrived (other commands are reads or harmless to repeat). An answer is always
    allowed when its connection (or the replica) holds none, so any answer within the
    message size limit can go to a peer that reads; small answers (SMALL_ANSWER) may use
    a quarter more than `total`, so that small calls go on while big unread answers fill it;
    answers of at most UNCOUNTED_ANSWER bytes are neither held nor refused.

    Memory: each held answer costs about 2-3 times its size (the answer object, its
    serialized bytes, and the core's copy), until the peer has read all but its last
    64 KB. Only async unary-unary methods are counted (all of gesmas's); others pass as is.
    """

    def __init__(self, per_connection: int, total: int) -> None:
        self.per_connection = per_connection
        self.total = total
        self.held = 0                              # bytes, all connections
        self.by_peer: dict[str, int] = {}
        self._wrapped: dict[Any, Any] = {}         # handler -> counted handler

    @classmethod
    def for_messages(cls, max_message: int) -> AnswerBudget:
        """2 answers of the largest size per connection, 8 in total."""
        return cls(2 * max_message, 8 * max_message)

    async def intercept_service(self, continuation: Callable[..., Any],
                                handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_streaming or handler.response_streaming \
                or not inspect.iscoroutinefunction(handler.unary_unary):
            return handler
        try:
            counted = self._wrapped.get(handler)
        except TypeError:                          # an unhashable handler: count, no cache
            return handler._replace(unary_unary=self._counted(handler.unary_unary))
        if counted is None:
            counted = self._wrapped[handler] = handler._replace(
                unary_unary=self._counted(handler.unary_unary))
        return counted

    def _counted(self, behavior: Callable[..., Any]) -> Callable[..., Any]:
        async def answer(request: Any, context: grpc.aio.ServicerContext) -> Any:
            response = await behavior(request, context)
            size = _size(response)
            if size <= UNCOUNTED_ANSWER:
                return response
            peer = context.peer()
            refusal = self._refusal(peer, size)
            if refusal:
                del response        # not kept alive by the frame while the refusal is sent
                status, details, trailers = error_to_status(
                    Error(Code.UNAVAILABLE, refusal, "AnswerBudget"))
                context.set_trailing_metadata(trailers)
                await context.abort(status, details)
            self.held += size
            self.by_peer[peer] = self.by_peer.get(peer, 0) + size

            def release(ctx: grpc.aio.ServicerContext) -> None:   # the call has ended
                self._release(peer, size)
            context.add_done_callback(release)  # type: ignore[arg-type]  # stub: a class
            return response
        return answer

    def _refusal(self, peer: str, size: int) -> str | None:
        mine = self.by_peer.get(peer, 0)
        if mine and mine + size > self.per_connection:
            return (f"this connection has not read {mine} bytes of answers (limit "
                    f"{self.per_connection}): read them before asking for more")
        total = self.total + self.total // 4 if size <= SMALL_ANSWER else self.total
        if self.held and self.held + size > total:
            return (f"the replica holds {self.held} bytes of answers not yet read (limit "
                    f"{total}): retry later")
        return None

    def _release(self, peer: str, size: int) -> None:
        self.held -= size
        left = self.by_peer[peer] - size
        if left:
            self.by_peer[peer] = left
        else:
            del self.by_peer[peer]


def _size(response: Any) -> int:
    if isinstance(response, (bytes, bytearray, memoryview)):
        return len(response)
    byte_size = getattr(response, "ByteSize", None)
    return byte_size() if callable(byte_size) else 0

"""CallStream (server/gesmas/server/streams.py) in-process, with a fake gRPC context whose
reads never suspend: orders of events a real stream makes rare (a cancel handled before its
call's task has run) are forced here. Every call must be answered exactly once and counted,
so that the stream can end and the replica's count of stream calls returns to zero."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import grpc

from gesmas.server import streams
from gesmas.server.calls import CallFailed
from gesmas.server.kernel.errors import Code, Error
from gesmas.v1 import gesmas_pb2 as pb


class FakeContext:
    def __init__(self, messages):
        self.messages = list(messages)
        self.written = []

    async def read(self):                       # returns at once: no suspension
        return self.messages.pop(0) if self.messages else grpc.aio.EOF

    async def write(self, answer):
        self.written.append(answer)


class FakeGateway:
    def __init__(self, max_stream_calls=100_000):
        self.stream_calls = 0
        self.max_stream_calls = max_stream_calls
        self.node = SimpleNamespace(metrics=None)
        self.release = asyncio.Event()
        self.stopping = asyncio.Event()
        self.started = []

    async def _invoke(self, request, context):
        self.started.append(request.seq)
        if request.method == "fail":
            raise CallFailed(Error(Code.NOT_FOUND, "no such object"))
        await self.release.wait()
        if self.stopping.is_set():      # as Node.serve answers the calls waiting then
            raise CallFailed(Error(Code.UNAVAILABLE, "stopping", "Stopping"))
        return pb.InvokeResponse()


def call(i, method="wait"):
    return pb.Call(id=i, invoke=pb.InvokeRequest(seq=i, object_name="o", method=method))


def run(messages, release_after=None, max_stream_calls=100_000):
    async def main():
        gw = FakeGateway(max_stream_calls)
        ctx = FakeContext(messages)
        cs = streams.CallStream(gw, ctx, 1 << 20)
        if release_after is not None:
            asyncio.get_running_loop().call_later(release_after, gw.release.set)
        await asyncio.wait_for(cs.serve(), 5)
        return gw, ctx, cs
    return asyncio.run(main())


def test_a_cancel_handled_before_its_call_ran_is_answered_and_counted():
    gw, ctx, cs = run([call(1), pb.Call(id=1, cancel=True), call(2, "fail")])
    by_id = {a.id: a for a in ctx.written}
    assert by_id[1].error.type == "Cancelled" and 1 not in gw.started   # never ran
    assert by_id[2].error.code == pb.ERROR_CODE_NOT_FOUND
    assert len(ctx.written) == 2 and cs.in_flight == 0 and gw.stream_calls == 0


def test_refused_and_finished_calls_are_counted_once():
    gw, ctx, cs = run([call(1), call(1), pb.Call(id=3), call(4, "fail")], release_after=0.05)
    assert sorted(a.id for a in ctx.written) == [1, 1, 3, 4]
    assert cs.in_flight == 0 and gw.stream_calls == 0 and not cs.tasks and not cs.sending


def test_calls_over_the_replicas_limit_are_refused_at_once_and_named():
    """--max-stream-calls 2: the third call in flight is answered TooManyCalls, naming the
    flag; the two before it run."""
    gw, ctx, cs = run([call(1), call(2), call(3)], release_after=0.05, max_stream_calls=2)
    by_id = {a.id: a for a in ctx.written}
    assert by_id[3].error.type == "TooManyCalls" and "--max-stream-calls" in by_id[3].error.message
    assert by_id[1].error.type == "" and by_id[2].error.type == "" and 3 not in gw.started
    assert cs.in_flight == 0 and gw.stream_calls == 0


class OpenContext(FakeContext):
    """A peer that keeps its stream open: after its messages, reads wait for ever."""

    async def read(self):
        if self.messages:
            return self.messages.pop(0)
        await asyncio.Event().wait()


def test_a_stopping_replica_answers_the_calls_in_flight_and_ends_the_stream():
    """The replica stops (Gateway.stopping): the stream reads no more, its calls in flight
    are answered (UNAVAILABLE "Stopping", which the client retries elsewhere) and serve()
    returns by itself, so grpc has no handler left to cancel."""
    async def main():
        gw = FakeGateway()
        ctx = OpenContext([call(1), call(2)])
        cs = streams.CallStream(gw, ctx, 1 << 20)
        serving = asyncio.create_task(cs.serve())
        while len(gw.started) < 2:
            await asyncio.sleep(0)
        assert not serving.done()
        gw.stopping.set()
        gw.release.set()
        await asyncio.wait_for(serving, 5)
        return gw, ctx, cs
    gw, ctx, cs = asyncio.run(main())
    assert sorted(a.id for a in ctx.written) == [1, 2]
    assert all(a.error.type == "Stopping" for a in ctx.written)
    assert cs.in_flight == 0 and gw.stream_calls == 0 and not cs.tasks

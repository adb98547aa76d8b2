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
    def __init__(self):
        self.stream_calls = 0
        self.node = SimpleNamespace(metrics=None)
        self.release = asyncio.Event()
        self.started = []

    async def _invoke(self, request, context):
        self.started.append(request.seq)
        if request.method == "fail":
            raise CallFailed(Error(Code.NOT_FOUND, "no such object"))
        await self.release.wait()
        return pb.InvokeResponse()


def call(i, method="wait"):
    return pb.Call(id=i, invoke=pb.InvokeRequest(seq=i, object_name="o", method=method))


def run(messages, release_after=None):
    async def main():
        gw = FakeGateway()
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

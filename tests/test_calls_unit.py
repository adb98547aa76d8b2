"""PendingCalls (server/calls.py): which calls fail_stale fails, without a cluster."""
from __future__ import annotations

import asyncio

from gesmas.server.calls import PendingCalls
from gesmas.server.kernel.errors import Code
from gesmas.server.kernel.records import Completion


def test_fail_stale_fails_only_calls_not_applied_in_time():
    async def body() -> None:
        calls = PendingCalls("n.x:", asyncio.get_running_loop())
        old, waiting, closed, young = (calls.open(t, at) for t, at in
                                       (("a", 0.0), ("b", 1.0), ("c", 2.0), ("d", 8.0)))
        calls.post([], "b", 5)                  # applied: its answer may wait on (a waiter)
        calls.close("c")                        # its caller went away
        await asyncio.sleep(0)                  # the delivery runs on the loop
        calls.fail_stale(now=10.0, timeout=5.0)
        c, index = old.result()
        assert c.error.code == Code.UNAVAILABLE and c.error.type == "NotCommitted" and index == 0
        assert not waiting.done() and not closed.done() and not young.done()
        # the applied waiter is out of the stale scan for good: a thousand more like it
        for i in range(1000):
            calls.open(f"w{i}", 9.0)
            calls.post([], f"w{i}", 6)
        await asyncio.sleep(0)
        assert list(calls._unapplied) == ["d"]
        calls.fail_stale(now=20.0, timeout=5.0)
        assert young.result()[0].error.code == Code.UNAVAILABLE
        assert not waiting.done() and not calls._unapplied
        calls.post([Completion("b", "item", None)], "z", 7)
        await asyncio.sleep(0)
        assert waiting.result() == (Completion("b", "item", None), 7)
    asyncio.run(body())

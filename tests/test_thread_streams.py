"""A thread's calls on a Calls RPC of its own, read by that thread (gesmas.client.thread_streams):
against a real cluster (the calls and their answers, threads apart, a deadline that
withdraws the wait, a thread that ends, the slots, the client closing under a waiting call,
a replica found unresponsive) and against a scripted stub (what a broken or hostile RPC
makes the call raise). Waits are bounded joins and events, never sleeps as synchronisation."""
from __future__ import annotations

import gc
import queue
import threading
from typing import Any

import grpc
import pytest

from gesmas.client import Client, ClientClosed, GesmasError, core, exiting, thread_streams
from gesmas.client.own_follow import Deadlines, Slots
from gesmas.client.streams import Unsupported
from gesmas.client.thread_streams import ThreadStream, ThreadStreams
from gesmas.v1 import gesmas_pb2 as pb
from waiting import WAIT, until

pytestmark = pytest.mark.cluster


def own_streams(c: Client) -> dict[str, ThreadStream]:
    """The calling thread's ThreadStreams of client `c`, by replica."""
    return getattr(c._threads._local, "streams", {})


def waiters(c: Client) -> int:
    return c.status()["waiter_count"]


def run(target, *args) -> tuple[threading.Thread, list[Any]]:
    """`target(*args)` on a thread; its result or exception lands in the list."""
    out: list[Any] = []

    def body() -> None:
        try:
            out.append(target(*args))
        except BaseException as e:       # the test looks at it
            out.append(e)
    t = threading.Thread(target=body, daemon=True)
    t.start()
    return t, out


# --- against the cluster -------------------------------------------------------------------


def test_a_threads_calls_go_on_its_own_rpc_after_the_first(cluster):
    """The first call of a thread to a replica goes on the shared stream; from the second on
    the thread has an RPC of its own there, and every answer is the call's."""
    with Client(cluster.addresses, consistency="sequential") as c:
        q = c.queue("ts-own")
        q.produce("a")
        assert own_streams(c) == {}
        for item in "bcd":
            q.produce(item)
        (stream,) = own_streams(c).values()
        assert stream.usable
        assert [q.consume(timeout=5) for _ in range(4)] == ["a", "b", "c", "d"]
        assert own_streams(c) == {stream.address: stream}      # the same RPC all along


def test_threads_each_read_their_own_answers(cluster):
    """Four threads of one client add to their own counters and one shared one: each
    thread's answers are its own (a counter's value after each of its adds), and the shared
    total holds every add once."""
    with Client(cluster.addresses) as c:
        def body(i: int) -> tuple[list[int], ThreadStream]:
            mine, shared = c.counter(f"ts-thread-{i}"), c.counter("ts-threads")
            seen = []
            for _ in range(30):
                seen.append(mine.add(1))
                shared.add(1)
            (stream,) = own_streams(c).values()
            return seen, stream
        started = [run(body, i) for i in range(4)]
        results = []
        for t, out in started:
            t.join(WAIT)
            assert not t.is_alive()
            assert not isinstance(out[0], BaseException), out[0]
            results.append(out[0])
        for seen, _ in results:
            assert seen == list(range(1, 31))
        assert len({id(stream) for _, stream in results}) == 4
        assert c.counter("ts-threads").get() == 120


def test_a_deadline_cancels_the_rpc_and_withdraws_the_wait(cluster):
    """No answer within the call's deadline: the client's deadline keeper cancels the
    thread's RPC, the call raises a Failure (sent again elsewhere by the client), the wait is
    withdrawn on the replica, and the thread's next call gets a new RPC."""
    with Client(cluster.addresses) as c, Client(cluster.addresses) as watcher:
        q = c.queue("ts-deadline")
        q.produce("x")
        assert q.consume() == "x"
        address = c.leader
        stream = c._threads.get(address, (), c._stub)
        assert stream is not None and stream is own_streams(c)[address]
        before = waiters(watcher)
        request = pb.InvokeRequest(session=c.session, session_secret=c._session_secret,
                                   seq=c._new_seq(), class_name="Queue",
                                   object_name="ts-deadline", method="consume")
        with pytest.raises(core.Failure, match="no answer within") as e:
            stream.call(request, 0.5)
        assert e.value.unresponsive
        assert not stream.usable
        until(lambda: waiters(watcher) == before, "the wait withdrawn")
        q.produce("y")
        assert q.consume(timeout=5) == "y"
        assert own_streams(c)[address] is not stream


def test_a_thread_that_ends_gives_its_rpc_back(cluster, monkeypatch):
    """A thread's RPC ends with the thread: its slot is free again, so a process whose
    threads come and go does not run out of them (one slot here, three threads in turn).
    Their calls have a deadline longer than the wait here: the deadline keeper must not
    hold a stream its thread dropped."""
    monkeypatch.setattr(thread_streams, "SLOTS", Slots(1))
    with Client(cluster.addresses) as c:
        counter = c.counter("ts-ends")
        address = c.leader

        def three_adds() -> tuple[list[int], int]:
            values = [counter.add(1, timeout=2 * WAIT) for _ in range(3)]
            return values, len(own_streams(c))
        for round_ in range(3):
            t, out = run(three_adds)
            t.join(WAIT)
            assert out == [([3 * round_ + 1, 3 * round_ + 2, 3 * round_ + 3], 1)]
            del t
            gc.collect()
            until(lambda: thread_streams.SLOTS.taken(address) == 0, "the slot given back")


def test_past_the_slots_calls_go_on_the_shared_stream(cluster, monkeypatch):
    """With the process's slots at a replica taken, a thread's calls go on the client's
    shared stream and are answered as well."""
    monkeypatch.setattr(thread_streams, "SLOTS", Slots(1))
    with Client(cluster.addresses) as c:
        counter = c.counter("ts-slots")
        for _ in range(3):
            counter.add(1)
        assert len(own_streams(c)) == 1
        t, out = run(lambda: ([counter.add(1) for _ in range(3)], own_streams(c)))
        t.join(WAIT)
        assert out[0] == ([4, 5, 6], {})


def test_closing_the_client_under_a_waiting_call(cluster):
    """A thread waits on its own RPC (a consume of an empty queue) when the client closes:
    the wait ends (the session is closed) and the thread is told, nothing hangs."""
    c = Client(cluster.addresses)
    q = c.queue("ts-close")
    q.produce("x")
    q.consume()

    def wait_there() -> Any:
        q.produce("y")
        q.consume()
        ready.set()
        return q.consume()             # waits: nothing more is produced
    ready = threading.Event()
    t, out = run(wait_there)
    assert ready.wait(WAIT)
    until(lambda: c._threads._all and any(c._threads._all.values()), "the thread's RPC")
    c.close()
    t.join(WAIT)
    assert not t.is_alive()
    assert isinstance(out[0], GesmasError), out


def test_a_closed_clients_request_threads_are_let_finish_at_exit(cluster, monkeypatch):
    """grpc's request thread of a thread's RPC ends after the client closes, and says so
    (client/exiting.py): a program's exit waits for it rather than stop it inside grpc's
    RPC lock (which hung `gesmas lock -- CMD` at its exit once)."""
    named: list[threading.Thread] = []
    real = exiting.ending

    def ending(thread: threading.Thread | None = None) -> None:
        named.append(thread or threading.current_thread())
        real(thread)
    monkeypatch.setattr(exiting, "ending", ending)
    c = Client(cluster.addresses)
    q = c.queue("ts-exit")
    q.produce("a")
    q.produce("b")                      # the main thread's own RPC from its second call
    assert len(own_streams(c)) == 1
    c.close()
    # the thread stream's request thread (its iterator runs there) and the shared stream's
    # request and reader threads
    until(lambda: len(named) >= 3, "the request threads named as ending")
    assert threading.current_thread() not in named
    assert exiting.let_finish(WAIT) == []
    assert not any(t.is_alive() for t in named)


def test_an_unresponsive_replica_sends_the_waiting_call_elsewhere(cluster):
    """The client finds the replica a thread waits at unresponsive: the thread's RPC is
    cancelled and the call goes on elsewhere with the same seq; the item produced next is
    consumed once, by it."""
    with Client(cluster.addresses) as c, Client(cluster.addresses) as other:
        q = c.queue("ts-unresponsive")
        q.produce("x")
        q.consume()
        ready = threading.Event()

        def wait_there() -> Any:
            q.produce("y")
            assert q.consume() == "y"
            ready.set()
            return q.consume(timeout=WAIT)
        t, out = run(wait_there)
        assert ready.wait(WAIT)
        address = c.leader
        until(lambda: any(s.usable for s in c._threads._all.get(address, ())),
              "the thread's RPC")
        stream = next(iter(c._threads._all[address]))
        c._unresponsive(address)
        assert not stream.usable
        other.queue("ts-unresponsive").produce("z")
        t.join(WAIT)
        assert out == ["z"]
        assert other.queue("ts-unresponsive").size() == 0


def test_the_shared_stream_is_kept_when_asked(cluster, monkeypatch):
    monkeypatch.setenv("GESMAS_THREAD_STREAM", "shared")
    with Client(cluster.addresses) as c:
        assert c._threads is None
        counter = c.counter("ts-shared")
        assert [counter.add(1) for _ in range(3)] == [1, 2, 3]
    monkeypatch.setenv("GESMAS_THREAD_STREAM", "mine")
    with pytest.raises(ValueError, match="GESMAS_THREAD_STREAM must be 'own' or 'shared'"):
        Client(cluster.addresses, connect=False)


# --- against a scripted stub ---------------------------------------------------------------


class ScriptedRpc:
    """A Calls RPC whose answers the test scripts: each ``next`` takes the call the stream
    sent and returns ``script(call)`` (or raises what it returns, if an exception)."""

    def __init__(self, requests, script) -> None:
        self.requests = requests
        self.script = script
        self.cancelled = threading.Event()

    def __next__(self):
        call = next(self.requests)
        out = self.script(call)
        if isinstance(out, BaseException):
            raise out
        return out

    def cancel(self) -> None:
        self.cancelled.set()


class ScriptedStub:
    def __init__(self, script) -> None:
        self.script = script
        self.rpcs: list[ScriptedRpc] = []

    def Calls(self, requests, metadata=()):  # noqa: N802 (gRPC name)
        rpc = ScriptedRpc(requests, self.script)
        self.rpcs.append(rpc)
        return rpc


class Ended(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return "scripted"

    def trailing_metadata(self) -> tuple:
        return ()


def answer(call, **fields) -> Any:
    return pb.CallAnswer(id=call.id, response=pb.InvokeResponse(applied_index=7), **fields)


@pytest.fixture
def deadlines():
    d = Deadlines()
    yield d
    d.close()


def stream_of(script, deadlines, address="10.0.0.1:1") -> tuple[ThreadStream, ScriptedStub]:
    stub = ScriptedStub(script)
    assert thread_streams.SLOTS.take(address)
    return ThreadStream(stub, address, (), core_login(), 1 << 20, deadlines), stub


def core_login():
    from gesmas.client.security import Login
    return Login(None, None, None)


REQUEST = pb.InvokeRequest(session=1, seq=1, class_name="Counter", object_name="c",
                           method="get")


@pytest.mark.parametrize("script, raised, match", [
    (lambda call: StopIteration(), core.Failure, "the call stream ended"),
    (lambda call: Ended(grpc.StatusCode.UNAVAILABLE), core.Failure, "scripted"),
    (lambda call: Ended(grpc.StatusCode.UNIMPLEMENTED), Unsupported, "Calls stream"),
    (lambda call: answer(call, more=True), core.Failure, r"more=True"),
    (lambda call: pb.CallAnswer(id=call.id + 1), core.Failure, "answered call 2"),
])
def test_a_broken_or_hostile_rpc_fails_the_call_and_ends_the_stream(script, raised, match,
                                                                   deadlines):
    """An RPC that ends, breaks, is unknown to the replica, or answers another call (or a
    followed one) fails the call as a call on the shared stream would (a Failure is sent
    again elsewhere with the same seq) and the stream is not used again."""
    address = f"10.0.0.{len(match)}:1"
    stream, _ = stream_of(script, deadlines, address)
    with pytest.raises(raised, match=match):
        stream.call(REQUEST, 5.0)
    assert not stream.usable
    assert thread_streams.SLOTS.taken(address) == 0
    with pytest.raises((core.Failure, Unsupported)):
        stream.call(REQUEST, 5.0)


def test_an_interrupted_call_cancels_the_rpc(deadlines):
    """A caller interrupted while it waits (KeyboardInterrupt) cancels the RPC, which
    withdraws its call on the replica."""
    stream, stub = stream_of(lambda call: KeyboardInterrupt(), deadlines, "10.0.0.9:1")
    with pytest.raises(KeyboardInterrupt):
        stream.call(REQUEST, None)
    assert stub.rpcs[0].cancelled.is_set()
    assert not stream.usable


def test_answers_in_order_and_the_deadline_keeper_left_alone(deadlines):
    """A thousand calls with a deadline, each answered at once: each gets its own answer,
    the keeper holds one entry for the stream and cancels nothing."""
    stream, stub = stream_of(lambda call: answer(call), deadlines, "10.0.0.10:1")
    for _ in range(1000):
        assert stream.call(REQUEST, 30.0).applied_index == 7
    assert len(deadlines._heap) == 1
    assert not stub.rpcs[0].cancelled.is_set()
    stream.finish()
    assert thread_streams.SLOTS.taken("10.0.0.10:1") == 0


def test_a_new_login_replaces_the_threads_stream(deadlines):
    """A thread's stream opened with older credentials is finished and a new one opened with
    the new metadata (a stream's metadata is fixed when it opens)."""
    stub = ScriptedStub(lambda call: answer(call))
    streams = ThreadStreams(core_login(), 1 << 20, deadlines)
    address = "10.0.0.11:1"
    assert streams.get(address, (("authorization", "a"),), lambda _: stub) is None   # first
    old = streams.get(address, (("authorization", "a"),), lambda _: stub)
    assert old is not None and old.call(REQUEST, None).applied_index == 7
    new = streams.get(address, (("authorization", "b"),), lambda _: stub)
    assert new is not old and new.metadata == (("authorization", "b"),)
    assert not old.usable and new.usable
    streams.end()                         # the client closes
    assert not new.usable
    assert thread_streams.SLOTS.taken(address) == 0
    assert streams.get("10.0.0.12:1", (), lambda _: stub) is None     # a first call
    with pytest.raises(ClientClosed):
        streams.get("10.0.0.12:1", (), lambda _: stub)
    assert thread_streams.SLOTS.taken("10.0.0.12:1") == 0


def test_a_request_thread_ends_with_the_stream(deadlines):
    """The RPC's request iterator (grpc's request thread runs it) returns once the stream
    is finished, so no thread is left behind."""
    stream, stub = stream_of(lambda call: answer(call), deadlines, "10.0.0.13:1")
    stream.call(REQUEST, None)
    requests = stub.rpcs[0].requests
    got: queue.SimpleQueue = queue.SimpleQueue()
    t = threading.Thread(target=lambda: got.put(list(requests)), daemon=True)
    t.start()
    stream.finish()
    t.join(WAIT)
    assert got.get_nowait() == []

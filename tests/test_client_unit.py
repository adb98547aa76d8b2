"""The client library and CLI against fake in-process gRPC servers (no real cluster).

Each fake replica is a real grpc server on 127.0.0.1 with a scripted servicer, so the
client's channels, retries, deadlines and error metadata are exercised for real. Tests
synchronise with threading.Event and bounded waits, never with sleeps.
"""
from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

from gesmas.client import (
    AlreadyExists,
    ApplicationError,
    Client,
    InvalidArgument,
    LockProxy,
    NotFound,
    ObjectProxy,
    SessionExpired,
    Unavailable,
    cli,
    convert,
)
from gesmas.client.client import parse_cluster
from gesmas.client.errors import ERROR_METADATA_KEY
from gesmas.v1 import gesmas_pb2 as pb
from gesmas.v1 import gesmas_pb2_grpc as pb_grpc

WAIT = 5.0  # upper bound of every wait for an event: a failure, never a delay
SESSION = 7


def fail(context: grpc.ServicerContext, status: grpc.StatusCode, code: int, message: str,
         type: str = "", hint: str = "") -> None:
    """Abort the RPC the way the real gateway does: status + ErrorDetail in the trailers."""
    detail = pb.ErrorDetail(code=code, message=message, type=type, leader_hint=hint)
    context.set_trailing_metadata(((ERROR_METADATA_KEY, detail.SerializeToString()),))
    context.abort(status, message)


def unavailable(hint: str = "") -> Callable[..., Any]:
    def handler(request: Any, context: grpc.ServicerContext) -> Any:
        fail(context, grpc.StatusCode.UNAVAILABLE, pb.ERROR_CODE_UNAVAILABLE,
             "not the leader", hint=hint)
    return handler


class Fake(pb_grpc.GesmasServicer):
    """A scripted replica: records every request, answers from ``handlers`` or a default."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any, float | None]] = []  # (rpc, request, time left)
        self.handlers: dict[str, Callable[[Any, grpc.ServicerContext], Any]] = {}
        self.lock = threading.Lock()

    def seen(self, rpc: str) -> list[Any]:
        with self.lock:
            return [r for name, r, _ in self.calls if name == rpc]

    def _serve(self, rpc: str, request: Any, context: grpc.ServicerContext, default: Any) -> Any:
        with self.lock:
            self.calls.append((rpc, request, context.time_remaining()))
        handler = self.handlers.get(rpc)
        return handler(request, context) if handler else default

    def OpenSession(self, request, context):  # noqa: N802 (gRPC names)
        return self._serve("OpenSession", request, context,
                           pb.OpenSessionResponse(session=SESSION, ttl=request.ttl))

    def KeepAlive(self, request, context):  # noqa: N802
        return self._serve("KeepAlive", request, context, pb.KeepAliveResponse(ttl=10.0))

    def CloseSession(self, request, context):  # noqa: N802
        return self._serve("CloseSession", request, context, pb.CloseSessionResponse())

    def Invoke(self, request, context):  # noqa: N802
        result = pb.Value(string_value=f"{request.method}#{request.seq}")
        return self._serve("Invoke", request, context, pb.InvokeResponse(result=result))

    def CreateObject(self, request, context):  # noqa: N802
        return self._serve("CreateObject", request, context, pb.CreateObjectResponse(created=True))

    def DeleteObject(self, request, context):  # noqa: N802
        return self._serve("DeleteObject", request, context, pb.DeleteObjectResponse())

    def RegisterClass(self, request, context):  # noqa: N802
        resp = pb.RegisterClassResponse(classes=[pb.ClassInfo(name="PQ", version=2)])
        return self._serve("RegisterClass", request, context, resp)

    def ListClasses(self, request, context):  # noqa: N802
        resp = pb.ListClassesResponse(classes=[pb.ClassInfo(name="Lock", version=1)])
        return self._serve("ListClasses", request, context, resp)

    def ListObjects(self, request, context):  # noqa: N802
        resp = pb.ListObjectsResponse(objects=[pb.ObjectInfo(
            name="jobs", class_name="Queue", class_version=1, waiters=2)])
        return self._serve("ListObjects", request, context, resp)

    def Status(self, request, context):  # noqa: N802
        return self._serve("Status", request, context, pb.StatusResponse(node_id="n"))


class Replica:
    def __init__(self) -> None:
        self.fake = Fake()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        pb_grpc.add_GesmasServicer_to_server(self.fake, self.server)
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()

    def stop(self) -> None:
        self.server.stop(0)


@pytest.fixture
def replicas() -> Iterator[list[Replica]]:
    started = [Replica() for _ in range(3)]
    yield started
    for r in started:
        r.stop()


def closed_port() -> str:
    """An address nobody listens on: connecting is refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def cluster(replicas: list[Replica]) -> str:
    return ",".join(r.address for r in replicas)


def invokes(r: Replica) -> list[tuple[int, int, int]]:
    return [(q.session, q.seq, q.ack) for q in r.fake.seen("Invoke")]


# --- sessions, seq and ack -------------------------------------------------------------


def test_session_seq_and_ack(replicas):
    a = replicas[0]
    with Client(cluster(replicas)) as c:
        assert c.session == SESSION
        q = c.object("Queue", "jobs")
        assert [q.produce(b"x"), q.produce(b"y"), q.consume()] == [
            "produce#1", "produce#2", "consume#3"]
        assert invokes(a) == [(SESSION, 1, 0), (SESSION, 2, 1), (SESSION, 3, 2)]

        # seq 4 blocks; seq 5 completes meanwhile: the ack mark waits for 4.
        arrived, release = threading.Event(), threading.Event()

        def blocking(request, context):
            if request.seq == 4:
                arrived.set()
                release.wait(WAIT)
            return pb.InvokeResponse(result=pb.Value(int_value=request.seq))

        a.fake.handlers["Invoke"] = blocking
        results: list[Any] = []
        t = threading.Thread(target=lambda: results.append(q.consume()))
        t.start()
        assert arrived.wait(WAIT)
        assert q.size() == 5
        release.set()
        t.join(WAIT)
        assert results == [4]
        assert q.size() == 6
        assert invokes(a)[3:] == [(SESSION, 4, 3), (SESSION, 5, 3), (SESSION, 6, 5)]
    assert [r.session for r in a.fake.seen("CloseSession")] == [SESSION]
    assert len(a.fake.seen("OpenSession")) == 1


def test_failed_call_still_advances_ack(replicas):
    a = replicas[0]
    a.fake.handlers["Invoke"] = lambda request, context: fail(
        context, grpc.StatusCode.NOT_FOUND, pb.ERROR_CODE_NOT_FOUND, "no object named 'x'")
    with Client(cluster(replicas)) as c:
        with pytest.raises(NotFound):
            c.invoke("Queue", "x", "consume")
        with pytest.raises(NotFound):
            c.invoke("Queue", "x", "consume")
    assert invokes(a) == [(SESSION, 1, 0), (SESSION, 2, 1)]


def test_bad_argument_is_refused_before_sending(replicas):
    with Client(cluster(replicas)) as c:
        with pytest.raises(InvalidArgument, match=r"args\[1\]\['k'\]: type set"):
            c.invoke("Queue", "q", "produce", 1, {"k": {1}})
        with pytest.raises(InvalidArgument, match="int64"):
            c.invoke("Queue", "q", "produce", 2**63)
        c.invoke("Queue", "q", "produce", 1)
    assert invokes(replicas[0]) == [(SESSION, 1, 0)]  # no seq was used up


# --- retries ---------------------------------------------------------------------------


def test_unavailable_moves_to_next_address_with_same_seq(replicas):
    a, b, _ = replicas
    a.fake.handlers["Invoke"] = unavailable()
    with Client(cluster(replicas)) as c:
        assert c.invoke("Queue", "q", "produce", 1) == "produce#1"
        assert invokes(a) == [(SESSION, 1, 0)]
        assert invokes(b) == [(SESSION, 1, 0)]
        assert c.invoke("Queue", "q", "produce", 2) == "produce#2"  # b is now preferred
        assert invokes(a) == [(SESSION, 1, 0)]
        assert invokes(b) == [(SESSION, 1, 0), (SESSION, 2, 1)]


def test_unavailable_follows_leader_hint(replicas):
    a, b, c_ = replicas
    a.fake.handlers["Invoke"] = unavailable(hint=c_.address)
    with Client(cluster(replicas)) as c:
        assert c.invoke("Queue", "q", "produce", 1) == "produce#1"
    assert invokes(b) == []
    assert invokes(c_) == [(SESSION, 1, 0)]


def test_connection_refused_moves_on(replicas):
    with Client(f"{closed_port()},{replicas[1].address}") as c:  # OpenSession retried too
        assert c.invoke("Queue", "q", "produce", 1) == "produce#1"
    assert invokes(replicas[1]) == [(SESSION, 1, 0)]


def test_a_cluster_that_is_not_there_is_said_at_once_naming_every_address():
    """Issue 26, point 10: every address refuses and nothing ever answered: the client gives
    up after about core.UNREACHABLE_FOR, not its retry_timeout, and names each address."""
    a, b = closed_port(), closed_port()
    started = time.monotonic()
    with pytest.raises(Unavailable) as e:
        Client(f"{a},{b}", retry_timeout=60)
    assert time.monotonic() - started < 20              # far below the 60 s retry_timeout
    assert f"{a}: connection refused" in e.value.message
    assert f"{b}: connection refused" in e.value.message


def test_a_cluster_that_was_there_is_retried_for_retry_timeout(replicas):
    with Client(cluster(replicas), retry_timeout=2.5) as c:
        assert c.invoke("Queue", "q", "produce", 1) == "produce#1"
        for r in replicas:
            r.stop()
        started = time.monotonic()
        with pytest.raises(Unavailable) as e:
            c.invoke("Queue", "q", "produce", 2)
        assert time.monotonic() - started >= 2.4        # it may be coming back: retried
        said = e.value.message
        assert all(f"{r.address}: connection refused" in said for r in replicas), said


@pytest.mark.parametrize("address, says", [
    ("127.0.0.1", "has no port"), ("::1", "IPv6 host goes in brackets"),
    ("h:0", "from 1 to 65535"), ("h:http", "from 1 to 65535"), (":7101", "has no host"),
    ("http://h:7101", "without a scheme"),
])
def test_addresses_must_be_host_and_port(address, says):
    with pytest.raises(ValueError, match=says):
        Client(f"127.0.0.1:7101,{address}", connect=False)
    for good in ("127.0.0.1:7101", "[::1]:7101", "db-1.example:7101", "unix:/tmp/g.sock"):
        assert parse_cluster(good) == [good]


@pytest.mark.parametrize("details, why", [
    ("failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Failed to "
     "connect to remote host: Connection refused", "connection refused"),
    ("errors resolving no-such-host.invalid:7101: [field:hostname lookup error:address "
     "lookup failed for no-such-host.invalid:7101: Domain name not found]", "unknown host"),
    ("failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:2: Socket "
     "closed", "a TLS port? give its CA"),
    ("failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:3: Tls "
     "handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:100000f7:SSL "
     "routines:OPENSSL_internal:WRONG_VERSION_NUMBER", "a port without TLS?"),
    ("Socket closed", None),                          # a replica that went away mid-call
    ("keepalive watchdog timeout", None),
])
def test_what_an_unreachable_replica_is_told(details, why):
    from gesmas.client import core
    said = core.unreachable(details)
    assert said is None if why is None else why in said


def test_blocked_call_reattaches_when_its_replica_dies(replicas):
    a, b, _ = replicas
    arrived, release = threading.Event(), threading.Event()

    def block(request, context):
        arrived.set()
        release.wait(WAIT)
        return pb.InvokeResponse()

    a.fake.handlers["Invoke"] = block
    b.fake.handlers["Invoke"] = lambda request, context: pb.InvokeResponse(
        result=pb.Value(bytes_value=b"job-1"))
    try:
        with Client(cluster(replicas)) as c:
            results: list[Any] = []
            t = threading.Thread(target=lambda: results.append(c.queue("jobs").consume()))
            t.start()
            assert arrived.wait(WAIT)
            a.stop()  # the replica dies while the call waits on it
            t.join(WAIT)
            assert results == [b"job-1"]
    finally:
        release.set()
    assert invokes(a) == invokes(b) == [(SESSION, 1, 0)]


def test_application_errors_are_not_retried(replicas):
    a, b, _ = replicas
    a.fake.handlers["Invoke"] = lambda request, context: fail(
        context, grpc.StatusCode.FAILED_PRECONDITION, pb.ERROR_CODE_APPLICATION,
        "not the owner", type="LockNotOwned")
    with Client(cluster(replicas)) as c:
        with pytest.raises(ApplicationError) as info:
            c.lock("L").release()
    assert info.value.type == "LockNotOwned"
    assert len(invokes(a)) == 1 and invokes(b) == []


def test_gives_up_after_retry_timeout(replicas):
    for r in replicas:
        r.fake.handlers["Invoke"] = unavailable()
    with Client(cluster(replicas), retry_timeout=0.3) as c:
        with pytest.raises(Unavailable) as e:
            c.invoke("Queue", "q", "produce", 1)
    for r in replicas:                                   # each address, with what it said
        assert f"{r.address}: not the leader" in e.value.message
    seqs = {q.seq for r in replicas for q in r.fake.seen("Invoke")}
    assert seqs == {1} and sum(len(invokes(r)) for r in replicas) >= 3


# --- timeouts ----------------------------------------------------------------------------


def test_timeout_field_and_grpc_deadline(replicas):
    a = replicas[0]
    with Client(cluster(replicas)) as c:
        q = c.queue("q")
        q.consume()
        q.consume(timeout=0)
        q.consume(timeout=2.5)
        q.wait(timeout=1, kind="x")  # `timeout` is the call's; other kwargs are the method's
    reqs = a.fake.seen("Invoke")
    assert [r.HasField("timeout") for r in reqs] == [False, True, True, True]
    assert [r.timeout for r in reqs] == [0.0, 0.0, 2.5, 1.0]
    assert "timeout" not in reqs[3].kwargs and convert.from_value(reqs[3].kwargs["kind"]) == "x"
    left = [t for name, _, t in a.fake.calls if name == "Invoke"]
    assert left[0] is None or left[0] > 3600  # no deadline: may wait forever
    assert 0 < left[1] <= 10.5  # the margin only (gRPC rounds deadlines up a little)
    assert 10.5 < left[2] <= 13.0


# --- keep-alive --------------------------------------------------------------------------


def test_keepalive_runs_and_follows_leader_hint(replicas):
    a, b, c_ = replicas
    a.fake.handlers["KeepAlive"] = unavailable(hint=c_.address)
    renewed = threading.Event()

    def keepalive(request, context):
        renewed.set()
        return pb.KeepAliveResponse(ttl=1.0)

    c_.fake.handlers["KeepAlive"] = keepalive
    with Client(cluster(replicas), session_ttl=1.0):
        assert renewed.wait(WAIT)
    assert [r.session for r in c_.fake.seen("KeepAlive")][0] == SESSION
    assert b.fake.seen("KeepAlive") == []


def test_calls_stay_on_their_replica_while_keepalives_follow_the_leader(replicas):
    a, b, c_ = replicas
    a.fake.handlers["KeepAlive"] = unavailable(hint=c_.address)
    renewals = threading.Semaphore(0)

    def keepalive(request, context):
        renewals.release()
        return pb.KeepAliveResponse(ttl=1.0)

    c_.fake.handlers["KeepAlive"] = keepalive
    with Client(cluster(replicas), session_ttl=1.0, route="replica") as c:
        assert renewals.acquire(timeout=WAIT) and renewals.acquire(timeout=WAIT)
        c.invoke("Queue", "q", "size")
    assert len(a.fake.seen("KeepAlive")) == 1  # asked once, then straight to the leader
    assert len(a.fake.seen("Invoke")) == 1 and c_.fake.seen("Invoke") == []
    assert b.fake.seen("KeepAlive") == []


def leader_is(address: str) -> Callable[..., Any]:
    def handler(request: Any, context: grpc.ServicerContext) -> Any:
        return pb.OpenSessionResponse(session=SESSION, ttl=request.ttl, leader=address)
    return handler


def test_calls_go_to_the_leader_named_at_open_session(replicas):
    a, b, c_ = replicas
    a.fake.handlers["OpenSession"] = leader_is(c_.address)
    with Client(cluster(replicas)) as c:
        assert c.invoke("Queue", "q", "produce", 1) == "produce#1"
        c.invoke("Queue", "q", "size")
    assert invokes(a) == [] and invokes(b) == []
    assert [r.method for r in c_.fake.seen("Invoke")] == ["produce", "size"]
    assert len(a.fake.seen("OpenSession")) == 1


def test_leader_routed_calls_follow_the_keepalive_to_a_new_leader(replicas):
    a, b, c_ = replicas
    a.fake.handlers["OpenSession"] = leader_is(b.address)
    renewed = threading.Semaphore(0)

    def keepalive(request, context):
        renewed.release()
        return pb.KeepAliveResponse(ttl=1.0)

    b.fake.handlers["KeepAlive"] = lambda request, context: pb.KeepAliveResponse(ttl=1.0)
    with Client(cluster(replicas), session_ttl=1.0) as c:
        c.invoke("Queue", "q", "size")
        b.fake.handlers["KeepAlive"] = unavailable(hint=c_.address)  # b lost the lead to c
        c_.fake.handlers["KeepAlive"] = keepalive
        assert renewed.acquire(timeout=WAIT)
        c.invoke("Queue", "q", "size")
    assert [r.seq for r in b.fake.seen("Invoke")] == [1]
    assert [r.seq for r in c_.fake.seen("Invoke")] == [2]
    assert invokes(a) == []


def test_leader_routed_call_moves_on_when_the_leader_dies(replicas):
    a, b, _ = replicas
    a.fake.handlers["OpenSession"] = leader_is(b.address)
    with Client(cluster(replicas)) as c:
        b.stop()
        assert c.invoke("Queue", "q", "produce", 1) == "produce#1"
    assert invokes(b) == []
    assert len(invokes(a)) + len(invokes(replicas[2])) == 1


def test_route_must_be_known():
    with pytest.raises(ValueError, match="route"):
        Client("127.0.0.1:1", route="nearest", connect=False)


def test_keepalive_not_found_expires_the_client(replicas):
    a = replicas[0]
    a.fake.handlers["KeepAlive"] = lambda request, context: fail(
        context, grpc.StatusCode.NOT_FOUND, pb.ERROR_CODE_NOT_FOUND, "no session 7")
    c = Client(cluster(replicas), session_ttl=0.3)
    try:
        assert c._keepalive is not None
        c._keepalive.join(WAIT)  # the thread ends once it learns the session is gone
        assert c.expired
        with pytest.raises(SessionExpired):
            c.invoke("Queue", "q", "produce", 1)
        assert invokes(a) == []
    finally:
        c.close()
    assert a.fake.seen("CloseSession") == []  # nothing left to close


def test_invoke_session_expired_expires_the_client(replicas):
    a = replicas[0]
    a.fake.handlers["Invoke"] = lambda request, context: fail(
        context, grpc.StatusCode.ABORTED, pb.ERROR_CODE_ABORTED, "session 7 expired",
        type="SessionExpired")
    with Client(cluster(replicas)) as c:
        with pytest.raises(SessionExpired):
            c.invoke("Queue", "q", "produce", 1)
        with pytest.raises(SessionExpired):
            c.invoke("Queue", "q", "produce", 2)
    assert len(invokes(a)) == 1


# --- objects, proxies, admin -------------------------------------------------------------


def test_object_proxies(replicas):
    a = replicas[0]
    a.fake.handlers["Invoke"] = lambda request, context: pb.InvokeResponse(
        result=pb.Value(int_value=41) if request.method == "acquire" else pb.Value())
    with Client(cluster(replicas)) as c:
        lock = c.lock("schema", reentrant=True)
        assert isinstance(lock, LockProxy)
        with lock as fence:
            assert fence == 41
        pq = c.object("PriorityQueue", "urgent", 10, order="max")
        assert type(pq) is ObjectProxy
        pq.push(b"x", 3)
        with pytest.raises(AttributeError):
            pq._private
    creates = a.fake.seen("CreateObject")
    assert [(r.class_name, r.object_name, r.session) for r in creates] == [
        ("Lock", "schema", SESSION), ("PriorityQueue", "urgent", SESSION)]
    assert convert.from_value_map(creates[0].kwargs) == {"reentrant": True}
    assert [convert.from_value(v) for v in creates[1].args] == [10]
    calls = [(r.class_name, r.object_name, r.method, [convert.from_value(v) for v in r.args])
             for r in a.fake.seen("Invoke")]
    assert calls == [("Lock", "schema", "acquire", []), ("Lock", "schema", "release", []),
                     ("PriorityQueue", "urgent", "push", [b"x", 3])]


def test_a_watch_stream_without_the_calls_stream_watches_again_from_each_revision(replicas):
    """A replica without the Calls stream (an older version) answers a followed watch
    once: the client calls again with after_revision set to each answer's revision, and a
    reader whose answer gives no cursor is said to be one that cannot be followed."""
    a = replicas[0]

    def answer(request, context):
        after = convert.from_value_map(request.kwargs)["after_revision"]
        return pb.InvokeResponse(result=convert.to_value(
            {"revision": after + 2, "events": [{"revision": after + 2}]}))
    a.fake.handlers["Invoke"] = answer
    with Client(cluster(replicas)) as c:
        it = c.map("cfg").watch_stream("k/", 5)
        assert [next(it)["revision"] for _ in range(3)] == [7, 9, 11]
        it.close()
        a.fake.handlers["Invoke"] = lambda request, context: pb.InvokeResponse(
            result=pb.Value(int_value=3))
        with pytest.raises(TypeError, match="cannot be followed"):
            list(c.map("cfg").follow("get", "default", "revision", "k"))
    sent = [(r.method, [convert.from_value(v) for v in r.args],
             convert.from_value_map(r.kwargs)) for r in a.fake.seen("Invoke")]
    assert sent[:3] == [("watch", ["k/"], {"after_revision": a, "limit": 1000})
                        for a in (5, 7, 9)]


def test_already_exists(replicas):
    replicas[0].fake.handlers["CreateObject"] = lambda request, context: fail(
        context, grpc.StatusCode.ALREADY_EXISTS, pb.ERROR_CODE_ALREADY_EXISTS,
        "'jobs' is a Lock")
    with Client(cluster(replicas)) as c:
        with pytest.raises(AlreadyExists):
            c.queue("jobs")


def test_admin_calls(replicas):
    a, b, _ = replicas
    a.fake.handlers["Status"] = lambda request, context: pb.StatusResponse(
        node_id="r1", leader_address=b.address)
    b.fake.handlers["Status"] = lambda request, context: pb.StatusResponse(
        node_id="r2", leader_address=b.address, is_leader=True, term=3, commit_index=9,
        nodes=[pb.NodeHealth(node_id="r2", address=b.address, connected=True, match_index=9)])
    with Client(cluster(replicas), connect=False) as c:
        assert c.register_class("class PQ: ...") == {"PQ": 2}
        assert c.list_classes() == {"Lock": 1}
        assert c.list_objects() == [
            {"name": "jobs", "class_name": "Queue", "class_version": 1, "waiters": 2}]
        st = c.status()
        assert (st["address"], st["node_id"], st["term"], st["nodes"][0]["match_index"]) == (
            b.address, "r2", 3, 9)
        c.delete_object("jobs")
    assert a.fake.seen("OpenSession") == []  # connect=False and no call needed one


def _paging_server(names: list[str]) -> Callable[[Any, Any], Any]:
    """A ListObjects handler that pages `names` (sorted) as a replica does: after the
    token, at most `limit` (0: 1000), filtered by prefix, with the next token."""
    def handler(request, context):
        after = [n for n in sorted(names) if n > request.page_token
                 and n.startswith(request.prefix)]
        page = after[:request.limit or 1000]
        return pb.ListObjectsResponse(
            objects=[pb.ObjectInfo(name=n, class_name="Counter", class_version=1)
                     for n in page],
            next_page_token=page[-1] if len(after) > len(page) else "")
    return handler


def test_listings_follow_pages_and_stop_at_the_limit(replicas):
    a = replicas[0]
    names = [f"n{i:02d}" for i in range(25)]
    a.fake.handlers["ListObjects"] = _paging_server(names)
    with Client(a.address, connect=False, route="replica") as c:
        assert [o["name"] for o in c.iter_objects(page_size=10)] == names
        assert [(r.limit, r.page_token) for r in a.fake.seen("ListObjects")] == [
            (10, ""), (10, "n09"), (10, "n19")]
        assert [o["name"] for o in c.list_objects(limit=12, prefix="n")] == names[:12]
        assert [(r.limit, r.page_token, r.prefix)
                for r in a.fake.seen("ListObjects")[3:]] == [(12, "", "n")]
        assert [o["name"] for o in c.list_objects(prefix="n1")] == names[10:20]
        assert c.list_objects(limit=0) == [] and len(a.fake.seen("ListObjects")) == 5
        for bad, says in (({"limit": -1}, "limit must be None"),
                          ({"page_size": 0}, "page_size must be"),
                          ({"page_size": 10_001}, "page_size must be")):
            with pytest.raises(ValueError, match=says):
                c.iter_objects(**bad)             # at the call, before any request
        assert len(a.fake.seen("ListObjects")) == 5
        # a server from before paging answers everything and no token: the limit still holds
        a.fake.handlers["ListObjects"] = lambda request, context: pb.ListObjectsResponse(
            objects=[pb.ObjectInfo(name=n) for n in names])
        assert [o["name"] for o in c.list_objects(limit=3)] == names[:3]
        assert len(c.list_objects()) == 25


def test_the_asyncio_client_follows_pages(replicas):
    from gesmas.aio import Client as AioClient
    a = replicas[0]
    names = [f"n{i:02d}" for i in range(25)]
    a.fake.handlers["ListObjects"] = _paging_server(names)

    async def main() -> tuple[list[str], list[str]]:
        async with AioClient(a.address, call_stream=False) as c:
            every = [o["name"] async for o in c.iter_objects(page_size=10)]
            some = await c.list_objects(prefix="n2", limit=3)
            with pytest.raises(ValueError, match="limit must be None"):
                c.iter_objects(limit=-5)
            return every, [o["name"] for o in some]
    every, some = asyncio.run(main())
    assert every == names and some == ["n20", "n21", "n22"]
    assert [(r.limit, r.page_token) for r in a.fake.seen("ListObjects")] == [
        (10, ""), (10, "n09"), (10, "n19"), (3, "")]


def test_convert_round_trip():
    x = {"a": [None, True, 1, -2.5, "é", b"\x00", [], {}], "b": {"c": (1, 2)}}
    back = convert.from_value(convert.to_value(x))
    assert back == {"a": [None, True, 1, -2.5, "é", b"\x00", [], {}], "b": {"c": [1, 2]}}
    assert type(back["a"][1]) is bool
    with pytest.raises(InvalidArgument, match=r"value: key 1 of type int"):
        convert.to_value({1: 2})


# --- CLI ---------------------------------------------------------------------------------


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_call_with_create(replicas, capsys):
    a = replicas[0]
    a.fake.handlers["Invoke"] = lambda request, context: pb.InvokeResponse(
        result=convert.to_value({"got": b"hi", "n": [1]}))
    rc, out, err = run_cli(capsys, "call", "Queue", "jobs", "produce", "hello", "42",
                           '{"$bytes": "aGk="}', "--cluster", cluster(replicas),
                           "--create", "[10]", "--timeout", "3")
    assert (rc, err) == (0, "")
    assert json.loads(out) == {"got": {"$bytes": "aGk="}, "n": [1]}
    create, = a.fake.seen("CreateObject")
    assert [convert.from_value(v) for v in create.args] == [10]
    inv, = a.fake.seen("Invoke")
    assert [convert.from_value(v) for v in inv.args] == ["hello", 42, b"hi"]
    assert (inv.class_name, inv.object_name, inv.method, inv.timeout) == (
        "Queue", "jobs", "produce", 3.0)
    assert len(a.fake.seen("CloseSession")) == 1


def test_cli_server_error_is_one_line(replicas, capsys):
    replicas[0].fake.handlers["Invoke"] = lambda request, context: fail(
        context, grpc.StatusCode.NOT_FOUND, pb.ERROR_CODE_NOT_FOUND, "no object named 'x'")
    rc, out, err = run_cli(capsys, "call", "Queue", "x", "consume", "--cluster",
                           cluster(replicas))
    assert (rc, out) == (1, "") and err.count("\n") == 1
    # a missing object hints at --create (issue 26, point 15)
    assert err.startswith("gesmas: NOT_FOUND: no object named 'x' (to make it first: --create")


def test_cli_passes_any_keyword_but_timeout(replicas, capsys):
    """--kwargs reaches the method whatever its keys (`method`, `name`...), but for
    `timeout`, which bounds the call's wait: that is refused and --timeout suggested."""
    a = replicas[0]
    rc, out, err = run_cli(capsys, "call", "Queue", "q", "m", "--cluster", cluster(replicas),
                           "--kwargs", '{"method": 1, "class_name": 2, "object_name": 3}')
    assert (rc, err) == (0, "")
    inv, = a.fake.seen("Invoke")
    assert {k: convert.from_value(v) for k, v in inv.kwargs.items()} == {
        "method": 1, "class_name": 2, "object_name": 3}
    rc, out, err = run_cli(capsys, "call", "Queue", "q", "m", "--create", '{"name": 1}',
                           "--cluster", cluster(replicas))
    assert (rc, err) == (0, "")
    create, = a.fake.seen("CreateObject")
    assert {k: convert.from_value(v) for k, v in create.kwargs.items()} == {"name": 1}


def test_cli_unreachable_cluster_is_one_line(capsys):
    rc, out, err = run_cli(capsys, "objects", "--cluster", closed_port(),
                           "--retry-timeout", "0.2")
    assert rc == 1 and out == ""
    assert err.startswith("gesmas: UNAVAILABLE: ") and err.count("\n") == 1


@pytest.mark.parametrize("argv, says", [
    (["call", "Queue", "q"], "required"),
    (["call", "Queue", "q", "produce", "--create", "[1"], "--create: not valid JSON"),
    (["call", "Queue", "q", "produce", "--create", "3"], "--create: expected"),
    (["call", "Queue", "q", "produce", '{"$bytes": "!!"}'], "base64"),
    (["frobnicate"], "invalid choice"),
    (["objects", "--limit", "-1"], "--limit: must be >= 0"),
    (["ls", "--limit", "ten"], "--limit: not an integer"),
    (["status", "--cluster", ","], "--cluster"),
    # issue 26, points 5 and 15
    (["call", "Queue", "q", "consume", "--kwargs", '{"timeout": 1}'], "write --timeout 1"),
    (["call", "Queue", "q", "consume", "--timeout", "nan"], "not 'nan'"),
    (["call", "Queue", "q", "consume", "--timeout", "-1"], ">= 0, not '-1'"),
    (["call", "Queue", "q", "consume", "--timeout", "soon"], "not a number"),
    (["status", "--retry-timeout", "nan"], "--retry-timeout"),
    (["call", "Queue", "q", "produce", '{"a": 1,}'], "'{\"a\": 1,}' is not valid JSON"),
    (["call", "Queue", "q", "produce", "[1, 2"], "is not valid JSON"),
    (["role", "grant", "r", "invoke"], "give a PREFIX (e.g. jobs/), or --all-names"),
    (["role", "revoke", "r", "register"], "on which class names?"),
    (["role", "grant", "r", "invoke", "jobs/", "--all-names"], "not both"),
    (["role", "grant", "r", "admin", "jobs/"], "admin takes no PREFIX"),
])
def test_cli_usage_errors(capsys, argv, says):
    rc, out, err = run_cli(capsys, *argv)       # each is refused before any connection
    assert rc == 2 and out == ""
    assert err.startswith("gesmas: ") and err.count("\n") == 1 and says in err, err


@pytest.mark.parametrize("argv, prefix", [
    (["role", "grant", "r", "invoke", "jobs/"], "jobs/"),
    (["role", "grant", "r", "invoke", ""], ""),
    (["role", "grant", "r", "invoke", "--all-names"], ""),
    (["role", "revoke", "r", "register", "--all-names"], ""),
    (["role", "grant", "r", "admin"], ""),
])
def test_cli_permission_on_every_name_is_explicit(argv, prefix):
    from gesmas.client import cli_auth
    args = cli.build_parser().parse_args(argv)
    assert cli_auth.auth_params(args) == (args.op, {"name": "r", "action": argv[3],
                                                    "prefix": prefix})


def _cli_process(*argv: str, **kw: Any) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gesmas.client.cli", *argv],
                            stderr=subprocess.PIPE, text=True, **kw)


def test_cli_user_add_without_a_terminal_says_use_password_stdin():
    # a new session has no controlling terminal, and stdin is not one: nowhere to prompt
    p = _cli_process("user", "add", "bob", "--cluster", closed_port(),
                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, start_new_session=True)
    out, err = p.communicate(timeout=60)
    assert (p.returncode, out) == (2, "")
    assert err == ("gesmas: no terminal to type a password on: use --password-stdin to read "
                   "the new password from the first line of stdin\n")
    p = _cli_process("user", "add", "bob", "--password-stdin", "--cluster", closed_port(),
                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 2 and "stdin is empty" in err


def test_cli_into_a_closed_pipe_stops_quietly(replicas):
    """`gesmas objects | head -0`: the reader is gone before anything is written."""
    p = _cli_process("objects", "--cluster", cluster(replicas), stdout=subprocess.PIPE)
    p.stdout.close()                      # nobody reads: the first write fails with EPIPE
    code = p.wait(timeout=60)             # bounded: a process that hangs fails the test
    err = p.stderr.read()
    assert code == 141 and err == ""


def test_cli_tables(replicas, capsys):
    rc, out, _ = run_cli(capsys, "objects", "--cluster", cluster(replicas))
    assert rc == 0 and out.split() == ["NAME", "CLASS", "VERSION", "WAITERS", "jobs", "Queue",
                                       "1", "2"]
    rc, out, _ = run_cli(capsys, "classes", "--json", "--cluster", cluster(replicas))
    assert rc == 0 and json.loads(out) == {"Lock": 1}
    rc, out, _ = run_cli(capsys, "status", "--cluster", cluster(replicas))
    assert rc == 0 and out.startswith("leader")


def test_cli_consistency_reaches_every_read(replicas, capsys, monkeypatch):
    """--consistency (or GESMAS_CONSISTENCY) is that of the reads the CLI makes: a call of
    a method (the server serves a declared reader as a read), the listings and status;
    status alone reads sequentially unless told, so that it answers without a leader."""
    a = replicas[0]
    rc, _, err = run_cli(capsys, "call", "Counter", "n", "get", "--cluster", cluster(replicas),
                         "--consistency", "sequential")
    assert (rc, err) == (0, "")
    inv, = a.fake.seen("Invoke")
    assert inv.read.consistency == pb.CONSISTENCY_SEQUENTIAL
    run_cli(capsys, "objects", "--cluster", cluster(replicas), "--consistency", "sequential")
    req, = a.fake.seen("ListObjects")
    assert req.read.consistency == pb.CONSISTENCY_SEQUENTIAL
    run_cli(capsys, "status", "--cluster", cluster(replicas))
    run_cli(capsys, "status", "--cluster", cluster(replicas), "--consistency", "linearizable")
    assert [r.read.consistency for r in a.fake.seen("Status")] == [
        pb.CONSISTENCY_SEQUENTIAL, pb.CONSISTENCY_LINEARIZABLE]
    monkeypatch.setenv("GESMAS_CONSISTENCY", "sequential")
    run_cli(capsys, "classes", "--cluster", cluster(replicas))
    req, = a.fake.seen("ListClasses")
    assert req.read.consistency == pb.CONSISTENCY_SEQUENTIAL
    monkeypatch.setenv("GESMAS_CONSISTENCY", "eventual")
    rc, out, err = run_cli(capsys, "objects", "--cluster", cluster(replicas))
    assert (rc, out) == (2, "")
    assert err == "gesmas: GESMAS_CONSISTENCY: must be linearizable or sequential, not " \
                  "'eventual'\n"
    rc, _, err = run_cli(capsys, "objects", "--consistency", "eventual")
    assert rc == 2 and "invalid choice: 'eventual'" in err


def test_cli_objects_filters_and_limit(replicas, capsys):
    a = replicas[0]
    a.fake.handlers["ListObjects"] = _paging_server(["jobs/1", "jobs/2", "jobs/3", "locks/a"])
    rc, out, _ = run_cli(capsys, "ls", "--prefix", "jobs/", "--class", "Counter", "--limit",
                         "2", "--json", "--cluster", cluster(replicas))
    assert rc == 0 and [o["name"] for o in json.loads(out)] == ["jobs/1", "jobs/2"]
    [req] = a.fake.seen("ListObjects")
    assert (req.prefix, req.class_name, req.limit) == ("jobs/", "Counter", 2)
    rc, out, _ = run_cli(capsys, "objects", "--prefix", "locks/", "--cluster",
                         cluster(replicas))
    assert rc == 0 and out.split() == ["NAME", "CLASS", "VERSION", "WAITERS", "locks/a",
                                       "Counter", "1", "0"]


def test_cli_plain_word_is_a_string():
    assert cli.parse_arg("hello") == "hello"
    assert cli.parse_arg('"42"') == "42"
    assert cli.parse_arg("42") == 42
    assert cli.parse_arg('{"$bytes": "aGk="}') == b"hi"
    assert cli.parse_arg("1.2.3") == "1.2.3" and cli.parse_arg("a{b") == "a{b"
    for broken in ('{"a": 1,}', "[1,", '"open', ' {}x'):
        with pytest.raises(cli.UsageError, match="not valid JSON"):
            cli.parse_arg(broken)


def test_cli_server_commands_hand_over_their_arguments(monkeypatch, tmp_path, capsys):
    got: dict[str, Any] = {}
    node = types.ModuleType("gesmas.server.main")
    node.run_up = lambda args: got.setdefault("up", args) and 0  # type: ignore[attr-defined]
    node.run_server = lambda args: got.setdefault("server", args) and 0  # type: ignore
    monkeypatch.setitem(__import__("sys").modules, "gesmas.server.main", node)
    monkeypatch.setenv("GESMAS_CLUSTER_SECRET", "s3cret")

    assert cli.main(["up", "--nodes", "5", "--base-port", "8100", "--unsafe-no-fsync"]) == 0
    up = got["up"]
    assert (up.nodes, up.base_port, up.data_dir, up.unsafe_no_fsync) == (5, 8100, None, True)

    config = tmp_path / "n2.json"
    assert cli.main(["server", "--config", str(config), "--client-addr", "0.0.0.0:9",
                     "--peers", "a:1, b:2", "--skip-entry", "4"]) == 0
    s = got["server"]          # handed over as given: gesmas.server.config merges the sources
    assert (s.config, s.client_addr, s.peers, s.skip_entries, s.id) == (
        str(config), "0.0.0.0:9", ["a:1", "b:2"], [4], None)


def test_call_stream_setting_from_argument_and_environment(monkeypatch):
    from gesmas.client import core
    monkeypatch.delenv("GESMAS_CALL_STREAM", raising=False)
    assert core.call_stream_setting(None) is True
    for off in ("0", "false", "No", " off "):
        monkeypatch.setenv("GESMAS_CALL_STREAM", off)
        assert core.call_stream_setting(None) is False
        assert core.call_stream_setting(True) is True       # the argument wins
    monkeypatch.setenv("GESMAS_CALL_STREAM", "1")
    assert core.call_stream_setting(None) is True
    assert core.call_stream_setting(False) is False


# --- sessions: fail-over of keep-alives, the lease, listeners, expiry ---------------------


def hang(released: threading.Event) -> Callable[..., Any]:
    """A replica that takes the request and never answers (until ``released``): a hung
    process, as a SIGSTOPped leader is to its clients."""
    def handler(request: Any, context: grpc.ServicerContext) -> Any:
        released.wait(WAIT * 4)
        return pb.KeepAliveResponse(ttl=10.0)
    return handler


def fence_of(n: int) -> Callable[..., Any]:
    def handler(request: Any, context: grpc.ServicerContext) -> Any:
        return pb.InvokeResponse(result=convert.to_value(n if request.method != "release"
                                                         else None))
    return handler


def test_lease_states_are_a_function_of_the_clock():
    from gesmas.client.session import Lease, SessionState, lease_margin
    lease = Lease(7, ttl=10.0, sent=100.0, interval=2.5, deadline=1.0)
    assert lease_margin(10.0) == pytest.approx(1.1) and lease_margin(1.0) == 0.25
    assert lease.valid_until == pytest.approx(108.9)
    assert lease.state(103.4) is SessionState.CONNECTED
    assert lease.state(103.5) is SessionState.SUSPENDED      # the due keep-alive is late
    assert lease.next_change(103.5) == pytest.approx(108.9)
    lease.acknowledged(104.0, 10.0, 2.5, 1.0, now=104.1)     # valid from its send time
    assert lease.state(104.1) is SessionState.CONNECTED and lease.valid_until == 112.9
    assert lease.state(112.9) is SessionState.LOST
    lease.acknowledged(112.0, 10.0, 2.5, 1.0, now=113.0)     # too late: lost for good
    assert lease.state(113.0) is SessionState.LOST and not lease.by_server


def test_hints_naming_a_hung_replica_are_not_followed():
    from gesmas.client.core import Routing
    r = Routing(["a", "b", "c"], route_leader=True)
    r.learn_leader("a")
    r.suspect("a", now=10.0)
    assert r.first(keepalive=True, now=10.0) == "b"
    assert r.next("b", "a", keepalive=True, now=10.5) == "c"   # b still names a
    assert r.next("c", "", keepalive=True, now=10.6) == "b"    # a is skipped
    assert r.next("b", "a", keepalive=True, now=12.1) == "a"   # suspicion over


def test_keepalive_moves_off_a_hung_leader_to_the_new_one(replicas):
    a, b, c_ = replicas
    released, renewed = threading.Event(), threading.Semaphore(0)
    a.fake.handlers["OpenSession"] = leader_is(a.address)
    a.fake.handlers["KeepAlive"] = hang(released)
    b.fake.handlers["KeepAlive"] = unavailable(hint=a.address)   # still names the old one

    def keepalive(request, context):
        renewed.release()
        return pb.KeepAliveResponse(ttl=3.0)

    c_.fake.handlers["KeepAlive"] = keepalive
    try:
        with Client(cluster(replicas), session_ttl=3.0) as c:
            assert renewed.acquire(timeout=WAIT) and renewed.acquire(timeout=WAIT)
            assert len(a.fake.seen("KeepAlive")) == 1    # one attempt there, then elsewhere
            assert c.leader == c_.address
            assert c.state != "lost"
    finally:
        released.set()


def late_keepalives(replicas: list[Replica], late: float, ttl: float) -> threading.Semaphore:
    """Every replica answers each keep-alive `late` seconds after it came (a leader busy
    for a while, not hung); the semaphore counts the answers."""
    answered = threading.Semaphore(0)

    def handler(request, context):
        time.sleep(late)                   # the busy leader's delay, not a synchronisation
        answered.release()
        return pb.KeepAliveResponse(ttl=ttl)

    for r in replicas:
        r.fake.handlers["KeepAlive"] = handler
    return answered


def test_keepalives_answered_after_their_deadline_still_renew_the_session(replicas):
    """A TTL of 2 s gives each keep-alive attempt 0.5 s and the lease 1.5 s from a send;
    every keep-alive is answered after 0.7 s. Each attempt is given up at its deadline (the
    round goes on elsewhere), but its answer still renews the lease: the session outlives
    its TTL (given up answers, it would be lost 1.5 s after it opened)."""
    answered = late_keepalives(replicas, 0.7, 2.0)
    heard: list[str] = []
    with Client(cluster(replicas), session_ttl=2.0) as c:
        c.add_listener(lambda state: heard.append(str(state)))
        until = time.monotonic() + 2.5
        while time.monotonic() < until:
            assert answered.acquire(timeout=WAIT), "the keep-alives stopped"
        assert c.state != "lost" and not c.expired, heard
        assert "lost" not in heard
        assert c.invoke("Queue", "q", "size").startswith("size#")


def test_aio_keepalives_answered_after_their_deadline_still_renew_the_session(replicas):
    import asyncio

    from gesmas.aio import Client as AioClient
    answered = late_keepalives(replicas, 0.7, 2.0)

    async def main() -> None:
        async with AioClient(cluster(replicas), session_ttl=2.0) as c:
            until = time.monotonic() + 2.5
            while time.monotonic() < until:
                assert await asyncio.to_thread(answered.acquire, timeout=WAIT), \
                    "the keep-alives stopped"
            assert c.state != "lost" and not c.expired
            assert (await c.invoke("Queue", "q", "size")).startswith("size#")

    asyncio.run(main())


def test_a_session_without_answers_is_suspended_then_lost_and_the_lock_not_held(replicas):
    released = threading.Event()
    heard: list[str] = []
    lost = threading.Event()

    def listener(state):
        heard.append(str(state))
        if state == "lost":
            lost.set()

    for r in replicas:
        r.fake.handlers["Invoke"] = fence_of(41)
    c = Client(cluster(replicas), session_ttl=2.0)
    try:
        c.add_listener(listener)
        lock = c.lock("l")
        with lock as fence:
            assert fence == 41 and fence.held and lock.held
            assert fence.valid_until is not None and fence.valid_until <= c.valid_until
            for r in replicas:
                r.fake.handlers["KeepAlive"] = hang(released)
            assert lost.wait(WAIT)
            assert not fence.held and not lock.held and fence.valid_until is None
            assert c.state == "lost" and c.expired
            n = sum(len(invokes(r)) for r in replicas)
            with pytest.raises(SessionExpired):
                c.invoke("Queue", "q", "size")                # at once, nothing sent
            assert sum(len(invokes(r)) for r in replicas) == n
            c._keepalive.join(WAIT)       # it tried to close the session it gave up
            assert sum(len(r.fake.seen("CloseSession")) for r in replicas) == 1
            released.set()
            lock.release = lambda: None       # type: ignore[method-assign]  # session gone
        assert heard == ["suspended", "lost"]     # connected was before add_listener
    finally:
        released.set()
        c.close()


def test_on_expiry_reopen_opens_a_new_session(replicas):
    a = replicas[0]
    sessions = iter([7, 8])
    a.fake.handlers["OpenSession"] = lambda request, context: pb.OpenSessionResponse(
        session=next(sessions), ttl=request.ttl)
    a.fake.handlers["KeepAlive"] = lambda request, context: fail(
        context, grpc.StatusCode.NOT_FOUND, pb.ERROR_CODE_NOT_FOUND, "no session 7")
    heard: list[str] = []
    with Client(cluster(replicas), session_ttl=0.5, on_expiry="reopen") as c:
        c.add_listener(lambda state: heard.append(str(state)))
        first = c._keepalive
        assert first is not None
        first.join(WAIT)                    # the server said: session 7 is gone
        assert not c.expired
        a.fake.handlers["KeepAlive"] = lambda request, context: pb.KeepAliveResponse(ttl=0.5)
        assert c.invoke("Queue", "q", "size") == "size#1"      # a new session, new seqs
        assert [r.session for r in a.fake.seen("Invoke")] == [8]
        assert heard == ["lost", "connected"]
    with pytest.raises(ValueError, match="on_expiry"):
        Client("127.0.0.1:1", on_expiry="retry", connect=False)


def test_aio_session_lost_is_heard_and_the_lock_not_held(replicas):
    import asyncio

    from gesmas.aio import Client as AioClient
    released = threading.Event()
    for r in replicas:
        r.fake.handlers["Invoke"] = fence_of(41)

    async def main() -> None:
        lost = asyncio.Event()
        heard: list[str] = []

        def listener(state):
            heard.append(str(state))
            if state == "lost":
                lost.set()

        async with AioClient(cluster(replicas), session_ttl=2.0) as c:
            c.add_listener(listener)
            lock = c.lock("l")
            fence = await lock.acquire()
            assert fence == 41 and lock.held and fence.held
            for r in replicas:
                r.fake.handlers["KeepAlive"] = hang(released)
            await asyncio.wait_for(lost.wait(), WAIT)
            assert not lock.held and c.state == "lost" and c.expired
            with pytest.raises(SessionExpired):
                await c.queue("q").size()
            released.set()
        assert heard == ["suspended", "lost"]

    try:
        asyncio.run(main())
    finally:
        released.set()


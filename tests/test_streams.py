"""The Calls stream (server/gesmas/server/streams.py) against a real cluster, driven raw:
per-call cancellation and deadlines withdraw the wait on the replica, a stream that breaks
withdraws every wait it carried, malformed and hostile messages get an answer naming what
is wrong without ending the stream, answers a peer does not read are bounded and lose
nothing, and a flood of blocked calls on one stream is held back instead of buffered.
The client's use of the stream (fail-over, unary fallback) is covered by the fault suite
(every Invoke goes over a stream by default) and tests/test_client_unit.py."""
from __future__ import annotations

import math
import queue
import threading
import time

import pytest

import rawgrpc
from gesmas.client import Client, InvalidArgument, convert
from gesmas.protocol import values
from gesmas.server import streams
from gesmas.v1 import gesmas_pb2 as pb
from gesmas.v1 import gesmas_pb2_grpc as pb_grpc


def until(cond, timeout=30.0, what="condition"):
    """Poll `cond` (a question to the cluster) until it holds; each poll is a full call."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def leader_of(client) -> str:
    """The leader's client address: as the client last learned it, or asked of the cluster
    when the client has just suspected it (a keep-alive late on a loaded machine forgets the
    leader until the next answer names it)."""
    address = client.leader
    while not address:
        address = client.status()["leader_address"]
    return address


def _next(it):
    try:
        return next(it), None
    except BaseException as e:          # StopIteration, an RpcError: raised by the caller
        return None, e


class Raw:
    """One Calls stream on a raw channel, with a session of its own."""

    def __init__(self, address: str) -> None:
        self.ch = rawgrpc.channel(address, options=[("grpc.max_receive_message_length",
                                                     64 * 1024 * 1024)])
        self.md = rawgrpc.metadata(self.ch)
        self.stub = pb_grpc.GesmasStub(self.ch)
        s = self.stub.OpenSession(pb.OpenSessionRequest(ttl=120), metadata=self.md, timeout=10)
        self.session, self.secret = s.session, s.session_secret
        self.out: queue.SimpleQueue = queue.SimpleQueue()
        self.rpc = self.stub.Calls(self._gen(), metadata=self.md)
        self.seq = 0

    def _gen(self):
        while (m := self.out.get()) is not None:
            yield m

    def invoke(self, call_id, obj, method, *args, deadline=0.0, **fields):
        self.seq += 1
        inv = pb.InvokeRequest(session=self.session, session_secret=self.secret,
                               seq=fields.pop("seq", self.seq), class_name="Queue",
                               object_name=obj, method=method, create=True, **fields)
        convert.fill_values(inv.args, args)
        self.out.put(pb.Call(id=call_id, invoke=inv, deadline=deadline))
        return inv.seq

    def send(self, msg):
        self.out.put(msg)

    def answer(self, timeout: float = 60.0):
        """The next answer; a test fails rather than hangs when none comes (a lost answer is
        a bug to see, not a suite that never ends)."""
        got: list = []
        reader = threading.Thread(target=lambda: got.append(_next(self.rpc)), daemon=True)
        reader.start()
        reader.join(timeout)
        if not got:
            raise AssertionError(f"no answer on the stream within {timeout:g} s")
        value, error = got[0]
        if error is not None:
            raise error
        return value

    def close(self):
        self.out.put(None)
        self.rpc.cancel()
        self.ch.close()


def waiters(c: Client) -> int:
    return c.status()["waiter_count"]


def result(answer):
    assert not answer.HasField("error"), answer.error
    return convert.from_value(answer.response.result)


@pytest.fixture(scope="module")
def client(cluster):
    with Client(cluster.addresses) as c:
        yield c


@pytest.fixture()
def raw(cluster, client):
    r = Raw(leader_of(client))
    yield r
    r.close()


def test_calls_are_answered_by_id_in_completion_order(raw, client):
    raw.invoke(1, "st-order", "consume")                 # waits: the queue is empty
    raw.invoke(2, "st-order", "produce", "a")
    first = raw.answer()
    assert first.id == 2 and result(first) is None
    second = raw.answer()
    assert second.id == 1 and result(second) == "a"


def test_a_cancel_withdraws_the_wait_and_loses_no_item(raw, client):
    before = waiters(client)
    raw.invoke(7, "st-cancel", "consume")
    until(lambda: waiters(client) == before + 1, what="the consume to wait")
    raw.send(pb.Call(id=7, cancel=True))
    a = raw.answer()
    assert a.id == 7 and a.error.code == pb.ERROR_CODE_ABORTED and a.error.type == "Cancelled"
    until(lambda: waiters(client) == before, what="the wait to be withdrawn")
    client.queue("st-cancel").produce("kept")
    assert client.queue("st-cancel").consume(timeout=5) == "kept"
    # a cancel of an id not in flight is ignored; the stream goes on
    raw.send(pb.Call(id=7, cancel=True))
    raw.send(pb.Call(id=12345, cancel=True))
    raw.invoke(8, "st-cancel", "size")
    assert result(raw.answer()) == 0


def test_a_deadline_withdraws_the_wait(raw, client):
    before = waiters(client)
    raw.invoke(1, "st-deadline", "consume", deadline=0.5)
    a = raw.answer()
    assert a.error.code == pb.ERROR_CODE_UNAVAILABLE and a.error.type == "CallDeadline"
    until(lambda: waiters(client) == before, what="the wait to be withdrawn")
    client.queue("st-deadline").produce("kept")
    assert client.queue("st-deadline").consume(timeout=5) == "kept"


def test_a_broken_stream_withdraws_every_wait_it_carried(cluster, client):
    """300 waits on one stream whose client vanishes: every one is withdrawn (no item goes
    to the dead client), a slice at a time on the replica's event loop, in a few log
    entries (Cancel.more) rather than one per wait."""
    n = 300
    before = waiters(client)
    r = Raw(leader_of(client))
    for i in range(n):
        r.invoke(i + 1, "st-broken", "consume")
    until(lambda: waiters(client) == before + n, what=f"{n} waits")
    commit = client.status()["commit_index"]
    r.rpc.cancel()                                         # the client vanishes
    until(lambda: waiters(client) == before, what="the waits to be withdrawn")
    assert client.status()["commit_index"] - commit < n // 10
    r.ch.close()
    q = client.queue("st-broken")
    for i in range(20):
        q.produce(i)
    assert [q.consume(timeout=5) for _ in range(20)] == list(range(20))


def test_half_close_lets_the_calls_in_flight_finish(raw, client):
    raw.invoke(1, "st-half", "consume")
    raw.out.put(None)                                      # no more calls
    client.queue("st-half").produce("last")
    assert result(raw.answer()) == "last"
    with pytest.raises(StopIteration):                     # then the RPC ends
        raw.answer()


@pytest.mark.parametrize("msg, match", [
    (pb.Call(id=1), "invoke or a cancel"),
    (pb.Call(id=1, invoke=pb.InvokeRequest(seq=1, object_name="x", method="size"),
             deadline=-1.0), "deadline"),
    (pb.Call(id=1, invoke=pb.InvokeRequest(seq=1, object_name="x", method="size"),
             deadline=math.nan), "deadline"),
    (pb.Call(id=1, invoke=pb.InvokeRequest(seq=1, object_name="x", method="size"),
             deadline=1e300), "deadline"),
    (pb.Call(id=1, invoke=pb.InvokeRequest(seq=0, object_name="x", method="size")), "seq"),
    (pb.Call(id=1, invoke=pb.InvokeRequest(seq=1, object_name="", method="size")),
     "object_name"),
])
def test_malformed_calls_are_answered_and_the_stream_goes_on(raw, msg, match):
    raw.send(msg)
    a = raw.answer()
    assert a.id == 1 and a.error.code == pb.ERROR_CODE_INVALID_ARGUMENT
    assert match in a.error.message
    raw.invoke(2, "st-bad", "size")
    assert result(raw.answer()) == 0


def test_hostile_session_fields_are_refused_per_call(raw, client):
    inv = pb.InvokeRequest(session=raw.session, session_secret="0" * 32, seq=1,
                           class_name="Queue", object_name="st-hostile", method="size",
                           create=True)
    raw.send(pb.Call(id=1, invoke=inv))
    assert raw.answer().error.code == pb.ERROR_CODE_PERMISSION_DENIED
    inv.session_secret, inv.session = raw.secret, client.session    # someone else's id
    raw.send(pb.Call(id=2, invoke=inv))
    assert raw.answer().error.code == pb.ERROR_CODE_PERMISSION_DENIED


def test_a_duplicate_id_in_flight_is_refused_and_the_first_call_answered(raw, client):
    raw.invoke(5, "st-dup", "consume")
    raw.invoke(5, "st-dup", "size")
    a = raw.answer()
    assert a.id == 5 and a.error.code == pb.ERROR_CODE_INVALID_ARGUMENT
    assert "already in flight" in a.error.message
    client.queue("st-dup").produce("x")
    a = raw.answer()
    assert a.id == 5 and result(a) == "x"


def test_a_retry_on_another_stream_gets_the_same_result(cluster, client):
    """Exactly-once across streams: the same (session, seq) on a second stream joins or
    repeats the first call's answer, it does not run again."""
    r1 = Raw(leader_of(client))
    try:
        seq = r1.invoke(1, "st-retry", "produce", "once")
        assert result(r1.answer()) is None
        r2 = Raw(leader_of(client))
        try:
            r2.session, r2.secret = r1.session, r1.secret
            r2.invoke(1, "st-retry", "produce", "once", seq=seq)
            assert result(r2.answer()) is None
        finally:
            r2.close()
    finally:
        r1.close()
    assert client.queue("st-retry").invoke("size") == 1


def test_unread_answers_are_bounded_and_nothing_is_lost(cluster, client):
    """A peer that asks for 48 items of 900 kB and reads nothing: the replica queues at most
    its answer budget (2 x 16 MiB) of answers for the stream and replaces the others with
    UNAVAILABLE "AnswerBudget"; retrying those seqs gets the very items consumed for them."""
    n, item = 48, 900_000
    q = client.queue("st-big")
    for i in range(n):
        q.produce(bytes([i]) * item)
    r = Raw(leader_of(client))
    try:
        seqs = {i + 1: r.invoke(i + 1, "st-big", "consume") for i in range(n)}
        until(lambda: q.invoke("size") == 0, what="every consume to run")
        got, refused = {}, []
        for _ in range(n):
            a = r.answer()
            if a.HasField("error"):
                assert a.error.type == "AnswerBudget", a.error
                refused.append(a.id)
            else:
                got[a.id] = result(a)
        assert refused, "nothing was held back: the budget was not reached"
        for call_id in refused:                            # the client's retry, same seq
            r.invoke(call_id, "st-big", "consume", seq=seqs[call_id])
            a = r.answer()
            got[a.id] = result(a)
        assert sorted(v[0] for v in got.values()) == list(range(n))
    finally:
        r.close()


def test_a_flood_of_blocked_calls_on_one_stream_is_held_back(cluster, client):
    """More blocked calls than MAX_IN_FLIGHT on one stream: the replica stops reading the
    stream (flow control) instead of buffering, and serves every call once items come."""
    n = streams.MAX_IN_FLIGHT + 200
    before = waiters(client)
    r = Raw(leader_of(client))
    try:
        for i in range(n):
            r.invoke(i + 1, "st-flood", "consume")
        until(lambda: waiters(client) == before + streams.MAX_IN_FLIGHT, 60,
              "the stream's calls to wait")
        q = client.queue("st-flood")
        produced: list[int] = []

        def produce(first):              # four producers: their commits go together
            for i in range(first, n, 4):
                q.produce(i)
                produced.append(i)
        threads = [threading.Thread(target=produce, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        got = sorted(result(r.answer()) for _ in range(n))
        for t in threads:
            t.join(60)
        assert sorted(produced) == got == list(range(n))
    finally:
        r.close()


def test_the_unary_invoke_still_works(cluster):
    with Client(cluster.addresses, call_stream=False) as c:
        c.queue("st-unary").produce(1)
        assert c.queue("st-unary").consume(timeout=5) == 1
        assert not c._streams


def test_a_client_deadline_sends_a_cancel(cluster, client):
    """The client's own deadline (a replica that does not answer): CallStream.call waits
    `deadline`, sends a cancel and raises Failure, so the wait does not stay behind."""
    from gesmas.client import core
    from gesmas.client.streams import CallStream
    c = Client(cluster.addresses)
    try:
        c.queue("st-client-deadline")
        address = leader_of(c)
        stream = c._stream(address, ())
        assert isinstance(stream, CallStream)
        before = waiters(client)
        request = pb.InvokeRequest(session=c.session, session_secret=c._session_secret,
                                   seq=c._new_seq(), class_name="Queue",
                                   object_name="st-client-deadline", method="consume")
        with pytest.raises(core.Failure, match="no answer within"):
            stream.call(request, 0.5)
        until(lambda: waiters(client) == before, what="the wait to be withdrawn")
    finally:
        c.close()


def test_calls_cancelled_as_soon_as_sent_are_answered_and_accounted(raw, client):
    """A cancel right behind its call (it may arrive before the call's task has run): each
    call is answered Cancelled, no wait stays behind, and the stream can still end (the
    replica counted every call as answered)."""
    before = waiters(client)
    for i in range(1, 51):
        raw.invoke(i, "st-instant", "consume")
        raw.send(pb.Call(id=i, cancel=True))
    answers = [raw.answer() for _ in range(50)]
    assert sorted(a.id for a in answers) == list(range(1, 51))
    assert all(a.error.type == "Cancelled" for a in answers), answers
    until(lambda: waiters(client) == before, what="no wait to stay behind")
    raw.out.put(None)                                      # half-close: the RPC must end
    with pytest.raises(StopIteration):
        raw.answer()


# -- followed readers (Call.follow): a watch stream ------------------------------------------------

def _follow_call(raw, call_id, obj, method, *args, argument="after_revision", key="revision",
                 class_name="Map", timeout=None, **kwargs):
    raw.seq += 1
    inv = pb.InvokeRequest(session=raw.session, session_secret=raw.secret, seq=raw.seq,
                           class_name=class_name, object_name=obj, method=method, create=True,
                           timeout=timeout)
    convert.fill_values(inv.args, args)
    convert.fill_map(inv.kwargs, kwargs)
    raw.send(pb.Call(id=call_id, invoke=inv, follow=pb.Follow(argument=argument, key=key)))


def test_a_followed_watch_answers_each_change_under_one_id_until_cancelled(raw, client):
    """One Call with `follow`: the replica answers every change under the prefix under that
    call's id (`more` set), with no further message from the peer; changes to other keys
    send nothing; a cancel ends it (the last answer, `more` unset) and the stream goes on."""
    m = client.map("st-follow")
    start = m.put("k/0", 0)["revision"]
    _follow_call(raw, 5, "st-follow", "watch", "k/", after_revision=start - 1)
    first = raw.answer()
    assert first.id == 5 and first.more
    assert [e["key"] for e in result(first)["events"]] == ["k/0"]
    revs = [start]
    for i in range(1, 6):
        m.put(f"other/{i}", i)                      # not under k/: no answer
        revs.append(m.put(f"k/{i}", i)["revision"])
        a = raw.answer()
        assert a.id == 5 and a.more
        got = result(a)
        assert [(e["key"], e["revision"]) for e in got["events"]] == [(f"k/{i}", revs[-1])]
        assert got["revision"] == revs[-1]
    raw.send(pb.Call(id=5, cancel=True))
    end = raw.answer()
    assert end.id == 5 and not end.more and end.error.type == "Cancelled"
    raw.invoke(6, "st-follow-q", "size")
    assert result(raw.answer()) == 0


def test_follows_too_large_to_share_a_run_each_get_every_change(raw, client):
    """Two follows of one prefix of 4,090 characters (their arguments are past what a shared
    run's key holds, reader_calls.MEMO_KEY_BYTES): each runs the reader alone, and each is
    answered every change under the prefix, in order, and nothing else."""
    m = client.map("st-long", max_key_bytes=4096)
    prefix = "p" * 4090
    start = m.put(prefix + "/0", 0)["revision"]
    for call_id in (7, 8):
        _follow_call(raw, call_id, "st-long", "watch", prefix, after_revision=start, limit=500)
    seen: dict[int, list[int]] = {7: [], 8: []}
    revs = []
    for i in range(1, 4):
        m.put(f"other/{i}", i)
        revs.append(m.put(f"{prefix}/{i}", i)["revision"])
        for _ in range(2):
            a = raw.answer()
            assert a.more and not a.HasField("error"), a
            seen[a.id] += [e["revision"] for e in result(a)["events"]]
    assert seen == {7: revs, 8: revs}
    for call_id in (7, 8):
        raw.send(pb.Call(id=call_id, cancel=True))
    assert sorted(raw.answer().id for _ in range(2)) == [7, 8]


def test_a_follow_with_a_timeout_ends_alone_in_a_shared_wait(raw, client):
    """Two follows of one key from one revision wait as one run; the one whose call has a
    timeout of 1 s is answered Timeout by the replica (not by a client's clock) and ends;
    the other is answered the next change."""
    m = client.map("st-ft")
    start = m.put("k", 0)["revision"]
    _follow_call(raw, 1, "st-ft", "watch", "k", after_revision=start - 1, timeout=1.0)
    _follow_call(raw, 2, "st-ft", "watch", "k", after_revision=start - 1)
    assert sorted(raw.answer().id for _ in range(2)) == [1, 2]     # the put of "k"
    end = raw.answer()
    assert end.id == 1 and not end.more and end.error.type == "Timeout", end
    rev = m.put("k", 1)["revision"]
    a = raw.answer()
    assert a.id == 2 and a.more and result(a)["revision"] == rev
    raw.send(pb.Call(id=2, cancel=True))
    assert raw.answer().id == 2


@pytest.mark.parametrize("call, match", [
    (dict(obj="st-fq", method="produce", args=("x",), class_name="Queue", argument="a",
          key="b"), "not a declared reader"),
    (dict(obj="st-fm", method="watch", args=("k/",), argument="", key="revision"),
     "follow.argument must be 1 to"),
    (dict(obj="st-fm", method="watch", args=("k/",), argument="x" * 129, key="revision"),
     "follow.argument must be 1 to"),
    (dict(obj="st-fm", method="watch", args=("k/",), argument="after_revision", key=""),
     "follow.key must be 1 to"),
    (dict(obj="st-fm", method="watch", args=("k/",), argument="not a name", key="revision"),
     "keyword argument"),
])
def test_what_cannot_be_followed_is_refused_before_it_runs(raw, client, call, match):
    """A writer (its first run would change the state) and malformed Follow fields are
    refused before anything runs; the queue keeps no item of the refused produce."""
    client.map("st-fm").put("k/0", 0)
    _follow_call(raw, 1, call.pop("obj"), call.pop("method"), *call.pop("args"), **call)
    a = raw.answer()
    assert a.id == 1 and not a.more and a.error.code == pb.ERROR_CODE_INVALID_ARGUMENT
    assert match in a.error.message
    assert client.queue("st-fq").size() == 0
    raw.invoke(2, "st-fq", "size")
    assert result(raw.answer()) == 0


@pytest.mark.parametrize("method, args, kwargs, match", [
    ("get", ("k/0",), {"argument": "default", "key": "revision"}, "not a map with the key"),
    ("items", ("k/",), {"argument": "limit", "key": "revision"}, "must move its cursor"),
])
def test_a_reader_that_cannot_be_followed_ends_after_its_first_answer(raw, client, method,
                                                                      args, kwargs, match):
    """The first answer is the reader's; the follow then ends INVALID_ARGUMENT when the
    answer gives no cursor, or one that did not move (it would answer the same for ever)."""
    m = client.map("st-fc")
    m.put("k/0", 0)
    rev = m.revision()
    limit = {"limit": rev} if method == "items" else {}
    _follow_call(raw, 3, "st-fc", method, *args, **kwargs, **limit)
    first = raw.answer()
    assert first.id == 3 and first.more and not first.HasField("error")
    end = raw.answer()
    assert end.id == 3 and not end.more and end.error.code == pb.ERROR_CODE_INVALID_ARGUMENT
    assert match in end.error.message


DEEP = """
class DeepAnswers:
    _readers = ("nest", "watch")

    def __init__(self):
        self.n = 0

    def nest(self, levels):
        x = []
        for _ in range(levels - 1):
            x = [x]
        return x

    def write(self, levels):
        self.n += 1
        return self.nest(levels)

    def watch(self, levels, after=0):
        if self.n <= after:
            raise NotYet()
        return {"n": self.n, "v": self.nest(levels if self.n > 1 else 1)}
"""


def _nested(levels):
    x = {}
    for _ in range(levels - 1):
        x = {"a": x}
    return x


def test_values_nested_deeper_than_a_client_can_read_are_refused_by_name(raw, client):
    """protobuf's parser takes 100 nested messages (a dict level is three), so a replica must
    neither take an argument nor write an answer nested deeper than the wire allows: an
    answer no client can parse broke the client's stream, and the call was sent again for
    ever (a Map value 32 dicts deep hung every `entry`, `items` and `watch` of its map).
    Arguments past MAX_ARG_DEPTH (a raw client's, past the library's own check) and answers
    past MAX_DEPTH get INVALID_ARGUMENT naming the path; the stream goes on."""
    from gesmas.protocol.values import MAX_ARG_DEPTH, MAX_DEPTH

    m = client.map("st-deep")
    m.put("ok", _nested(MAX_ARG_DEPTH))          # the deepest argument: every answer reads
    assert m.entry("ok")["value"] == _nested(MAX_ARG_DEPTH)
    assert m.items("")["items"] and m.watch("", after_revision=0)["events"]
    with pytest.raises(InvalidArgument, match=f"nested more than {MAX_ARG_DEPTH} lists"):
        m.put("no", _nested(MAX_ARG_DEPTH + 1))  # refused by the client library
    inv = pb.InvokeRequest(session=raw.session, session_secret=raw.secret, seq=raw.seq + 1,
                           class_name="Map", object_name="st-deep", method="put",
                           create=True)
    raw.seq += 1
    convert.fill_values(inv.args, ["no"])
    inv.args.add().CopyFrom(values.to_value(_nested(MAX_DEPTH), "raw"))   # past the client
    raw.send(pb.Call(id=1, invoke=inv))
    a = raw.answer()
    assert a.error.code == pb.ERROR_CODE_INVALID_ARGUMENT, a
    assert "args[1]['a']" in a.error.message and f"more than {MAX_ARG_DEPTH}" in a.error.message
    assert "no" not in m.keys("")["keys"]

    client.register_class(DEEP)
    d = client.object("DeepAnswers", "st-deep-answers")
    assert len(str(d.nest(MAX_DEPTH))) == 2 * MAX_DEPTH        # a reader at the limit
    for i, method in enumerate(("nest", "write")):              # a read, a write (it ran)
        raw.seq += 1                  # on the raw stream: an answer it cannot parse ends it
        inv = pb.InvokeRequest(session=raw.session, session_secret=raw.secret, seq=raw.seq,
                               class_name="DeepAnswers", object_name="st-deep-answers",
                               method=method, create=True)
        convert.fill_values(inv.args, [MAX_DEPTH + 1])
        raw.send(pb.Call(id=10 + i, invoke=inv))
        a = raw.answer()
        assert a.id == 10 + i and a.error.code == pb.ERROR_CODE_INVALID_ARGUMENT, a
        assert a.error.message.startswith("result[0][0]")
        assert f"nested more than {MAX_DEPTH} lists" in a.error.message
    _follow_call(raw, 2, "st-deep-answers", "watch", MAX_DEPTH + 1, argument="after",
                 key="n", class_name="DeepAnswers")
    first = raw.answer()                    # n is 1 (the write): a one-level answer
    assert first.id == 2 and first.more and result(first) == {"n": 1, "v": []}
    d.write(1)                              # n is 2: the next answer is too deep
    end = raw.answer()
    assert end.id == 2 and not end.more and end.error.code == pb.ERROR_CODE_INVALID_ARGUMENT
    assert f"more than {MAX_DEPTH} lists" in end.error.message
    raw.invoke(3, "st-deep-q", "size")      # the stream goes on
    assert result(raw.answer()) == 0

"""Followed calls on a Calls RPC of their own (gesmas.client.own_follow), against fake
in-process gRPC replicas whose Calls stream is scripted by the test: the caller's thread
reads the answers (no reader thread), a deadline cancels the RPC and the follow goes on
elsewhere from the last cursor, closing and the client's close end the RPC, and the
deadline keeper's bookkeeping. Waits are bounded events, never sleeps."""
from __future__ import annotations

import collections
import queue
import threading
import time
from concurrent import futures
from typing import Any

import grpc
import pytest

from gesmas.client import Client, convert
from gesmas.client import own_follow
from gesmas.client.own_follow import Deadlines
from gesmas.client import transport as transport_module
from gesmas.v1 import gesmas_pb2 as pb
from gesmas.v1 import gesmas_pb2_grpc as pb_grpc
from test_client_unit import WAIT, Fake, Replica, cluster


class FollowFake(Fake):
    """A replica whose Calls RPCs each answer one followed watch: the k-th RPC from
    ``answers[k]`` (a queue the test fills: a revision, or None to end the RPC); it records
    each follow's after_revision and sets ``ended`` when a Calls RPC ends (cancelled or
    finished)."""

    def __init__(self) -> None:
        super().__init__()
        self.answers: collections.defaultdict[int, queue.SimpleQueue[Any]] = \
            collections.defaultdict(queue.SimpleQueue)
        self.follows: list[int] = []
        self.followed = threading.Event()
        self.ended = threading.Event()

    def Calls(self, request_iterator, context):  # noqa: N802 (gRPC name)
        context.add_callback(self.ended.set)
        call = next(request_iterator)
        assert call.HasField("follow")
        with self.lock:
            answers = self.answers[len(self.follows)]
            self.follows.append(convert.from_value_map(call.invoke.kwargs)["after_revision"])
        self.followed.set()
        while context.is_active():
            try:
                rev = answers.get(timeout=0.05)
            except queue.Empty:
                continue
            if rev is None:
                return
            value = {"revision": rev, "events": [{"revision": rev}]}
            yield pb.CallAnswer(id=call.id, more=True, response=pb.InvokeResponse(
                result=convert.to_value(value)))


class FollowReplica(Replica):
    def __init__(self) -> None:                  # as Replica, with a FollowFake
        self.fake = FollowFake()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        pb_grpc.add_GesmasServicer_to_server(self.fake, self.server)
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()


@pytest.fixture(autouse=True)
def own_rpcs(monkeypatch):
    """Followed calls on RPCs of their own (the default is the merged streams)."""
    monkeypatch.setenv("GESMAS_FOLLOW_STREAM", "own")


@pytest.fixture
def follow_replicas():
    started = [FollowReplica() for _ in range(2)]
    yield started
    for r in started:
        r.stop()


def until(cond, what: str) -> None:
    """Poll `cond` (state another thread changes without telling) until true, bounded."""
    deadline = time.monotonic() + WAIT
    while not cond():
        assert time.monotonic() < deadline, f"not {what} within {WAIT} s"
        time.sleep(0.01)


def reader_threads(address: str) -> list[str]:
    """The shared Calls stream's reader threads for `address` (streams.CallStream)."""
    return [t.name for t in threading.enumerate() if t.name == f"gesmas-calls-{address}"]


def test_the_callers_thread_reads_the_answers_in_order(follow_replicas):
    """Every answer comes to the iterating thread in order, and no stream reader thread is
    started for it; closing the iterator ends the RPC on the replica."""
    a = follow_replicas[0]
    with Client(cluster(follow_replicas), route="replica") as c:
        for rev in (6, 7, 9):
            a.fake.answers[0].put(rev)
        it = c.map("cfg").watch_stream("k/", 5)
        assert [next(it)["revision"] for _ in range(3)] == [6, 7, 9]
        assert reader_threads(a.address) == []
        assert a.fake.follows == [5]
        it.close()
        assert a.fake.ended.wait(WAIT)


def test_the_shared_stream_is_kept_when_asked(follow_replicas, monkeypatch):
    """GESMAS_FOLLOW_STREAM=shared: the same answers, through the shared stream's reader."""
    monkeypatch.setenv("GESMAS_FOLLOW_STREAM", "shared")
    a = follow_replicas[0]
    with Client(cluster(follow_replicas), route="replica") as c:
        a.fake.answers[0].put(6)
        it = c.map("cfg").watch_stream("k/", 5)
        assert next(it)["revision"] == 6
        assert len(reader_threads(a.address)) == 1
        it.close()


def test_past_the_slots_of_a_replica_follows_go_on_the_shared_stream(follow_replicas,
                                                                     monkeypatch):
    """A process gives RPCs of their own to a bounded number of follows per replica (its
    connection takes 1,000 streams at once): past it a follow goes on the shared stream,
    and a follow that ends gives its slot back."""
    monkeypatch.setattr(own_follow.SLOTS, "limit", 1)
    a = follow_replicas[0]
    with Client(cluster(follow_replicas), route="replica") as c:
        a.fake.answers[0].put(6)
        a.fake.answers[1].put(6)
        first = c.map("cfg").watch_stream("k/", 5)
        assert next(first)["revision"] == 6
        assert own_follow.SLOTS.taken(a.address) == 1 and reader_threads(a.address) == []
        second = c.map("cfg").watch_stream("k/", 5)
        assert next(second)["revision"] == 6
        assert own_follow.SLOTS.taken(a.address) == 1
        assert len(reader_threads(a.address)) == 1      # the shared stream's
        first.close()
        second.close()
        assert own_follow.SLOTS.taken(a.address) == 0


def test_a_bad_setting_is_named(monkeypatch):
    monkeypatch.setenv("GESMAS_FOLLOW_STREAM", "maybe")
    with pytest.raises(ValueError, match="GESMAS_FOLLOW_STREAM must be 'merged', 'own' or "
                       "'shared'"):
        own_follow.follow_stream_setting()


def test_an_answer_overdue_follows_again_elsewhere_from_the_last_cursor(follow_replicas,
                                                                       monkeypatch):
    """The first replica answers once, then nothing: past the deadline the RPC is cancelled,
    the replica is a suspect, and the watch goes on at the other replica from the first
    answer's revision."""
    monkeypatch.setattr(transport_module, "DEADLINE_MARGIN", 0.3)
    a, b = follow_replicas
    with Client(cluster(follow_replicas), route="replica") as c:
        a.fake.answers[0].put(6)
        b.fake.answers[0].put(8)
        # timeout 0.2 s: the client's deadline on each answer is that plus its margin (0.3)
        it = c.map("cfg").watch_stream("k/", 5, timeout=0.2)
        assert next(it)["revision"] == 6
        assert next(it)["revision"] == 8
        assert a.fake.ended.wait(WAIT)           # the late RPC was cancelled
        assert b.fake.follows == [6]
        it.close()


def test_a_stream_that_ends_is_followed_again_from_the_last_cursor(follow_replicas):
    """The replica ends the RPC (as one shutting down does): the watch is sent again, from
    the last answer's revision, and goes on."""
    a = follow_replicas[0]
    with Client(cluster(follow_replicas), route="replica") as c:
        a.fake.answers[0].put(6)
        a.fake.answers[0].put(None)              # the replica ends the RPC
        a.fake.answers[1].put(10)
        it = c.map("cfg").watch_stream("k/", 5)
        assert [next(it)["revision"] for _ in range(2)] == [6, 10]
        assert a.fake.follows == [5, 6]
        it.close()


def test_closing_the_client_ends_a_waiting_follow(follow_replicas):
    """A thread waiting in the iterator when the client closes: its RPC is cancelled and
    the iterator raises (the client is closed) instead of waiting on."""
    a = follow_replicas[0]
    c = Client(cluster(follow_replicas), route="replica")
    it = c.map("cfg").watch_stream("k/", 5)
    got: list[BaseException] = []

    def read() -> None:
        try:
            next(it)
        except BaseException as e:               # noqa: BLE001 - what it raises is checked
            got.append(e)
    t = threading.Thread(target=read)
    t.start()
    assert a.fake.followed.wait(WAIT)
    c.close()
    t.join(WAIT)
    assert not t.is_alive() and got, "the waiting follow did not end"
    assert a.fake.ended.wait(WAIT)


def test_an_unresponsive_replica_cancels_its_own_follows(follow_replicas):
    """The client's suspicion of a replica (a keep-alive or a call without an answer in
    time) cancels the follows on RPCs of their own there too: the watch goes on elsewhere."""
    a, b = follow_replicas
    with Client(cluster(follow_replicas), route="replica") as c:
        a.fake.answers[0].put(6)
        b.fake.answers[0].put(7)
        it = c.map("cfg").watch_stream("k/", 5)
        assert next(it)["revision"] == 6
        c._unresponsive(a.address)
        assert a.fake.ended.wait(WAIT)
        assert next(it)["revision"] == 7
        assert b.fake.follows == [6]
        it.close()


# -- the deadline keeper alone ------------------------------------------------------------

class Stub:
    """What Deadlines sees of an OwnFollowing."""

    def __init__(self) -> None:
        self.due = None
        self.queued = False
        self.timed_out = False
        self.finished = False
        self.cancelled = threading.Event()

    def cancel(self) -> None:
        self.cancelled.set()


def test_answers_in_time_keep_one_entry_and_cancel_nothing():
    d = Deadlines()
    try:
        f = Stub()
        for _ in range(1000):
            d.arm(f, 0.3)
            assert d.disarm(f) is False
        assert len(d._heap) == 1 and f.queued
        d.arm(f, 0.3)                            # waiting now: re-armed past the first due
        assert f.cancelled.wait(WAIT)
        assert d.disarm(f) is True and f.timed_out
    finally:
        d.close()


def test_a_following_re_armed_is_not_cancelled_at_its_old_time():
    d = Deadlines()
    try:
        early, late = Stub(), Stub()
        d.arm(early, 0.05)
        d.arm(late, 0.05)
        d.arm(late, 60)                          # answered and waiting again: a minute
        assert early.cancelled.wait(WAIT)
        until(lambda: [e[0] for e in d._heap] == [late.due], "late's entry moved on")
        assert not late.cancelled.is_set() and not late.timed_out
    finally:
        d.close()


def test_a_finished_following_is_dropped_unharmed():
    d = Deadlines()
    try:
        f = Stub()
        d.arm(f, 0.05)
        f.finished = True
        until(lambda: not d._heap and not f.queued, "the entry dropped")
        assert not f.cancelled.is_set() and not f.queued
    finally:
        d.close()

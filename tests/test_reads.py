"""Reads without a log entry (replication/reads.py, Node.read, README "Reads").

- the ReadIndex protocol against a scripted pysyncobj node: a round is confirmed only by
  acknowledgements of a probe sent after the read arrived, in the leader's term, from a
  majority; a newer term, a lost leadership or a timeout refuses the read; a follower asks
  its leader;
- reads of the applied state wait for their index and never run during an entry's apply;
- the client sends its consistency and the highest index it has seen;
- on a real 3-replica cluster: a read-only load adds nothing to the log, every answer
  carries the index it reflects, sequential reads never go back across replicas, a lagging
  replica refuses a sequential read it cannot serve, and a leader paused (SIGSTOP) while
  another was elected and acknowledged a write never answers a linearizable read with the
  old state when it resumes.
"""
from __future__ import annotations

import asyncio
import os
import random
import signal
import threading
import time
from typing import Any

import grpc
import pytest

from gesmas.client import Client
from gesmas.server.cluster import LocalCluster
from gesmas.server.replication import reads
from gesmas.v1 import gesmas_pb2 as pb
from gesmas.v1 import gesmas_pb2_grpc as pb_grpc

from test_client_unit import Replica, cluster as fake_cluster, unavailable

WAIT = 5.0


# --- the ReadIndex protocol against a scripted node ------------------------------------------


class Node:
    """What reads.ReadIndex reads of pysyncobj's SyncObj."""

    def __init__(self, others: list[str], leader: bool = True, term: int = 3,
                 commit: int = 10) -> None:
        self._SyncObj__otherNodes = set(others)
        self.leader = leader
        self.raftCurrentTerm = term
        self.raftCommitIndex = commit
        self.known_leader: str | None = "self" if leader else None

    def _isLeader(self) -> bool:
        return self.leader

    def _getLeader(self) -> str | None:
        return self.known_leader


class Transport:
    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def send(self, node: str, message: dict[str, Any]) -> None:
        self.sent.append((node, message))

    def take(self) -> list[tuple[str, dict[str, Any]]]:
        out, self.sent = self.sent, []
        return out


class Answers:
    def __init__(self) -> None:
        self.got: list[tuple[int | None, str | None]] = []

    def __call__(self, index: int | None, reason: str | None) -> None:
        self.got.append((index, reason))


def protocol(term_of_commit: int = 3) -> reads.ReadIndex:
    return reads.ReadIndex(lambda index: term_of_commit, timeout=2.0)


def test_a_majority_acknowledging_the_rounds_probe_confirms_the_leaders_commit_index():
    node, transport, ri, answer = Node(["a", "b"]), Transport(), protocol(), Answers()
    ri.request(answer)
    assert ri.tick(node, transport, 0.0)
    probes = transport.take()
    assert sorted(n for n, _ in probes) == ["a", "b"]
    assert all(m == {"type": reads.PROBE, "term": 3, "round": 1} for _, m in probes)
    node.raftCommitIndex = 12            # what commits after the round started is not needed
    assert answer.got == []
    ri.on_message(node, transport, "a", {"type": reads.ACK, "round": 1, "term": 3})
    assert answer.got == [(10, None)]    # itself and "a": two of three


def test_acknowledgements_of_an_earlier_probe_do_not_confirm_a_later_round():
    node, transport, ri = Node(["a", "b", "c", "d"]), Transport(), protocol()
    first, second = Answers(), Answers()
    ri.request(first)
    ri.tick(node, transport, 0.0)
    for n in ("a", "b"):
        ri.on_message(node, transport, n, {"type": reads.ACK, "round": 1, "term": 3})
    assert first.got == [(10, None)]     # 3 of 5
    ri.request(second)
    ri.tick(node, transport, 0.1)
    # late answers to round 1, and a round-2 ack from one replica only: no majority yet
    for n in ("c", "d"):
        ri.on_message(node, transport, n, {"type": reads.ACK, "round": 1, "term": 3})
    ri.on_message(node, transport, "a", {"type": reads.ACK, "round": 2, "term": 3})
    assert second.got == []
    ri.on_message(node, transport, "c", {"type": reads.ACK, "round": 2, "term": 3})
    assert second.got == [(10, None)]


def test_reads_waiting_together_share_one_round():
    node, transport, ri = Node(["a", "b"]), Transport(), protocol()
    waiting = [Answers() for _ in range(5)]
    for a in waiting:
        ri.request(a)
    ri.tick(node, transport, 0.0)
    assert len(transport.take()) == 2 and ri.rounds_started == 1
    ri.on_message(node, transport, "b", {"type": reads.ACK, "round": 1, "term": 3})
    assert [a.got for a in waiting] == [[(10, None)]] * 5


def test_an_ack_from_a_newer_term_or_a_lost_leadership_refuses_the_reads():
    node, transport, ri = Node(["a", "b"]), Transport(), protocol()
    first, second = Answers(), Answers()
    ri.request(first)
    ri.tick(node, transport, 0.0)
    ri.on_message(node, transport, "a", {"type": reads.ACK, "round": 1, "term": 4})
    assert first.got[0][0] is None and "term 4" in first.got[0][1]
    # an ack of the old term does not count for a round of the new one either
    ri.request(second)
    ri.tick(node, transport, 0.1)
    node.leader = False                   # stepped down before a majority answered
    ri.tick(node, transport, 0.2)
    assert second.got[0][0] is None and "no longer the leader" in second.got[0][1]
    ri.on_message(node, transport, "a", {"type": reads.ACK, "round": 2, "term": 3})
    assert len(second.got) == 1


def test_acks_of_an_earlier_term_do_not_count():
    node, transport, ri, answer = Node(["a", "b"]), Transport(), protocol(), Answers()
    ri.request(answer)
    ri.tick(node, transport, 0.0)
    ri.on_message(node, transport, "a", {"type": reads.ACK, "round": 1, "term": 2})
    assert answer.got == []


def test_a_round_without_a_majority_times_out():
    node, transport, ri, answer = Node(["a", "b"]), Transport(), protocol(), Answers()
    ri.request(answer)
    ri.tick(node, transport, 0.0)
    ri.tick(node, transport, 1.9)
    assert answer.got == []
    ri.tick(node, transport, 2.1)
    assert answer.got[0][0] is None and "within 2 s" in answer.got[0][1]
    assert ri.pending() == 0


def test_a_new_leader_waits_for_an_entry_of_its_term_before_noting_its_commit_index():
    term_of = {10: 2, 11: 3}
    ri = reads.ReadIndex(lambda index: term_of.get(index), timeout=2.0)
    node, transport, answer = Node(["a", "b"]), Transport(), Answers()
    ri.request(answer)
    ri.tick(node, transport, 0.0)
    assert transport.take() == [] and answer.got == []   # index 10 is of term 2
    node.raftCommitIndex = 11                             # its no-op committed
    ri.tick(node, transport, 0.1)
    assert len(transport.take()) == 2
    ri.on_message(node, transport, "a", {"type": reads.ACK, "round": 1, "term": 3})
    assert answer.got == [(11, None)]


def test_a_cluster_of_one_confirms_at_once():
    node, transport, ri, answer = Node([]), Transport(), protocol(), Answers()
    ri.request(answer)
    ri.tick(node, transport, 0.0)
    assert answer.got == [(10, None)]


def test_a_replica_answers_a_probe_with_its_term():
    node, transport, ri = Node(["leader"], leader=False, term=5), Transport(), protocol()
    ri.on_message(node, transport, "leader", {"type": reads.PROBE, "term": 5, "round": 7})
    assert transport.take() == [("leader", {"type": reads.ACK, "round": 7, "term": 5})]


def test_a_follower_asks_its_leader_and_takes_the_grant_only_from_it():
    follower, ft = Node(["L", "x"], leader=False), Transport()
    follower.known_leader = "L"
    ri, answer = protocol(), Answers()
    ri.request(answer)
    assert ri.tick(follower, ft, 0.0)
    [(to, ask)] = ft.take()
    assert to == "L" and ask["type"] == reads.ASK
    # the leader's side: the ask joins its next round; the grant goes back to the asker
    leader, lt, lri = Node(["F", "x"]), Transport(), protocol()
    lri.on_message(leader, lt, "F", ask)
    lri.tick(leader, lt, 0.0)
    lri.on_message(leader, lt, "x", {"type": reads.ACK, "round": 1, "term": 3})
    [(back, grant)] = [s for s in lt.take() if s[1]["type"] == reads.GRANT]
    assert back == "F" and grant == {"type": reads.GRANT, "id": ask["id"], "index": 10}
    ri.on_message(follower, ft, "x", grant)             # not from whom it asked
    assert answer.got == []
    ri.on_message(follower, ft, "L", grant)
    assert answer.got == [(10, None)]


def test_a_replica_that_is_not_the_leader_refuses_an_ask_and_one_without_a_leader_refuses():
    node, transport, ri = Node(["F"], leader=False), Transport(), protocol()
    ri.on_message(node, transport, "F", {"type": reads.ASK, "id": 4})
    [(_, grant)] = transport.take()
    assert grant["id"] == 4 and "not the leader" in grant["error"]
    answer = Answers()
    ri.request(answer)
    ri.tick(node, transport, 0.0)                        # knows no leader
    assert answer.got == [(None, "no leader is known")]


# --- reads of the applied state --------------------------------------------------------------


def test_a_read_waits_for_its_index_and_never_runs_during_an_apply():
    applied = [5]
    state = {"value": "at 5"}
    woken = []
    ar = reads.AppliedReads(lambda: applied[0], lambda: state, lambda: applied[0],
                            lambda: woken.append(1))
    results: list[tuple[Any, int, Any]] = []
    done = lambda v, i, e: results.append((v, i, e))            # noqa: E731
    ar.submit(5, lambda sm: sm["value"], done)                   # applied, lock free: at once
    assert results == [("at 5", 5, None)]
    ar.submit(7, lambda sm: sm["value"], done)                   # not applied yet: queued
    assert len(results) == 1 and woken and ar.waiting() == 1
    with ar.lock:                                                # an entry being applied
        ar.submit(5, lambda sm: sm["value"], done)               # waits, though applied
        assert len(results) == 1
        applied[0] = 7
        state["value"] = "at 7"
    ar.run_due()                                                 # the apply thread, after it
    assert sorted(r[0] for r in results[1:]) == ["at 7", "at 7"]
    assert all(i == 7 for _, i, _ in results[1:])
    dropped = ar.submit(9, lambda sm: sm["value"], done)
    dropped.cancelled = True
    applied[0] = 9
    ar.run_due()
    assert len(results) == 3 and ar.waiting() == 0


def test_an_error_of_the_read_function_is_its_answer():
    ar = reads.AppliedReads(lambda: 1, lambda: None, lambda: 1, lambda: None)
    results: list[Any] = []
    ar.submit(0, lambda sm: 1 // 0, lambda v, i, e: results.append(e))
    assert isinstance(results[0], ZeroDivisionError)


# --- the client: consistency and the highest index seen --------------------------------------


@pytest.fixture
def replicas():
    started = [Replica() for _ in range(2)]
    yield started
    for r in started:
        r.stop()


def test_sequential_reads_carry_the_highest_index_seen_to_another_replica(replicas):
    a, b = replicas
    a.fake.handlers["OpenSession"] = lambda req, ctx: pb.OpenSessionResponse(
        session=7, ttl=req.ttl, applied_index=40)
    a.fake.handlers["Invoke"] = lambda req, ctx: pb.InvokeResponse(
        result=pb.Value(int_value=1), applied_index=57)
    a.fake.handlers["ListObjects"] = unavailable()
    with Client(fake_cluster(replicas), route="replica", consistency="sequential",
                call_stream=False) as c:
        c.invoke("Counter", "n", "add", 1)
        assert c.applied_index == 57
        c.list_objects()                               # a refuses: b answers
        [req] = b.fake.seen("ListObjects")
        assert req.read.consistency == pb.CONSISTENCY_SEQUENTIAL and req.read.min_index == 57
        c.list_classes(consistency="linearizable")     # per call (b is preferred now)
        [req] = b.fake.seen("ListClasses")
        assert req.read.consistency == pb.CONSISTENCY_LINEARIZABLE
        with pytest.raises(ValueError, match="consistency must be"):
            c.status(consistency="eventual")
    with pytest.raises(ValueError, match="consistency must be"):
        Client(fake_cluster(replicas), consistency="stale", connect=False)


def test_the_asyncio_client_tracks_the_index_and_sends_its_consistency(replicas):
    from gesmas.aio import Client as AioClient
    a, b = replicas
    a.fake.handlers["Status"] = lambda req, ctx: pb.StatusResponse(node_id="a", applied_index=9)

    async def main() -> None:
        async with AioClient(a.address, consistency="sequential", call_stream=False) as c:
            assert (await c.status())["applied_index"] == 9
            await c.list_objects()
            await c.list_classes(consistency="linearizable")
    asyncio.run(main())
    [req] = a.fake.seen("ListObjects")
    assert req.read.consistency == pb.CONSISTENCY_SEQUENTIAL and req.read.min_index == 9
    [req] = a.fake.seen("ListClasses")
    assert req.read.consistency == pb.CONSISTENCY_LINEARIZABLE and req.read.min_index == 9


# --- a real cluster --------------------------------------------------------------------------


def _read_request(kind: str, consistency: int, min_index: int = 0) -> Any:
    opts = pb.ReadOptions(consistency=consistency, min_index=min_index)
    return {"ListObjects": pb.ListObjectsRequest, "ListClasses": pb.ListClassesRequest,
            "Status": pb.StatusRequest}[kind](read=opts) if kind != "GetClass" else \
        pb.GetClassRequest(name="Counter", read=opts)


def _leader_commit(cluster: LocalCluster) -> int:
    st = cluster.member_status(cluster.find_leader())
    assert st is not None
    return st["commit_index"]


def _retrying(call: Any, attempts: int = 20) -> Any:
    """A raw stub's call, tried again on UNAVAILABLE as the client library does (a read is
    refused while the replicas change leader, which a loaded machine can make happen)."""
    for attempt in range(attempts):
        try:
            return call()
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.UNAVAILABLE or attempt == attempts - 1:
                raise
            time.sleep(0.1 * (attempt + 1))       # back-off before the retry


def test_a_read_only_load_adds_nothing_to_the_log(cluster):
    """400 reads of every kind and both consistencies through every replica: the leader's
    commit index (the last entry of the log) does not move; through the log each read was
    one entry."""
    before = _leader_commit(cluster)
    for m in cluster.members:
        with cluster.channel(m.client_addr) as channel:
            stub = pb_grpc.GesmasStub(channel)
            meta = cluster.metadata(channel)
            for i in range(34):
                for kind in ("ListObjects", "ListClasses", "GetClass", "Status"):
                    _retrying(lambda: getattr(stub, kind)(_read_request(kind, i % 2),
                                                          timeout=WAIT, metadata=meta))
    after = _leader_commit(cluster)
    # through the log each of the 136 reads was an entry; a duty (a tick) or a new leader's
    # no-op may fall in between
    assert after - before <= 3, (before, after)


def test_every_answer_carries_the_index_it_reflects(cluster):
    with Client(cluster.addresses, **cluster.client_options()) as c:
        c.counter("reads-index").add(1)
        wrote = c.applied_index
        assert wrote > 0
        for m in cluster.members:
            with cluster.channel(m.client_addr) as channel:
                stub = pb_grpc.GesmasStub(channel)
                r = stub.ListObjects(_read_request("ListObjects", 1, wrote), timeout=WAIT,
                                     metadata=cluster.metadata(channel))
                assert r.applied_index >= wrote
                assert "reads-index" in {o.name for o in r.objects}
        assert c.status()["applied_index"] >= wrote


def test_sequential_reads_never_go_back_across_replicas(cluster):
    """A writer makes objects one by one through the leader while a reader asks each replica
    in turn, sending the highest index it has seen: the index and the set of objects it is
    answered never shrink."""
    stop = threading.Event()
    made: list[str] = []

    def write() -> None:
        with Client(cluster.addresses, **cluster.client_options()) as w:
            for i in range(60):
                if stop.is_set():
                    return
                w.object("Counter", f"seq-{i}")
                made.append(f"seq-{i}")

    writer = threading.Thread(target=write)
    writer.start()
    seen, names_seen, answers = 0, set(), 0
    channels = [cluster.channel(m.client_addr) for m in cluster.members]
    try:
        stubs = [(pb_grpc.GesmasStub(ch), cluster.metadata(ch)) for ch in channels]
        deadline = time.monotonic() + 60
        while (writer.is_alive() or answers < 30) and time.monotonic() < deadline:
            stub, meta = stubs[answers % len(stubs)]
            try:
                r = stub.ListObjects(_read_request("ListObjects", 1, seen), timeout=WAIT,
                                     metadata=meta)
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.UNAVAILABLE, e
                continue
            names = {o.name for o in r.objects if o.name.startswith("seq-")}
            assert r.applied_index >= seen
            assert names >= names_seen, sorted(names_seen - names)
            seen, names_seen = r.applied_index, names
            answers += 1
    finally:
        stop.set()
        writer.join(timeout=60)
        for ch in channels:
            ch.close()
    assert answers >= 30 and len(made) == 60


def _sequential_schedule(cluster: LocalCluster, seed: int, steps: int) -> list[str]:
    """One session with sequential reads runs a random schedule (seeded): adds of its own,
    `Counter.get` at a replica drawn at random, and kill -9 + restart of a member drawn at
    random (the leader among them), while another session adds beside it. After each step:
    no read below the session's own last write (its write undone) or below its previous read
    (time going back), and the index the client carries never falls. Returns the schedule
    as run, for the failure message."""
    rng = random.Random(seed)
    addresses = [m.client_addr for m in cluster.members]
    done: list[str] = []
    stop = threading.Event()
    other_adds = [0]

    def other() -> None:
        with Client(cluster.addresses, **cluster.client_options()) as w:
            counter = w.counter("seq-prop")
            for _ in range(2000):
                if stop.is_set():
                    return
                counter.add(1)
                other_adds[0] += 1

    with Client(cluster.addresses, route="replica", consistency="sequential",
                **cluster.client_options()) as c:
        counter = c.counter("seq-prop")
        beside = threading.Thread(target=other)
        beside.start()
        try:
            own_last, last_read, last_index = 0, 0, c.applied_index
            for _ in range(steps):
                kind = rng.choices(("add", "read", "restart"), (4, 5, 1))[0]
                if kind == "add":
                    own_last = counter.add(1)
                    done.append(f"add -> {own_last}")
                elif kind == "read":
                    at = rng.randrange(len(addresses))
                    with c._routing.lock:
                        c._routing.preferred = at
                    value = counter.get()
                    done.append(f"get at {addresses[at]} -> {value} (index {c.applied_index})")
                    assert value >= own_last, f"own write undone: {done}"
                    assert value >= last_read, f"went back: {done}"
                    last_read = value
                else:
                    m = rng.choice(cluster.members)
                    cluster.restart_member(m)
                    done.append(f"kill -9 and restart {m.client_addr}")
                assert c.applied_index >= last_index, f"index went back: {done}"
                last_index = c.applied_index
        finally:
            stop.set()
            beside.join(timeout=120)
    assert other_adds[0] > 0
    return done


@pytest.mark.parametrize("seed", [1, 2])
def test_sequential_reads_never_undo_a_write_nor_go_back_under_random_schedules(cluster, seed):
    """Issue 24's property for sequential reads, over random schedules of reads at every
    replica, writes and kill -9 restarts (the leader too)."""
    done = _sequential_schedule(cluster, seed, steps=60)
    assert any(step.startswith("kill") for step in done), done
    assert sum(step.startswith("get") for step in done) >= 10, done


def test_a_replica_that_cannot_reach_the_index_refuses_a_sequential_read(cluster):
    m = cluster.members[0]
    # caught up once first (a test before this one restarts members): until then a replica
    # refuses every read as NotCaughtUp, whatever index it asks for (failed a full run)
    cluster.wait_caught_up(m, timeout=60)
    with cluster.channel(m.client_addr) as channel:
        stub = pb_grpc.GesmasStub(channel)
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as e:
            stub.ListObjects(_read_request("ListObjects", 1, 10 ** 9), timeout=WAIT,
                             metadata=cluster.metadata(channel))
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "needs 1000000000" in e.value.details()
        assert time.monotonic() - started < WAIT
        with pytest.raises(grpc.RpcError) as e:
            stub.ListObjects(_read_request("ListObjects", 1, -1), timeout=WAIT,
                             metadata=cluster.metadata(channel))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "read.min_index must be >= 0" in e.value.details()


def _names(response: Any) -> set[str]:
    return {o.name for o in response.objects}


def _paused_leader_round(c: LocalCluster, old: Any, rest: list[Any], stub: Any, meta: Any,
                         name: str) -> tuple[list[Any], int, bool]:
    """SIGSTOP the leader `old`; as soon as another replica leads, create `name` through it;
    queue a linearizable ListObjects and Status at `old` while it is stopped; SIGCONT it.
    Returns (the queued calls, the write's index or 0, whether `old` was resumed within
    1.4 s with the write acknowledged: short enough that pysyncobj's own step-down (no
    answer from a majority for 1.5 s) has not deposed it, so only the read's quorum round
    stands between it and an answer from its old state)."""
    os.kill(old.proc.pid, signal.SIGSTOP)
    paused = time.monotonic()
    wrote = 0
    try:
        channels = {m.client_addr: c.channel(m.client_addr) for m in rest}
        try:
            deadline = paused + 15
            while not wrote and time.monotonic() < deadline:
                for m in rest:
                    ch = channels[m.client_addr]
                    try:
                        st = pb_grpc.GesmasStub(ch).Status(
                            _read_request("Status", 1), timeout=0.3, metadata=c.metadata(ch))
                        if not st.is_leader:
                            continue
                        r = pb_grpc.GesmasStub(ch).CreateObject(pb.CreateObjectRequest(
                            class_name="Counter", object_name=name), timeout=1.0,
                            metadata=c.metadata(ch))
                        wrote = r.applied_index
                        break
                    except grpc.RpcError:
                        continue
        finally:
            for ch in channels.values():
                ch.close()
        sharp = bool(wrote) and time.monotonic() - paused < 1.4
        queued = [stub.ListObjects.future(_read_request("ListObjects", 0), timeout=10,
                                          metadata=meta),
                  stub.Status.future(_read_request("Status", 0), timeout=10, metadata=meta)]
    finally:
        os.kill(old.proc.pid, signal.SIGCONT)
    return queued, wrote, sharp


def test_a_resumed_old_leader_never_answers_a_linearizable_read_with_the_old_state():
    """SIGSTOP the leader; the others elect a new one, which acknowledges a write; a
    linearizable read sent to the old leader while it is stopped either fails (UNAVAILABLE,
    or no answer in time: the client goes elsewhere) or sees the write, and so do reads
    right after SIGCONT; once the old leader follows the new one, they see it. Five rounds,
    each trying to resume the old leader before pysyncobj itself would depose it."""
    c = LocalCluster(nodes=3, fsync=True)
    try:
        c.start(timeout=90)
        sharp_rounds = 0
        for k in range(5):
            old = c.find_leader()
            rest = [m for m in c.members if m is not old]
            channel = c.channel(old.client_addr)
            stub = pb_grpc.GesmasStub(channel)
            meta = c.metadata(channel)
            stub.ListObjects(_read_request("ListObjects", 0), timeout=WAIT, metadata=meta)
            queued, wrote, sharp = _paused_leader_round(c, old, rest, stub, meta, f"after-{k}")
            assert wrote, "no new leader acknowledged the write"
            sharp_rounds += sharp
            lists, status = [_outcome(fut) for fut in queued]
            assert lists is None or f"after-{k}" in _names(lists), sorted(_names(lists))
            assert status is None or status.applied_index >= wrote
            served = 0
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and served < 3:
                try:
                    r = stub.ListObjects(_read_request("ListObjects", 0), timeout=WAIT,
                                         metadata=meta)
                except grpc.RpcError as e:
                    assert e.code() == grpc.StatusCode.UNAVAILABLE, e
                    continue
                assert f"after-{k}" in _names(r), sorted(_names(r))
                assert r.applied_index >= wrote
                served += 1
            assert served == 3, "the old leader never served a linearizable read again"
            channel.close()
        print(f"\nrounds that resumed the old leader before its own step-down: {sharp_rounds}/5")
    finally:
        c.stop()


def _outcome(fut: Any) -> Any:
    try:
        return fut.result()
    except grpc.RpcError as e:
        assert e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED), e
        return None


# -- declared readers of objects (kernel/readers.py) through the public client ---------------

WATCHED = '''
class Watched:
    _readers = ("value", "until", "scribble")

    def __init__(self):
        self.n = 0
        self.log = []

    def value(self):
        return self.n

    def until(self, at):
        if self.n < at:
            raise NotYet()
        return self.n

    def scribble(self):
        self.log.append(1)
        return len(self.log)

    def bump(self):
        self.n += 1
        return self.n
'''


def test_declared_readers_are_served_without_an_entry_and_can_wait(cluster):
    """Counter.get and an uploaded class's readers through the client: no log entry, the
    value of every write acknowledged before; a reader that raises NotYet waits for a later
    write on its object (or times out); one that writes is refused and changes nothing."""
    with Client(cluster.addresses, **cluster.client_options()) as c, \
            Client(cluster.addresses, consistency="sequential",
                   **cluster.client_options()) as seq:
        counter = c.counter("readers-counter")
        counter.add(5)
        c.register_class(WATCHED)
        w = c.object("Watched", "readers-watched")
        w.bump()
        before = _leader_commit(cluster)
        for _ in range(20):
            assert counter.get() == 5 and w.value() == 1
            assert seq.counter("readers-counter").get() == 5
        assert _leader_commit(cluster) - before <= 1
        got: list[Any] = []       # it needs three later writes: it waits for some of them
        waiter = threading.Thread(target=lambda: got.append(
            seq.object("Watched", "readers-watched").until(4, timeout=30)))
        waiter.start()
        for _ in range(3):
            w.bump()
        waiter.join(30)
        assert got == [4]
        with pytest.raises(Exception) as timed_out:
            w.until(10, timeout=0.5)
        assert "Timeout" in type(timed_out.value).__name__ or "timed out" in str(timed_out.value)
        with pytest.raises(Exception) as refused:
            w.scribble()
        assert "ReadOnlyViolation" in str(refused.value) or "reader" in str(refused.value)
        assert w.value() == 4
        e = c.election("readers-election")
        e.leader()                                  # made (get-or-create, one entry)
        before = _leader_commit(cluster)
        watched: list[Any] = []
        watcher = threading.Thread(target=lambda: watched.append(
            seq.election("readers-election").observe(0, timeout=30)))   # 0: no term yet
        watcher.start()
        term = e.campaign("me")                     # the change it waits for: one write
        watcher.join(30)
        assert watched and watched[0]["term"] == int(term) and watched[0]["value"] == "me"
        assert _leader_commit(cluster) - before <= 3   # the campaign (and a tick, a no-op)


# --- waiting readers: woken by entries that change their object ------------------------------


def test_a_reader_waiting_for_a_topic_wakes_for_matching_changes_only():
    """NotYet(topic): a Map's watches of "a/" and of "a/1" sleep through an entry that
    changed "b/1" (one waiting for any change of the object wakes), wake for "a/1x" as
    their prefixes say, and all wake for an entry that named nothing or a replaced state."""
    from gesmas.server.node_reads import ObjectChanges
    changes = ObjectChanges()
    applied = [10]

    async def main() -> None:
        loop = asyncio.get_running_loop()

        def waiters(*topics: str | None) -> list[asyncio.Future[int | None]]:
            return [asyncio.ensure_future(changes.wait("m", applied[0], lambda: applied[0],
                                                       30, t)) for t in topics]

        async def entry(index: int, topics: dict) -> None:
            applied[0] = index
            await loop.run_in_executor(None, changes.applied, index, {"m"}, topics)
            await asyncio.sleep(0.01)

        prefix, key, other, anything = waiters("a/", "a/1", "b/2", None)
        await asyncio.sleep(0)
        assert changes.waiting() == 4
        await entry(11, {"m": ["b/1"]})
        assert anything.done() and await anything == 11
        assert not prefix.done() and not key.done() and not other.done()
        await entry(12, {"m": ["a/1x", "c"]})
        assert await prefix == 12 and await key == 12 and not other.done()
        await entry(13, {"m": None})                 # too many to list: everyone
        assert await other == 13
        many = waiters(*[f"t{i}" for i in range(50)])   # more waited-for topics than the
        await asyncio.sleep(0)                           # changed key is long
        await entry(14, {"m": ["t7"]})
        assert [f.done() for f in many].count(True) == 1 and many[7].done()
        await entry(15, {})                          # named nothing: everyone
        assert all(f.done() for f in many)
        assert changes.waiting() == 0
    asyncio.run(main())


def test_topic_matching_by_prefixes_by_topics_and_past_its_work_bound():
    from gesmas.server.node_reads import MATCH_WORK, SHORT_TOPIC, _matching
    waited = {t: [] for t in ("", "a", "a/", "a/b", "b", "x" * 300)}
    assert _matching(waited, ["a/b/c"]) == {"a", "a/", "a/b"}          # by prefixes
    assert _matching(waited, ["x" * 301]) == {"x" * 300}              # long: by topics
    assert _matching(waited, ["zzz", "b"]) == {"b"}
    assert len("a/b/c") < len(waited) and 301 > SHORT_TOPIC
    many = ["k"] * (MATCH_WORK // len(waited) + 1)                    # too much work:
    assert set(_matching(waited, many)) == set(waited)                # all of them


def test_a_waiting_reader_wakes_for_entries_on_its_object_only():
    from gesmas.server.node_reads import ObjectChanges
    changes = ObjectChanges()
    applied = [10]

    async def main() -> None:
        loop = asyncio.get_running_loop()
        waiter = asyncio.ensure_future(changes.wait("a", 10, lambda: applied[0], 30))
        await asyncio.sleep(0)                       # it registers
        assert changes.waiting() == 1
        for index, touched in ((11, {"b"}), (12, set()), (13, {"b", "c"})):
            await loop.run_in_executor(None, changes.applied, index, touched)
            await asyncio.sleep(0.01)
            assert not waiter.done(), index           # other objects: it sleeps on
        await loop.run_in_executor(None, changes.applied, 14, {"b", "a"})
        assert await asyncio.wait_for(waiter, 5) == 14
        assert changes.waiting() == 0
        # an entry applied between the reader's run (index 14) and its wait: run again at once
        applied[0] = 15
        assert await changes.wait("a", 14, lambda: applied[0], 30) == 15
        # a replaced state wakes everyone; a timeout answers None
        waiter = asyncio.ensure_future(changes.wait("x", 15, lambda: applied[0], 30))
        await asyncio.sleep(0)
        await loop.run_in_executor(None, changes.everything, 20)
        assert await asyncio.wait_for(waiter, 5) == 20
        assert await changes.wait("y", 15, lambda: applied[0], 0.05) is None
        assert changes.waiting() == 0
    asyncio.run(main())

"""Pre-vote (replication/prevote.py, override 14): a replica that stops hearing from a healthy
leader does not depose it. The leader's messages to one follower are dropped for three
election timeouts (the follower still reaches everyone): with pre-vote the term and the leader
stay and writes go on; without it (the control) the follower's higher term deposes the
leader. Also the grant rule on its own, against a scripted node."""
from __future__ import annotations

import hashlib
import time

import pytest
from pysyncobj.syncobj import _RAFT_STATE

from gesmas.server.replication import prevote
from gesmas.server.replication.prevote import PRE_VOTE, PRE_VOTE_RESPONSE, PreVote

from test_raft_port import COMMIT_TIMEOUT, InProcessCluster, warmed

CUT = 3 * 1.2            # three of the longest election timeouts (RaftTuning.raft_max_timeout)


def term(replica) -> int:
    return replica._raft._SyncObj__raftCurrentTerm


def until(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def cut_leader_to_follower(c: InProcessCluster):
    """Drop every message the leader sends to one follower; returns (leader, follower,
    other, undo)."""
    leader = c.leader()
    follower, other = [r for r in c.replicas if r is not leader]
    transport = leader._raft._SyncObj__transport
    send = transport.send

    def dropping(node, message):
        if node.id != follower.self_addr:
            send(node, message)
    transport.send = dropping
    return leader, follower, other, lambda: setattr(transport, "send", send)


@pytest.fixture
def cluster(tmp_path):
    yield from warmed(InProcessCluster(str(tmp_path)))


def test_a_follower_that_stops_hearing_the_leader_does_not_depose_it(cluster):
    leader, follower, other, undo = cut_leader_to_follower(cluster)
    before = term(leader)
    ends = time.monotonic() + CUT
    try:
        writes = 0
        while time.monotonic() < ends:      # writes go on through the leader and the other
            cluster.commit(b"during the cut %d" % writes,
                           among=[cluster.replicas.index(leader), cluster.replicas.index(other)])
            writes += 1
        until(lambda: follower._raft._gesmas_prevote.rounds >= 2, COMMIT_TIMEOUT,
              "the cut-off follower to ask for pre-votes")
    finally:
        undo()
    # through the leader: the follower's connection to it timed out for want of messages
    # (pysyncobj's connection_timeout) and a command it forwards before reconnecting is lost
    both = [cluster.replicas.index(leader), cluster.replicas.index(other)]
    cluster.commit(b"after the cut", among=both)
    cluster.wait_applied([hashlib.sha256(b"after the cut").hexdigest()])  # the follower too
    assert leader.is_leader() and [term(r) for r in cluster.replicas] == [before] * 3
    assert follower._raft._gesmas_prevote.held >= 1 and writes > 0


def test_without_pre_vote_the_same_cut_deposes_the_leader(cluster, monkeypatch):
    """The control: what pysyncobj alone does (why override 14 exists)."""
    monkeypatch.setattr(PreVote, "gate", lambda self, raft, now: None)
    leader, follower, other, undo = cut_leader_to_follower(cluster)
    before = term(leader)
    try:
        until(lambda: term(follower) > before, COMMIT_TIMEOUT, "the follower to stand")
        until(lambda: term(leader) > before, COMMIT_TIMEOUT, "the leader to see the term")
    finally:
        undo()
    cluster.commit(b"after the election", among=[cluster.replicas.index(r) for r in
                                                 cluster.replicas if r is not follower])
    assert max(term(r) for r in cluster.replicas) > before


# --- the grant rule against a scripted node ---------------------------------------------------


class Raft:
    """What PreVote reads and writes of pysyncobj's SyncObj."""

    def __init__(self, state=_RAFT_STATE.FOLLOWER, term=5, leader=None, deadline=0.0,
                 log=(5, 100), others=("b", "c")) -> None:
        self._SyncObj__raftState = state
        self._SyncObj__raftCurrentTerm = term
        self._SyncObj__raftLeader = leader
        self._SyncObj__raftElectionDeadline = deadline
        self._SyncObj__selfNode = Node("a")
        self._SyncObj__otherNodes = {Node(o) for o in others}
        self._SyncObj__transferInProgress = False
        self._SyncObj__transport = Transport()
        self._log = log

    def _SyncObj__getCurrentLogTerm(self):
        return self._log[0]

    def _SyncObj__getCurrentLogIndex(self):
        return self._log[1]

    def _SyncObj__connectedToAnyone(self):
        return True

    def _SyncObj__generateRaftTimeout(self):
        return 1.0


class Node:
    def __init__(self, id: str) -> None:
        self.id = id

    def __hash__(self) -> int:
        return hash(self.id)

    def __eq__(self, other) -> bool:
        return isinstance(other, Node) and other.id == self.id


class Transport:
    def __init__(self) -> None:
        self.sent: list = []

    def send(self, node, message) -> None:
        self.sent.append((node.id, message))


def ask(raft: Raft, **fields) -> bool:
    message = {"type": PRE_VOTE, "pre_term": 6, "last_log_index": 100, "last_log_term": 5}
    message.update(fields)
    PreVote().on_message(raft, raft._SyncObj__transport, Node("z"), message)
    [(to, answer)] = raft._SyncObj__transport.sent
    assert to == "z" and answer["type"] == PRE_VOTE_RESPONSE and answer["pre_term"] == \
        message["pre_term"]
    return answer["granted"]


def test_a_pre_vote_is_granted_only_when_the_real_vote_would_be_and_no_leader_is_heard():
    assert ask(Raft()) is True                                    # no leader, same log
    assert ask(Raft(leader=Node("b"), deadline=time.monotonic() + 60)) is False  # hears one
    assert ask(Raft(leader=Node("b"), deadline=0.0)) is True      # its leader went quiet
    assert ask(Raft(state=_RAFT_STATE.LEADER)) is False
    assert ask(Raft(term=6)) is False                             # not above its term
    assert ask(Raft(log=(5, 101))) is False                       # its log is longer
    assert ask(Raft(log=(6, 1))) is False                         # ... or newer
    assert ask(Raft(), last_log_term=6, last_log_index=1) is True
    for bad in ({"pre_term": "7"}, {"pre_term": None}, {"last_log_index": 1.5},
                {"last_log_term": [5]}):
        assert ask(Raft(), **bad) is False                        # malformed: refused
    raft = Raft()
    PreVote().on_message(raft, raft._SyncObj__transport, Node("z"), {"type": PRE_VOTE})
    assert raft._SyncObj__transport.sent[0][1]["granted"] is False
    assert raft._SyncObj__raftCurrentTerm == 5                  # nothing changes on a voter


def test_the_candidate_stands_only_after_a_majority_granted_its_round():
    raft, pv = Raft(), PreVote()
    now = time.monotonic()
    raft._SyncObj__raftLeader = Node("b")              # its leader, gone quiet
    pv.gate(raft, now)                                 # deadline passed: a round, no election
    assert raft._SyncObj__raftCurrentTerm == 5 and pv.rounds == 1
    assert raft._SyncObj__raftLeader is None           # forgotten: it grants others' rounds
    assert raft._SyncObj__raftElectionDeadline == now + 1.0
    assert sorted(to for to, m in raft._SyncObj__transport.sent) == ["b", "c"]
    assert all(m == {"type": PRE_VOTE, "pre_term": 6, "last_log_index": 100,
                     "last_log_term": 5} for _, m in raft._SyncObj__transport.sent)
    t = raft._SyncObj__transport
    pv.on_message(raft, t, Node("b"), {"type": PRE_VOTE_RESPONSE, "pre_term": 5,
                                       "granted": True})          # an older round: ignored
    pv.on_message(raft, t, Node("b"), {"type": PRE_VOTE_RESPONSE, "pre_term": 6,
                                       "granted": False})
    assert pv.won is None
    pv.on_message(raft, t, Node("c"), {"type": PRE_VOTE_RESPONSE, "pre_term": 6,
                                       "granted": True})
    assert pv.won == 6 and raft._SyncObj__raftElectionDeadline == 0
    pv.gate(raft, time.monotonic())                   # pysyncobj's election goes ahead
    assert raft._SyncObj__raftElectionDeadline == 0 and pv.won is None and pv.rounds == 1
    single = Raft(others=())
    PreVote().gate(single, time.monotonic())           # a cluster of one needs no one else
    assert single._SyncObj__raftElectionDeadline == 0
    leader = Raft(state=_RAFT_STATE.LEADER)
    PreVote().gate(leader, time.monotonic())
    assert leader._SyncObj__transport.sent == []
    transfer = Raft()
    transfer._SyncObj__transferInProgress = True       # timeout_now: elect at once
    PreVote().gate(transfer, time.monotonic())
    assert transfer._SyncObj__transport.sent == [] and transfer._SyncObj__raftElectionDeadline == 0
    assert prevote.MESSAGE_TYPES == {PRE_VOTE, PRE_VOTE_RESPONSE}
    # two followers of a paused leader, each in its own round, grant each other's
    quiet = Raft(leader=Node("b"), deadline=0.0)
    PreVote().gate(quiet, time.monotonic())
    quiet._SyncObj__transport.sent.clear()
    assert quiet._SyncObj__raftElectionDeadline > time.monotonic() and ask(quiet) is True

"""Raft never waits for the kernel (replication/replica.py, override 15): committed entries
are applied on a thread of their own, so an entry that takes longer than the election
timeout to apply holds up the entries behind it on every replica, and nothing else: the
leader keeps its term, and new entries keep being committed meanwhile."""
from __future__ import annotations

import hashlib
import threading
import time

import pytest

from gesmas.server.replication import Replica

from test_raft_port import DigestSM, InProcessCluster, warmed
from replication_node import TEST_SECRET

SLOW = 3 * 1.2           # three of the longest election timeouts (RaftTuning.raft_max_timeout)


class SlowSM(DigestSM):
    """Applies b"slow..." in SLOW seconds (the whole time on the apply thread)."""

    threads: set[str] = set()

    def apply(self, index, data):
        SlowSM.threads.add(threading.current_thread().name)
        if data.startswith(b"slow"):
            time.sleep(SLOW)
        return super().apply(index, data)


class SlowCluster(InProcessCluster):
    def _start(self, i):
        return Replica(self.addrs[i], self.addrs, f"{self.root}/n{i}", fresh=SlowSM,
                       restore=SlowSM, on_completions=self._collector(i),
                       on_role_change=self._role_changed, password=TEST_SECRET, fsync=False,
                       tuning=self.tuning)


@pytest.fixture
def cluster(tmp_path):
    yield from warmed(SlowCluster(str(tmp_path)))


def test_a_slow_entry_holds_up_the_entries_behind_it_but_not_raft(cluster):
    leader = cluster.leader()
    term = leader._raft.raftCurrentTerm
    before = leader._raft.raftCommitIndex
    leader.propose(b"slow entry")
    started = time.monotonic()
    for i in range(5):                                    # proposed while it is applied
        leader.propose(b"behind %d" % i)
    deadline = started + SLOW
    while leader._raft.raftCommitIndex < before + 6 and time.monotonic() < deadline:
        time.sleep(0.05)
    committed_during = leader._raft.raftCommitIndex
    applied_during = leader.applied_index()
    assert committed_during >= before + 6                 # committed while it is applied...
    assert applied_during <= before                       # ...applied only after it
    cluster.wait_applied([hashlib.sha256(b"behind %d" % i).hexdigest() for i in range(5)])
    assert time.monotonic() - started >= SLOW
    assert leader.is_leader()
    assert [r._raft.raftCurrentTerm for r in cluster.replicas] == [term] * 3
    assert SlowSM.threads and all(t.startswith("gesmas-apply-") for t in SlowSM.threads)


# -- ApplyThread on its own (apply_thread.py): no Raft, no cluster ------------------------------

from gesmas.server.replication.apply_thread import ApplyThread      # noqa: E402
from gesmas.server.replication.types import ReplicaStopped          # noqa: E402


class Gate:
    """An apply callback that records the entries and can hold one until released."""

    def __init__(self, hold=None):
        self.applied, self.hold = [], hold
        self.entered, self.release = threading.Event(), threading.Event()

    def __call__(self, index, data):
        if index == self.hold:
            self.entered.set()
            assert self.release.wait(10)
        self.applied.append((index, data))


def test_entries_are_applied_in_order_and_jobs_go_ahead_of_them():
    gate = Gate(hold=1)
    t = ApplyThread("t", gate, lambda: None)
    try:
        for i in range(1, 4):
            t.put(i, b"e%d" % i)
        assert gate.entered.wait(10) and t.busy()
        assert t.last_done_if_behind() == 0
        ran = []
        caller = threading.Thread(target=lambda: ran.append(t.call(lambda: list(gate.applied))))
        caller.start()
        gate.release.set()
        caller.join(10)
        assert ran == [[(1, b"e1")]]          # after the entry being applied, before 2 and 3
        assert t.wait_idle(10)
        assert gate.applied == [(1, b"e1"), (2, b"e2"), (3, b"e3")]
        assert not t.busy() and t.last_done_if_behind() is None
        assert t.call(lambda: t.on_thread()) is True
    finally:
        t.stop(5)


def test_supersede_drops_queued_entries_but_keeps_jobs_and_counts():
    gate = Gate(hold=1)
    t = ApplyThread("t", gate, lambda: None)
    try:
        t.put(1, b"old1")
        assert gate.entered.wait(10)
        t.put(2, b"old2")
        t.put(3, b"old3")
        ran = []
        caller = threading.Thread(target=lambda: ran.append(t.call(lambda: "job")))
        caller.start()
        while not t._q or t._q[0][1] != -1:          # the job is queued ahead of 2 and 3
            time.sleep(0.001)
        t.supersede()                                # a snapshot replaced the state
        t.put(4, b"new4")
        gate.release.set()
        caller.join(10)
        assert ran == ["job"]                        # an earlier version lost it
        assert t.wait_idle(10)
        assert gate.applied == [(1, b"old1"), (4, b"new4")]
        assert t.inflight == 0 and not t.busy()
    finally:
        t.stop(5)


def test_stop_releases_a_caller_and_refuses_new_jobs():
    gate = Gate(hold=1)
    t = ApplyThread("t", gate, lambda: None)
    t.put(1, b"x")
    assert gate.entered.wait(10)
    errors = []

    def call():
        try:
            t.call(lambda: None)
        except ReplicaStopped as e:
            errors.append(e)
    caller = threading.Thread(target=call)
    caller.start()
    stopper = threading.Thread(target=t.stop, args=(5,))
    stopper.start()
    caller.join(10)
    gate.release.set()
    stopper.join(10)
    assert len(errors) == 1 and not caller.is_alive()
    with pytest.raises(ReplicaStopped):
        t.call(lambda: None)


def test_idle_runs_once_the_queue_is_empty():
    idle = threading.Event()
    seen = []
    t = ApplyThread("t", lambda i, d: seen.append(i), idle.set)
    try:
        t.put(1, b"a")
        assert idle.wait(10) and seen == [1]
    finally:
        t.stop(5)

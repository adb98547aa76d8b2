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

"""The leader's duties as a step function, driven by a fake clock and a real kernel."""
from __future__ import annotations

from gesmas.server.duties import LeaderDuties
from gesmas.server.kernel import Checkpoint, CloseSession, OpenSession, RegisterClass, codec
from gesmas.server.kernel import Kernel

SOURCE = "class Queue:\n    pass\n\n\nclass Group:\n    pass\n"


class Replica:
    """A kernel plus the duties, as the node wires them, with time passed in."""

    def __init__(self, checkpoint_every: int = 1000) -> None:
        self.kernel = Kernel()
        self.duties = LeaderDuties(checkpoint_every, 10.0, lambda: [("queue", SOURCE)])
        self.index = 0
        self.duties.reset(self.kernel, 0.0)

    def apply(self, cmd: codec.Command, now: float) -> None:
        self.index += 1
        self.kernel.apply(self.index, cmd)
        self.duties.applied(self.index, self.kernel, now)

    def step(self, now: float, leader: bool = True) -> list[codec.Command]:
        return self.duties.step(now, 1000.0 + now, leader)

    def kinds(self, now: float, leader: bool = True) -> list[str]:
        return [type(c).__name__ for c in self.step(now, leader)]


def test_a_follower_proposes_nothing():
    r = Replica()
    assert r.step(1.0, leader=False) == []


def test_standard_classes_are_proposed_until_registered_at_most_every_5_s():
    r = Replica()
    assert r.kinds(10.0) == ["RegisterClass"]
    assert r.kinds(12.0) == []
    assert r.kinds(15.5) == ["RegisterClass"]
    r.apply(RegisterClass(source=SOURCE), 16.0)
    assert r.kinds(30.0) == []


def test_a_session_without_keep_alives_expires_after_its_ttl_and_is_retried_after_2_s():
    r = Replica()
    r.apply(RegisterClass(source=SOURCE), 0.0)
    r.apply(OpenSession(ttl=3.0), 0.0)
    sid = r.index
    assert r.kinds(2.0) == []
    assert r.duties.keep_alive(sid, "", 2.5) == 3.0
    assert r.kinds(5.0) == []                          # 2.5 s after the keep-alive
    expired = r.step(5.6)
    assert [(type(c).__name__, c.session) for c in expired] == [("ExpireSession", sid)]
    assert r.kinds(6.0) == []                          # proposed, not applied yet
    assert r.kinds(7.7) == ["ExpireSession"]           # not applied after 2 s: again
    r.apply(expired[0], 7.8)
    assert r.kinds(20.0) == [] and r.duties.keep_alive(sid, "", 20.0) is None


def test_a_new_leader_grants_every_session_a_fresh_ttl():
    r = Replica()
    r.apply(RegisterClass(source=SOURCE), 0.0)
    r.apply(OpenSession(ttl=3.0), 0.0)
    assert r.kinds(10.0, leader=False) == []
    assert r.kinds(10.5) == []                         # leader from now on: a fresh 3 s
    assert r.kinds(13.6) == ["ExpireSession"]


def test_keep_alive_of_an_unknown_session():
    r = Replica()
    r.apply(OpenSession(ttl=3.0), 0.0)
    r.apply(CloseSession(session=r.index), 0.0)
    assert r.duties.keep_alive(1, "", 1.0) is None          # closed
    assert r.duties.keep_alive(99, "", 1.0) == 10.0        # not applied here yet: default ttl
    assert 99 not in r.duties._last_seen                    # ...and not remembered
    assert r.duties.keep_alive(10**9, "", 1.0) is None     # far beyond the log: unknown


def test_keep_alive_needs_the_session_secret():
    r = Replica()
    r.apply(RegisterClass(source=SOURCE), 0.0)
    r.apply(OpenSession(ttl=3.0, secret="s3"), 0.0)
    sid = r.index
    assert r.kinds(0.1) == []                              # the leader from now on
    assert r.duties.keep_alive(sid, "wrong", 2.5) is None
    assert r.kinds(3.4) == ["ExpireSession"]               # the wrong one renewed nothing
    assert r.duties.keep_alive(sid, "s3", 3.5) == 3.0


def test_made_up_keep_alives_cost_no_memory():
    r = Replica()
    r.apply(OpenSession(ttl=3.0), 0.0)
    for sid in range(1, 100_000):
        r.duties.keep_alive(sid, "x", 1.0)
    assert len(r.duties._last_seen) == 1


def test_a_tick_when_the_earliest_deadline_is_due_at_most_every_50_ms():
    r = Replica()
    r.apply(RegisterClass(source=SOURCE), 0.0)
    r.apply(RegisterClass(source="class W:\n    def __init__(self):\n        self.s = Semaphore(0)\n"
                                 "    def wait(self):\n        self.s.acquire(timeout=5)\n"), 0.0)
    r.apply(OpenSession(ttl=100.0, ts=1000.0), 0.0)
    sid = r.index
    r.apply(codec.CreateObject(class_name="W", name="w", ts=1000.0), 0.0)
    r.apply(codec.Invoke(session=sid, seq=1, name="w", method="wait", ts=1000.0), 0.0)
    assert r.kinds(4.0) == []                          # due at wall 1005
    assert r.kinds(5.0) == ["Tick"]
    assert r.kinds(5.02) == []
    assert r.kinds(5.1) == ["Tick"]


def test_a_checkpoint_every_n_commands_at_most_every_5_s():
    r = Replica(checkpoint_every=3)
    r.apply(RegisterClass(source=SOURCE), 0.0)
    r.apply(OpenSession(ttl=100.0), 0.0)
    assert r.kinds(6.0) == []
    r.apply(OpenSession(ttl=100.0), 0.0)
    assert r.kinds(7.0) == ["Checkpoint"]
    assert r.kinds(8.0) == []
    proposed, = r.step(12.5, True)
    # the newest form: saved after the entry, sessions' objects in parts, hooked ones only
    assert proposed == Checkpoint(ts=proposed.ts, defer=True, calls_apart=True,
                                  listed_after=True, touched_in_parts=True, hooked_touched=True,
                                  keep_gone=True)
    r.apply(Checkpoint(), 13.0)
    assert r.kinds(20.0) == []


def test_a_cluster_made_before_a_new_standard_module_gets_it_registered():
    r = Replica()
    r.apply(RegisterClass(source="class Queue:\n    pass\n"), 0.0)   # an older gesmas's set
    assert r.kinds(10.0) == ["RegisterClass"]                      # Group is missing
    r.apply(RegisterClass(source=SOURCE), 10.1)
    assert r.kinds(20.0) == []


def test_a_changed_standard_source_is_registered_again():
    r = Replica()
    r.apply(RegisterClass(source=SOURCE.replace("pass", "x = 1", 1)), 0.0)   # an older one
    assert r.kernel.registry.latest("Queue").version == 1
    assert r.kinds(10.0) == ["RegisterClass"]
    r.apply(RegisterClass(source=SOURCE), 10.1)
    assert r.kernel.registry.latest("Queue").version == 2
    assert r.kinds(20.0) == []


def test_a_leader_vouches_for_keep_alives_only_while_a_majority_answers_it():
    """Replica.leads_with_majority over a stand-in for pysyncobj's node: a leader resumed
    after a pause (its followers' last answers old) must not acknowledge a keep-alive."""
    import time

    from gesmas.server.replication.replica import Replica as RaftReplica

    class Node:
        def __init__(self, leader: bool, heard: dict[str, float]) -> None:
            self.leader = leader
            self._SyncObj__otherNodes = list(heard)
            self._SyncObj__lastResponseTime = heard

        def _isLeader(self) -> bool:
            return self.leader

    replica = object.__new__(RaftReplica)
    now = time.monotonic()
    replica._node = Node(True, {"b": now - 0.1, "c": now - 5.0})
    assert replica.leads_with_majority(1.0)                  # itself and b: 2 of 3
    replica._node = Node(True, {"b": now - 5.0, "c": now - 5.0})
    assert not replica.leads_with_majority(1.0)              # paused: nobody answered since
    replica._node = Node(False, {"b": now, "c": now})
    assert not replica.leads_with_majority(1.0)              # not the leader
    replica._node = Node(True, {})
    assert replica.leads_with_majority(1.0)                  # a cluster of one

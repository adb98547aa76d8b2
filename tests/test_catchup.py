"""The rule by which a leader keeps its log for a follower catching up (override 18,
replication/catchup.py), on plain values; tests/test_rejoin.py runs it in a cluster."""
from __future__ import annotations

import pytest

from gesmas.server.replication.catchup import CATCH_UP_GRACE, CATCH_UP_KEEP, SILENT_BEATS, CatchUp

A, B = "a:1", "b:2"
EVERY = 1000                       # lag = a tenth: 100 entries
BEAT = 0.05                        # the heartbeat: silent after SILENT_BEATS of them


def keeps(c: CatchUp, *, confirmed: dict, connected=(A, B), now: float = 1000.0,
          leader: bool = True, forced: bool = False, log_entries: int = 500,
          applied: int = 10_000, next_index: dict | None = None,
          heard: dict | None = None) -> bool:
    return c.keeps_log(leader=leader, forced=forced, log_entries=log_entries, every=EVERY,
                       applied=applied, others=(A, B), connected=connected,
                       confirmed=confirmed, next_index=next_index or {},
                       heard=heard if heard is not None else {A: now, B: now}, now=now)


def test_a_connected_follower_behind_by_more_than_a_tenth_of_an_interval_holds_the_log():
    c = CatchUp(BEAT)
    assert keeps(c, confirmed={A: 10_000, B: 9_899})
    assert not keeps(c, confirmed={A: 10_000, B: 9_900})          # exactly the lag: cut
    assert not keeps(c, confirmed={A: 10_000, B: 10_000})


def test_only_a_leader_holds_and_a_forced_compaction_is_never_held():
    c = CatchUp(BEAT)
    assert not keeps(c, confirmed={A: 0, B: 0}, leader=False)
    assert not keeps(c, confirmed={A: 0, B: 0}, forced=True)


def test_the_log_is_held_up_to_its_bound_and_no_further():
    c = CatchUp(BEAT)
    bound = CATCH_UP_KEEP * EVERY
    assert keeps(c, confirmed={A: 1, B: 10_000}, log_entries=bound)
    assert not keeps(c, confirmed={A: 1, B: 10_000}, log_entries=bound + 1)


def test_a_follower_disconnected_within_the_grace_holds_the_log_and_then_no_longer():
    c = CatchUp(BEAT)
    c.disconnected(B, now=1000.0)
    behind = {A: 10_000, B: 5_000}
    assert keeps(c, confirmed=behind, connected=(A,), now=1000.0)
    assert keeps(c, confirmed=behind, connected=(A,), now=1000.0 + CATCH_UP_GRACE - 0.1)
    assert not keeps(c, confirmed=behind, connected=(A,), now=1000.0 + CATCH_UP_GRACE)
    c.disconnected(B, now=2000.0)                 # it came back and went again: counted anew
    assert keeps(c, confirmed=behind, connected=(A,), now=2000.0 + 1)


def test_a_disconnected_follower_behind_by_a_single_entry_holds_the_log():
    """Nothing reaches it until it is back: at 10^6 objects the leader compacted 1.8 s after
    a follower was stopped, a few hundred entries past it (under the tenth that holds the
    log for a connected one), and the follower needed the leader's whole snapshot."""
    c = CatchUp(BEAT)
    c.disconnected(B, now=1000.0)
    assert keeps(c, confirmed={A: 10_000, B: 9_999}, connected=(A,), now=1001.0)
    assert not keeps(c, confirmed={A: 10_000, B: 10_000}, connected=(A,), now=1001.0)
    assert not keeps(c, confirmed={A: 10_000, B: 9_999}, connected=(A, B), now=1001.0)


def test_a_follower_sent_a_snapshot_is_placed_at_the_snapshot_not_at_what_it_confirmed():
    """A wiped follower confirmed 9,950 before it lost its data. The leader learns it holds
    nothing (its next index goes back to 1), then sends it the snapshot at 8,000 and goes
    on from 8,001: its place is there, far behind, until it confirms more."""
    c = CatchUp(BEAT)
    assert keeps(c, confirmed={A: 10_000, B: 9_950}, next_index={A: 10_001, B: 1})
    assert keeps(c, confirmed={A: 10_000, B: 9_950}, next_index={A: 10_001, B: 8_001})
    c.disconnected(B, now=1000.0)                         # silent while it loads the snapshot
    assert keeps(c, confirmed={A: 10_000, B: 9_950}, next_index={A: 10_001, B: 8_001},
                 connected=(A,), now=1010.0)
    assert not keeps(c, confirmed={A: 10_000, B: 9_950}, next_index={A: 10_001, B: 9_960})


def test_a_connected_follower_silent_for_a_few_heartbeats_holds_the_log_if_behind_at_all():
    """A follower loading the snapshot it was just sent answers nothing while its connection
    is still up: at 10^5 waiting calls the leader compacted within a second of such a load,
    under a tenth of an interval past it, and the follower had to load the next snapshot."""
    c = CatchUp(BEAT)
    silent = SILENT_BEATS * BEAT
    loading = {A: 10_000, B: 9_950}                    # 50 behind: under the tenth
    assert not keeps(c, confirmed=loading, heard={A: 1000.0, B: 1000.0 - silent}, now=1000.0)
    assert keeps(c, confirmed=loading, heard={A: 1000.0, B: 1000.0 - silent - 0.01},
                 now=1000.0)
    assert not keeps(c, confirmed={A: 10_000, B: 10_000},      # silent but not behind
                     heard={A: 1000.0, B: 990.0}, now=1000.0)


def test_a_disconnected_follower_that_never_confirmed_to_this_leader_does_not_hold_it():
    """After a failover the new leader's confirmed indexes start at 0: the old leader, gone,
    must not hold the new one's log for two minutes."""
    c = CatchUp(BEAT)
    c.disconnected(B, now=1000.0)
    assert not keeps(c, confirmed={A: 10_000, B: 0}, connected=(A,), now=1001.0)
    assert keeps(c, confirmed={A: 10_000, B: 0}, connected=(A, B), now=1001.0)   # connected


def test_a_follower_never_seen_disconnected_counts_only_while_connected():
    c = CatchUp(BEAT)
    assert not keeps(c, confirmed={A: 10_000, B: 5_000}, connected=(A,))


@pytest.mark.parametrize("every", [0, 1, 5])
def test_tiny_intervals_still_have_a_lag_of_one_entry(every):
    c = CatchUp(BEAT)
    held = c.keeps_log(leader=True, forced=False, log_entries=1, every=every, applied=10,
                       others=(A,), connected=(A,), confirmed={A: 8}, next_index={},
                       heard={A: 0.0}, now=0.0)
    assert held
    assert not c.keeps_log(leader=True, forced=False, log_entries=1, every=every, applied=10,
                           others=(A,), connected=(A,), confirmed={A: 9}, next_index={},
                           heard={A: 0.0}, now=0.0)


# -- the gates of a compaction and a snapshot already written (overrides.py) -----------------

from pysyncobj.config import SERIALIZER_STATE            # noqa: E402

from gesmas.server.replication.overrides import _RaftNode   # noqa: E402
from gesmas.server.replication.snapshots import BackgroundSerializer, _Job   # noqa: E402


class _Serializer:
    """The part of snapshots.BackgroundSerializer the compaction reads."""

    def __init__(self, job):
        self._job, self.checked = job, 0

    under_way = BackgroundSerializer.under_way

    def checkSerializing(self):
        self.checked += 1
        job, self._job = self._job, None
        if job is None or job.cancelled:
            return SERIALIZER_STATE.NOT_SERIALIZING, 0
        return job.result, job.id


def _node(job, holds: bool = True):
    """A _RaftNode with only what its compaction touches: a leader whose override 18 holds
    the log (a follower catching up), pysyncobj's log ends recorded."""
    node = _RaftNode.__new__(_RaftNode)
    node._gesmas_replica = None
    node._SyncObj__serializer = ser = _Serializer(job)
    node._gesmas_keeps_log_for_a_follower = lambda: holds
    node.deleted = []
    node._SyncObj__deleteEntriesTo = node.deleted.append
    node._SyncObj__lastSerializedTime = node._SyncObj__lastSerializedEntry = 0
    return node, ser


def _job(done: bool, cancelled: bool = False, ok: bool = True) -> _Job:
    job = _Job(7)
    if ok:
        job.result = SERIALIZER_STATE.SUCCESS
    job.cancelled = cancelled
    if done:
        job.done.set()
    return job


def test_a_snapshot_written_while_the_log_is_held_is_finished():
    """A wiped follower waited minutes for a snapshot: the leader wrote one, override 18 then
    held compaction for that follower and so never read the end of the writing, and until it
    is read the serializer sends no follower anything."""
    node, ser = _node(_job(done=True))
    node._SyncObj__tryLogCompaction()
    assert ser._job is None and ser.checked == 1           # read: snapshots can be sent
    assert node.deleted == [7] and node._SyncObj__lastSerializedEntry == 7


def test_a_snapshot_being_written_or_replaced_starts_no_other():
    node, ser = _node(_job(done=False), holds=False)
    node._SyncObj__tryLogCompaction()
    assert ser.checked == 0 and ser._job is not None and node.deleted == []
    node, ser = _node(_job(done=True, cancelled=True), holds=False)
    node._SyncObj__tryLogCompaction()                     # a received snapshot replaced it
    assert ser.checked == 1 and ser._job is None and node.deleted == []


def test_a_failed_snapshot_is_read_and_compacts_nothing():
    node, ser = _node(_job(done=True, ok=False))
    node._SyncObj__tryLogCompaction()
    assert ser.checked == 1 and ser._job is None and node.deleted == []


def test_with_no_snapshot_under_way_a_held_log_starts_none():
    node, ser = _node(None)
    node._SyncObj__tryLogCompaction()
    assert ser.checked == 0 and node.deleted == []


def test_replicas_take_their_snapshots_a_stagger_apart_leader_first(monkeypatch):
    """Override 25: replicas become due for a snapshot together; the leader starts it at
    once, the follower of rank r after it (by sorted ids, the leader left out) waits
    r * SNAPSHOT_STAGGER seconds after it became due, a forced one not at all; the wait
    starts again the next time it is due; 0 (GESMAS_SNAPSHOT_STAGGER) waits for nothing."""
    from pysyncobj import SyncObj
    from pysyncobj.config import SyncObjConf as Conf
    from pysyncobj.node import TCPNode as Node

    from gesmas.server.replication import overrides
    clock = [100.0]
    monkeypatch.setattr(overrides._ps, "monotonicTime", lambda: clock[0])
    started: list = []
    monkeypatch.setattr(SyncObj, "_SyncObj__tryLogCompaction", lambda self: started.append(clock[0]))
    stagger = overrides.catchup.SNAPSHOT_STAGGER
    ids = ("127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3")

    def replica(me: str, leader: str | None):
        node, _ = _node(None, holds=False)
        node._SyncObj__conf = Conf(logCompactionMinEntries=100, logCompactionMinTime=300)
        node._SyncObj__raftLog = [None] * 150                     # due: over 100 entries
        node._SyncObj__lastSerializedTime = clock[0]
        node._SyncObj__forceLogCompaction = False
        node._SyncObj__selfNode = Node(me)
        node._SyncObj__otherNodes = {Node(a) for a in ids if a != me}
        node._SyncObj__raftState = _RAFT_STATE.LEADER if me == leader else _RAFT_STATE.FOLLOWER
        node._SyncObj__raftLeader = Node(leader) if leader else None
        return node

    def waits(node) -> float | None:
        """Seconds from due to started, tried every 0.1 s (None: not within 10 s)."""
        t0 = clock[0]
        started.clear()
        for k in range(101):
            clock[0] = t0 + k * 0.1
            node._SyncObj__tryLogCompaction()
            if started:
                return round(clock[0] - t0, 1)
        return None
    assert waits(replica("127.0.0.1:3", leader="127.0.0.1:3")) == 0          # the leader
    assert waits(replica("127.0.0.1:1", leader="127.0.0.1:3")) == stagger    # followers after
    assert waits(replica("127.0.0.1:2", leader="127.0.0.1:3")) == 2 * stagger
    assert waits(replica("127.0.0.1:1", leader=None)) == 0                   # no leader known:
    last = replica("127.0.0.1:3", leader=None)                               # by ids alone
    assert waits(last) == 2 * stagger
    last._SyncObj__raftLog = [None] * 10                          # compacted: not due
    clock[0] += 100
    last._SyncObj__tryLogCompaction()                             # pysyncobj finds nothing
    last._SyncObj__raftLog = [None] * 150
    clock[0] += 100
    assert waits(last) == 2 * stagger                             # waits again from now
    forced = replica("127.0.0.1:3", leader="127.0.0.1:1")
    forced._SyncObj__forceLogCompaction = True
    assert waits(forced) == 0
    unstaggered = replica("127.0.0.1:3", leader="127.0.0.1:1")
    unstaggered._gesmas_stagger = 0.0                             # GESMAS_SNAPSHOT_STAGGER=0
    assert waits(unstaggered) == 0


# -- override 19: a snapshot sent once (catchup.SnapshotsSent) -----------------------------

from pysyncobj.config import SyncObjConf                  # noqa: E402
from pysyncobj.syncobj import _RAFT_STATE                 # noqa: E402
from pysyncobj.node import TCPNode                        # noqa: E402

from gesmas.server.replication.catchup import SENT_SNAPSHOT_BOUND, SnapshotsSent   # noqa: E402

F = TCPNode("127.0.0.1:1")


def _reset(to: int = 1) -> dict:
    """What a wiped follower answers a heartbeat with."""
    return {"type": "next_node_idx", "next_node_idx": to, "reset": True, "success": False}


def _loaded(to: int) -> dict:
    """What a follower answers once it has loaded a snapshot (its log ends at to - 1)."""
    return {"type": "next_node_idx", "next_node_idx": to, "reset": False, "success": True}


class _Sender:
    """pysyncobj's serializer as the leader's sending reads it: a snapshot in two chunks, the
    second (empty) the last, started again from the top once finished."""

    def __init__(self):
        self.at, self.starts = {}, 0

    def getTransmissionData(self, node):
        pos = self.at.get(node, 0)
        self.starts += pos == 0
        self.at[node] = (pos + 1) % 2
        return (b"snapshot" if pos == 0 else b""), pos == 0, pos == 1

    def cancelTransmisstion(self, node):
        self.at.pop(node, None)


class _Wire:
    def __init__(self):
        self.sent = []

    def send(self, node, message):
        self.sent.append((node, message))


def _leader():
    """A _RaftNode leader with what sending appends and taking answers touch: its log starts
    at a snapshot of index 11 (entries 10 and 11), entry 12 follows, and follower F is wiped."""
    node = _RaftNode.__new__(_RaftNode)
    node._gesmas_sent = SnapshotsSent()
    node._SyncObj__conf = SyncObjConf(appendEntriesPeriod=60.0)
    node._SyncObj__raftLog = [(b"\x00", 10, 1), (b"\x00", 11, 1), (b"\x01cmd", 12, 1)]
    node._SyncObj__otherNodes, node._SyncObj__readonlyNodes = {F}, set()
    node._SyncObj__connectedNodes = {F}
    node._SyncObj__serializer = _Sender()
    node._SyncObj__transport = _Wire()
    node._SyncObj__raftNextIndex, node._SyncObj__raftMatchIndex = {F: 1}, {F: 0}
    node._SyncObj__lastResponseTime = {F: 0.0}
    node._SyncObj__raftCurrentTerm, node._SyncObj__raftCommitIndex = 1, 12
    node._SyncObj__raftState = _RAFT_STATE.LEADER
    return node


def test_an_answer_written_before_a_snapshot_arrived_does_not_send_it_again():
    """The follower answered two heartbeats with a reset; the first started the snapshot,
    which went out whole in one tick; the second, on its way meanwhile, used to start it
    over."""
    node = _leader()
    node._SyncObj__sendAppendEntries()
    assert node._SyncObj__serializer.starts == 1
    assert node._SyncObj__raftNextIndex[F] == 13           # the snapshot, then entry 12
    node._SyncObj__onMessageReceived(F, _reset())            # written before the snapshot
    assert node._SyncObj__raftNextIndex[F] == 13
    assert node._SyncObj__lastResponseTime[F] > 0            # but it was heard
    assert node._gesmas_sent.ignored == 1
    node._SyncObj__sendAppendEntries()
    assert node._SyncObj__serializer.starts == 1             # not sent again
    node._SyncObj__onMessageReceived(F, _loaded(12))         # the load's answer
    assert node._SyncObj__raftMatchIndex[F] == 11 and node._gesmas_sent.sent == {}
    node._SyncObj__onMessageReceived(F, _reset())            # a reset after it counts again
    assert node._SyncObj__raftNextIndex[F] == 1
    node._SyncObj__sendAppendEntries()
    assert node._SyncObj__serializer.starts == 2


def test_a_stale_success_below_the_snapshot_does_not_move_the_next_index_back():
    node = _leader()
    node._SyncObj__sendAppendEntries()
    node._SyncObj__onMessageReceived(F, _loaded(5))          # an older append's answer
    assert node._SyncObj__raftNextIndex[F] == 13 and node._SyncObj__raftMatchIndex[F] == 0


def test_a_follower_that_never_answers_past_the_snapshot_is_believed_after_the_bound():
    node = _leader()
    node._SyncObj__sendAppendEntries()
    index, when = node._gesmas_sent.sent[F]
    assert index == 11
    node._gesmas_sent.sent[F] = (index, when - SENT_SNAPSHOT_BOUND - 1)
    node._SyncObj__onMessageReceived(F, _reset())
    assert node._SyncObj__raftNextIndex[F] == 1 and node._gesmas_sent.sent == {}


def test_a_disconnection_forgets_the_snapshot_sent():
    """The snapshot sent on a closed connection may never have arrived whole."""
    node = _leader()
    node._SyncObj__sendAppendEntries()
    node._gesmas_catch_up = CatchUp(BEAT)
    node._SyncObj__onNodeDisconnected(F)
    assert F not in node._SyncObj__connectedNodes and node._gesmas_sent.sent == {}
    node._SyncObj__connectedNodes.add(F)                      # back
    node._SyncObj__onMessageReceived(F, _reset())
    assert node._SyncObj__raftNextIndex[F] == 1


class _Writing:
    """A serializer writing a snapshot: no chunk to give (BackgroundSerializer while its
    job runs), and a count of the times it was asked for one."""

    def __init__(self):
        self.asked = 0

    def sending_paused(self):
        return True

    def getTransmissionData(self, node):
        self.asked += 1
        return None

    def cancelTransmisstion(self, node):
        pass


def test_a_follower_needing_a_snapshot_while_one_is_written_gets_one_heartbeat():
    """Override 24: pysyncobj's loop asked the serializer for a chunk again and again until a
    heartbeat period had passed (50 ms of the tick thread and ~30,000 messages each round
    while the leader wrote a snapshot). The follower gets one heartbeat; a healthy follower
    gets its entries in the same round; the first stays connected."""
    node = _leader()
    node._SyncObj__conf = SyncObjConf(appendEntriesPeriod=0.2)   # bounds the loop if it spins
    node._SyncObj__serializer = writing = _Writing()
    g = TCPNode("127.0.0.1:2")
    node._SyncObj__otherNodes.add(g)
    node._SyncObj__connectedNodes.add(g)
    node._SyncObj__raftNextIndex[g], node._SyncObj__raftMatchIndex[g] = 12, 11
    node._SyncObj__lastResponseTime[g] = 0.0
    node._SyncObj__sendAppendEntries()
    to_f = [m for n, m in node._SyncObj__transport.sent if n == F]
    to_g = [m for n, m in node._SyncObj__transport.sent if n == g]
    assert writing.asked == 0
    assert to_f == [{"type": "append_entries", "term": 1, "commit_index": 12,
                     "serialized": None}]
    assert [e[1] for m in to_g for e in m["entries"]] == [12]
    assert node._SyncObj__connectedNodes == {F, g}
    assert node._SyncObj__raftNextIndex[F] == 1 and node._gesmas_sent.sent == {}
    node._SyncObj__serializer = _Sender()                     # written: the snapshot goes
    node._SyncObj__sendAppendEntries()
    assert node._SyncObj__serializer.starts == 1 and node._SyncObj__raftNextIndex[F] == 13


def test_the_rule_on_plain_values():
    s = SnapshotsSent(bound=10.0)
    plain = {"type": "next_node_idx", "next_node_idx": 3, "reset": False, "success": False}
    assert s.answer(A, _reset(), 0.0) == _reset()            # nothing sent: as it comes
    s.went(A, 11, 100.0)
    assert s.answer(B, _reset(), 100.5) == _reset()          # another follower
    assert s.answer(A, plain, 100.5) is plain                # moves nothing anyway
    neutral = s.answer(A, _reset(11), 100.5)                 # at the snapshot's index
    assert neutral["reset"] is False and neutral["success"] is False
    assert s.answer(A, _reset(12), 101.0) == _reset(12) and A not in s.sent   # past it
    s.went(A, 11, 100.0)
    assert s.answer(A, {"type": "next_node_idx"}, 100.5) == {"type": "next_node_idx"}
    assert A not in s.sent                                   # malformed: given up, as it comes
    s.went(A, 11, 100.0)
    assert s.answer(A, _reset(), 110.5) == _reset() and A not in s.sent     # the bound
    s.went(A, 11, 100.0)
    s.forget(A)
    assert s.answer(A, _reset(), 100.5) == _reset()


class _Log(list):
    def add(self, command, index, term):
        self.append((command, index, term))


def test_a_new_term_of_leadership_forgets_what_an_earlier_one_sent():
    """A snapshot sent in an earlier term may never have been loaded (another leader's
    came first): the follower's answers count again at once."""
    node = _leader()
    node._SyncObj__sendAppendEntries()
    assert F in node._gesmas_sent.sent
    node._SyncObj__raftLog = _Log(node._SyncObj__raftLog)
    node._SyncObj__selfNode, node._SyncObj__raftCurrentTerm = TCPNode("127.0.0.1:2"), 2
    node._SyncObj__conf.onStateChanged = None
    node._SyncObj__onBecomeLeader()
    assert node._gesmas_sent.sent == {} and node._SyncObj__raftNextIndex[F] > 12
    node._SyncObj__onMessageReceived(F, _reset())
    assert node._SyncObj__raftNextIndex[F] == 1


# -- override 23: a snapshot sent at a bounded rate (catchup.SnapshotPacer) -------------------
from gesmas.server.replication.catchup import (SNAPSHOT_RATE, SnapshotPacer,  # noqa: E402
                                               snapshot_rate_from_env)
from gesmas.server.replication.transport import chunk_bytes  # noqa: E402


def test_the_snapshot_rate_comes_from_the_environment_or_is_refused_by_name():
    assert snapshot_rate_from_env({}) == SNAPSHOT_RATE
    assert snapshot_rate_from_env({"GESMAS_SNAPSHOT_RATE": " 64 "}) == 64 * 2 ** 20
    assert snapshot_rate_from_env({"GESMAS_SNAPSHOT_RATE": "0"}) == 0     # unpaced
    for bad in ("fast", "nan", "inf", "-40", "7.9", "1e400"):
        with pytest.raises(ValueError, match="GESMAS_SNAPSHOT_RATE"):
            snapshot_rate_from_env({"GESMAS_SNAPSHOT_RATE": bad})


def test_the_snapshot_stagger_comes_from_the_environment_or_is_refused_by_name():
    from gesmas.server.replication.catchup import SNAPSHOT_STAGGER, snapshot_stagger_from_env
    assert snapshot_stagger_from_env({}) == SNAPSHOT_STAGGER == 2.0
    assert snapshot_stagger_from_env({"GESMAS_SNAPSHOT_STAGGER": " 0.5 "}) == 0.5
    assert snapshot_stagger_from_env({"GESMAS_SNAPSHOT_STAGGER": "0"}) == 0
    for bad in ("soon", "nan", "inf", "-1", "31", "1e400"):
        with pytest.raises(ValueError, match="GESMAS_SNAPSHOT_STAGGER"):
            snapshot_stagger_from_env({"GESMAS_SNAPSHOT_STAGGER": bad})


def test_a_pacer_lets_a_burst_go_then_the_rate_per_node():
    mb = 2 ** 20
    p = SnapshotPacer(10 * mb)          # burst: 2 MiB (a tenth of a second would be 1 MiB)
    assert p.burst == 2 * mb
    mb1 = 1_000_000
    assert p.may_send("a", mb1, 0.0) and p.may_send("a", mb1, 0.0)
    assert p.may_send("a", mb1, 0.0)    # the last 97,152 bytes of credit: spent past it
    assert not p.may_send("a", mb1, 0.0) and p.held == 1
    assert p.may_send("b", mb1, 0.0)    # each node its own credit
    assert p.may_send("a", 0, 0.0)      # nothing of a snapshot: never held
    assert not p.may_send("a", mb1, 0.05)   # -902,848 + 524,288: still below zero
    assert p.may_send("a", mb1, 0.11)       # + 0.06 s more: above
    assert p.may_send("a", 1, 100.0) and p.credit["a"][0] == 2 * mb - 1   # capped at burst
    p.forget("a")
    assert "a" not in p.credit
    assert SnapshotPacer(0).may_send("a", 10 ** 12, 0.0)     # unpaced


def test_only_snapshot_chunks_are_counted():
    chunk = {"type": "append_entries", "serialized": (b"s" * 1000, True, False)}
    none = {"type": "append_entries", "serialized": None}    # no snapshot to send yet
    ae = {"type": "append_entries", "entries": [(b"e" * 5000, 1, 1)]}
    assert chunk_bytes([chunk, ae, none, chunk, "not a dict"]) == 2000
    assert chunk_bytes([ae]) == 0

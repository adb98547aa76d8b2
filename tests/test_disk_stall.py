"""A disk that stalls does not stall Raft (override 20, journal.py's syncer).

The three replicas of these in-process clusters share one disk, as on this machine: the
journal's fsync failpoint (GESMAS_FAILPOINT_FSYNC_STALL) makes every fsync of every replica
wait until the time written in a file, twice for 2 s while one client commits in a loop.
Writes wait for the disk, but the term and the leader stay: the tick threads go on sending
and reading heartbeats, and the followers, whose acks wait, tell the leader they are alive
(override 22). Two controls: syncing on the tick thread, as gesmas did before, holds every
heartbeat past the election timeout (0.5-1.2 s); without the followers' keep-alives the
leader, unanswered for leader_fallback_timeout (1.5 s), steps down. Both raise the term.
Also the syncer's own rules, on a journal alone."""
from __future__ import annotations

import os
import threading
import time

import pytest

from gesmas.server.replication import journal as journal_mod
from gesmas.server.replication.journal import FAILPOINT_FSYNC_STALL, DurableJournal
from gesmas.server.replication.durable_transport import ALIVE, _DurableTransport

from test_raft_port import InProcessCluster, warmed

STALL = 2.0   # seconds: above the election timeout (RaftTuning: 1.2 s at most) and above
STALLS = 2    # leader_fallback_timeout (1.5 s)
# The controls' stalls: a stall that every tick thread sits out (syncing on the tick thread)
# ends in an election only if a follower's timer fires before the leader's next heartbeat
# lands, a race (once in ~10 runs both of two stalls ended without one). So a control
# stalls up to four times, and no more once a term rose: each election may lose a write in
# flight, which the loop would wait for in vain (four stalls in a row did, in a full run).
CONTROL_STALLS = 4


def term(replica) -> int:
    return replica._raft._SyncObj__raftCurrentTerm


def stalled_run(tmp_path, monkeypatch, stalls_n: int = STALLS, until_term_rises: bool = False):
    """Commit in a loop through a cluster whose disk stalls `stalls_n` times (with
    `until_term_rises`, no more once a replica's term rose); returns (terms before, terms
    after, leader kept, writes, longest write in s)."""
    stall_file = tmp_path / "stall-until"
    monkeypatch.setenv(FAILPOINT_FSYNC_STALL, str(stall_file))
    for c in warmed(InProcessCluster(str(tmp_path / "c"))):
        leader = c.leader()
        before = [term(r) for r in c.replicas]
        done = threading.Event()

        def stalls():
            try:
                for _ in range(stalls_n):
                    time.sleep(1.0)
                    if until_term_rises and [term(r) for r in c.replicas] != before:
                        return
                    stall_file.write_text(repr(time.time() + STALL))
                    time.sleep(STALL)
            finally:
                done.set()
        threading.Thread(target=stalls, daemon=True).start()
        writes, longest = 0, 0.0
        while not done.is_set():
            started = time.monotonic()
            c.commit(b"during the stalls %d" % writes)
            longest = max(longest, time.monotonic() - started)
            writes += 1
        c.commit(b"after the stalls")
        return before, [term(r) for r in c.replicas], c.leader() is leader, writes, longest
    raise AssertionError("unreachable")


def test_a_stalled_disk_keeps_the_term_and_the_leader(tmp_path, monkeypatch):
    before, after, kept, writes, longest = stalled_run(tmp_path, monkeypatch)
    assert after == before and kept
    # the writes did meet the stalls (a failpoint that did nothing would not wait)
    assert writes > 0 and longest >= STALL / 2


def test_control_syncing_on_the_tick_thread_the_same_stalls_raise_the_term(
        tmp_path, monkeypatch):
    monkeypatch.setattr(_DurableTransport, "flush", _DurableTransport._flush_alone)
    before, after, _, _, _ = stalled_run(tmp_path, monkeypatch, CONTROL_STALLS, True)
    assert after[0] > before[0]


def test_control_without_the_followers_keep_alives_the_leader_steps_down(
        tmp_path, monkeypatch):
    monkeypatch.setattr(_DurableTransport, "_alive", lambda self, waiting: [])
    before, after, _, _, _ = stalled_run(tmp_path, monkeypatch, CONTROL_STALLS, True)
    assert after[0] > before[0]


# -- the syncer on a journal alone ------------------------------------------------------------

def held_journal(path, fsync=True):
    """(journal, gate, entered): each sync's write waits for `gate`; `entered` is set once
    the syncer reached one."""
    j = DurableJournal(str(path), fsync=fsync)
    gate, entered = threading.Event(), threading.Event()
    real = j._persist

    def slow(fd, offset, data):
        entered.set()
        gate.wait(10)
        real(fd, offset, data)
    j._persist = slow
    return j, gate, entered


def test_start_sync_hands_over_and_a_second_waits_for_the_first(tmp_path):
    j, gate, entered = held_journal(tmp_path)
    woken = []
    j.on_durable = lambda: woken.append(j.durable_seq)
    try:
        j.add(b"one", 1, 1)
        seq = j.start_sync()
        assert entered.wait(10) and j.dirty and j.durable_seq < seq
        j.add(b"two", 2, 1)
        assert j.start_sync() == seq + 1      # under way: the next hand-over covers "two"
        assert j.durable_index == 0
        gate.set()
        j.wait_synced()
        assert j.durable_seq == seq and j.durable_index == 1 and woken == [seq]
        assert j.dirty                        # "two" is still only in memory
        assert j.start_sync() == seq + 1
        j.wait_synced()
        assert j.durable_index == 2 and not j.dirty
    finally:
        gate.set()
        j._destroy()
    again = DurableJournal(str(tmp_path), fsync=True)
    try:
        assert [e[0] for e in again] == [b"one", b"two"] and again.durable_index == 2
    finally:
        again._destroy()


def test_a_truncation_waits_for_the_sync_under_way(tmp_path):
    """The follower's cut of a conflicting tail must not race the syncer's write of it."""
    j, gate, _ = held_journal(tmp_path, fsync=False)
    try:
        for i in range(1, 6):
            j.add(b"entry %d" % i, i, 1)
        j.start_sync()
        cut = threading.Thread(target=j.deleteEntriesFrom, args=(2,))  # keep 1 and 2
        cut.start()
        cut.join(0.2)
        assert cut.is_alive()                 # it waits for the write of 1..5
        gate.set()
        cut.join(10)
        assert not cut.is_alive() and j.durable_index == 2
        j.add(b"new 3", 3, 2)
        j.sync()
    finally:
        gate.set()
        j._destroy()
    again = DurableJournal(str(tmp_path), fsync=False)
    try:
        assert [(e[0], e[2]) for e in again] == [(b"entry 1", 1), (b"entry 2", 1), (b"new 3", 2)]
    finally:
        again._destroy()


def test_a_failed_fsync_is_raised_to_the_tick_thread(tmp_path, monkeypatch):
    j = DurableJournal(str(tmp_path), fsync=True)

    def broken(fd):
        raise OSError(5, "Input/output error")
    try:
        j.add(b"one", 1, 1)
        monkeypatch.setattr(journal_mod.os, "fsync", broken)
        j.start_sync()
        with pytest.raises(OSError):
            j.wait_synced()
        assert j.durable_index == 0
        with pytest.raises(OSError):           # and at every later hand-over
            j.start_sync()
    finally:
        monkeypatch.undo()
        j.failure = None
        j._destroy()


def test_the_commit_index_is_stored_by_the_syncer_never_past_the_durable_log(tmp_path):
    j = DurableJournal(str(tmp_path), fsync=False)
    try:
        for i in range(1, 4):
            j.add(b"e%d" % i, i, 1)
        j.sync()
        j.add(b"e4", 4, 1)
        j.setRaftCommitIndex(4)              # known committed elsewhere, not durable here yet
        j.onOneSecondTimer()                 # the tick thread only marks it due
        assert _stored_commit(tmp_path) != 4
        j.start_sync()
        j.wait_synced()
        assert _stored_commit(tmp_path) == 4
    finally:
        j._destroy()


def _stored_commit(path) -> int:
    probe = DurableJournal.__new__(DurableJournal)
    probe._meta_path = os.path.join(str(path), journal_mod.META_NAME)
    probe._term, probe._commit, probe._voted_for = 0, 1, None
    probe._load_meta()
    return probe._commit


def test_a_leader_counts_a_keep_alive_only_in_its_own_term():
    class Raft:
        _gesmas_replica = None
        _SyncObj__raftCurrentTerm = 7
        leader = True

        def __init__(self):
            self._SyncObj__lastResponseTime = {"f": 0.0}

        def _isLeader(self):
            return self.leader

    class Transport:
        _syncObj = Raft()
    t = Transport()
    receive = _DurableTransport._onMessageReceived
    heard = t._syncObj._SyncObj__lastResponseTime
    receive(t, "f", {"type": ALIVE, "term": 6})            # an earlier term: not an answer
    receive(t, "stranger", {"type": ALIVE, "term": 7})     # not a member: nothing added
    assert heard == {"f": 0.0}
    t._syncObj.leader = False
    receive(t, "f", {"type": ALIVE, "term": 7})            # not leading: nothing to count
    assert heard == {"f": 0.0}
    t._syncObj.leader = True
    receive(t, "f", {"type": ALIVE, "term": 7})
    assert heard["f"] > 0.0


def test_a_compaction_does_not_wait_for_the_disk(tmp_path):
    """The tick thread's part of a compaction touches no file: with a sync held under way,
    deleteEntriesTo returns at once; the new file (written by the syncer after that sync)
    holds exactly the kept entries, those written before and those buffered, and what is
    added after; so does a second compaction queued behind the first."""
    j, gate, _ = held_journal(tmp_path)
    try:
        for i in range(1, 6):
            j.add(b"entry %d" % i, i, 1)
        j.start_sync()                        # 1..5 handed over, held
        j.add(b"entry 6", 6, 1)               # buffered
        started = time.monotonic()
        j.deleteEntriesTo(3)                  # keep 4, 5 (in the held sync) and 6
        assert time.monotonic() - started < 1.0 and not gate.is_set()
        assert [e[1] for e in j] == [4, 5, 6] and j.first_index == 4
        j.add(b"entry 7", 7, 1)
        j.deleteEntriesTo(1)                  # keep 5, 6, 7: queued behind the first
        j.add(b"entry 8", 8, 1)
        assert j.dirty and j.durable_index < 8
        gate.set()
        j.wait_synced()
        j.start_sync()
        j.wait_synced()
        assert j.durable_index == 8 and not j.dirty
        kept = DurableJournal.__new__(DurableJournal)    # what a restart would read now
        kept.mark, kept.marked, kept._path = None, {}, j._path
        kept._entries, kept._offsets = [], []
        os.close(kept._open_log())
        assert [e[1] for e in kept._entries] == [5, 6, 7, 8]
        for i in (9, 10, 11):                 # buffered only: the kept part starts in them
            j.add(b"entry %d" % i, i, 1)
        j.deleteEntriesTo(len(j) - 2)         # keep 10, 11
        j.wait_synced()
    finally:
        gate.set()
        j._destroy()
    assert not os.path.exists(os.path.join(str(tmp_path), journal_mod.LOG_NAME + ".tmp"))
    again = DurableJournal(str(tmp_path), fsync=True)
    try:
        assert [(e[0], e[1]) for e in again] == [(b"entry 10", 10), (b"entry 11", 11)]
    finally:
        again._destroy()

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

from gesmas.server.replication import apply_thread                  # noqa: E402
from gesmas.server.replication.apply_thread import (ApplyThread, BACKGROUND_SHARE,  # noqa: E402
                                                    share_from_env)
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


def test_background_work_runs_in_slices_while_nothing_is_queued():
    """An entry queued during background work waits for one slice at most (a checkpoint's
    capture, kernel/capture.py, runs this way)."""
    slices, order = [], []
    in_slice, go_on, done = threading.Event(), threading.Event(), threading.Event()

    def background():
        slices.append(len(slices))
        order.append(("slice", len(slices)))
        if len(slices) == 2:
            in_slice.set()
            assert go_on.wait(10)
        if len(slices) == 5:
            done.set()
        return len(slices) < 5

    t = ApplyThread("t", lambda i, d: order.append(("entry", i)), lambda: None, background)
    try:
        t.put(1, b"a")                           # after it: background until it says done
        assert in_slice.wait(10)
        t.put(2, b"b")                           # queued during slice 2
        go_on.set()
        assert t.wait_idle(10) and done.wait(10)
        assert order[:4] == [("entry", 1), ("slice", 1), ("slice", 2), ("entry", 2)]
        assert [o for o in order if o[0] == "slice"] == [("slice", n) for n in range(1, 6)]
    finally:
        t.stop(5)


def _busy(cpu_seconds: float) -> float:
    """Spin for that much of this thread's CPU; the CPU it used."""
    c0 = time.thread_time()
    while time.thread_time() - c0 < cpu_seconds:
        pass
    return time.thread_time() - c0


def _slices(n: int, cpu: float, spans: list, done: threading.Event):
    """A background() of n slices of `cpu` CPU seconds each, each noted as (start, end, cpu)."""
    def background():
        t0 = time.monotonic()
        used = _busy(cpu)
        spans.append((t0, time.monotonic(), used))
        if len(spans) == n:
            done.set()
        return len(spans) < n
    return background


def test_background_slices_rest_so_they_take_their_share_of_a_core():
    """With share s, after a slice that used c s of CPU the thread starts no slice for
    c(1-s)/s: a capture after a checkpoint spreads its CPU instead of taking a core."""
    spans: list = []
    done = threading.Event()
    t = ApplyThread("t", lambda i, d: None, lambda: None, _slices(4, 0.02, spans, done),
                    share=0.25, pace_for=60)
    try:
        t.put(1, b"a")
        assert done.wait(30)
        for (_, end, used), (start, _, _) in zip(spans, spans[1:]):
            assert start - end >= used * 3         # rest (1 - 0.25) / 0.25 = 3 slices' CPU
    finally:
        t.stop(5)


def test_a_run_of_slices_is_paced_only_in_its_first_seconds():
    """After `pace_for` s the slices left run back to back (a capture must end before the next
    checkpoint, which the leader proposes 5 s after the last at the soonest); a new run of
    slices (after one that said it was done) is paced again."""
    spans: list = []
    done = threading.Event()
    t = ApplyThread("t", lambda i, d: None, lambda: None, _slices(6, 0.05, spans, done),
                    share=0.01, pace_for=0.2)      # each rest would be ~5 s
    try:
        t.put(1, b"a")
        assert done.wait(30)
        first = spans[0][0]
        assert spans[1][0] >= first + 0.2         # rested until pace_for ended...
        assert spans[-1][0] < first + 4.5          # ...and no more (5 rests would be 25 s)
    finally:
        t.stop(5)


def test_a_lower_share_is_paced_for_longer_by_default(monkeypatch):
    """Without `pace_for`, a run is paced for PACE_FOR s or 1 / share s, whichever is longer,
    so a second of capture CPU at a low share still ends paced (not flat out after PACE_FOR
    on every replica at once). PACE_FOR shortened to 0.05 s: at share 0.2 the window is 5 s,
    so slices of 0.02 s keep resting 0.08 s each well past 0.05 s."""
    monkeypatch.setattr(apply_thread, "PACE_FOR", 0.05)
    spans: list = []
    done = threading.Event()
    t = ApplyThread("t", lambda i, d: None, lambda: None, _slices(6, 0.02, spans, done),
                    share=0.2)
    try:
        t.put(1, b"a")
        assert done.wait(30)
        assert spans[-1][0] - spans[0][0] > 0.2          # past PACE_FOR, still paced...
        for (_, end, used), (start, _, _) in zip(spans, spans[1:]):
            assert start - end >= used * 4                # ...each rest (1 - 0.2) / 0.2 = 4
    finally:
        t.stop(5)


def test_entries_and_jobs_do_not_wait_for_a_background_rest():
    """A slice of 0.1 s at share 0.01 rests ~10 s: an entry or a job queued meanwhile runs at
    once, and the rest goes on after it."""
    spans: list = []
    rested, done = threading.Event(), threading.Event()
    applied: list[float] = []
    slices = _slices(2, 0.1, spans, done)

    def background():
        more = slices()
        rested.set()
        return more

    t = ApplyThread("t", lambda i, d: applied.append(time.monotonic()), lambda: None,
                    background, share=0.01, pace_for=60)
    try:
        t.put(1, b"a")
        assert rested.wait(10)
        t.put(2, b"b")                               # queued during the rest
        assert t.wait_idle(10)
        assert t.call(time.monotonic) < spans[0][1] + 5      # a job, likewise
        assert applied[1] < spans[0][1] + 5          # not paced (the rest is ~10 s)
        assert len(spans) == 1                       # the rest was not cut short
    finally:
        t.stop(5)


def test_stop_ends_a_background_rest():
    rested = threading.Event()

    def background():
        _busy(0.1)
        rested.set()
        return True                                  # more, ~10 s from now

    t = ApplyThread("t", lambda i, d: None, lambda: None, background, share=0.01,
                    pace_for=60)
    t.put(1, b"a")
    assert rested.wait(10)
    t.stop(5)
    assert not t._thread.is_alive()


@pytest.mark.parametrize("raw, share", [("", BACKGROUND_SHARE), ("1", 1.0), (" 0.5 ", 0.5)])
def test_the_background_share_comes_from_the_environment(raw, share):
    assert share_from_env({"GESMAS_CAPTURE_SHARE": raw}) == share
    assert share_from_env({}) == BACKGROUND_SHARE


@pytest.mark.parametrize("raw", ["0", "-1", "1.5", "nan", "inf", "half"])
def test_a_bad_background_share_is_refused_by_name(raw):
    with pytest.raises(ValueError, match="GESMAS_CAPTURE_SHARE"):
        share_from_env({"GESMAS_CAPTURE_SHARE": raw})
    with pytest.raises(ValueError, match="share"):
        ApplyThread("t", lambda i, d: None, lambda: None, share=0)

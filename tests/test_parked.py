"""Parked calls (kernel/runner.py): a standard class's `_parked` method waits without a
greenlet, and is run again from its start when its wait is granted.

The property: for every log, a kernel that parks and one that keeps every waiting call's
greenlet give the same completions, the same state digest, the same steps and runs charged to
each object and the same checkpoint bytes; and a kernel restored from a parking kernel's
checkpoint goes on as the one that never parked. The logs mix every parked method (Queue's
produce, consume and reserve on a bounded and an unbounded queue, Lock.acquire reentrant
or not, Semaphore.acquire owned or not, LeaderElection.campaign), beside waits that are not
parked (a latch, a barrier, a read-write lock, an election's observe), with what ends or
disturbs a wait: releases of several permits, call timeouts and ticks, sessions that expire or close,
cancels, retries, objects deleted and made again, and checkpoints.
"""
from __future__ import annotations

import gc

from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from gesmas.objects import RESERVED_CLASSES, standard_sources
from gesmas.server.kernel import (Cancel, Checkpoint, CloseSession, Config, CreateObject,
                                  DeleteObject, ExpireSession, Invoke, Kernel, OpenSession,
                                  RegisterClass, Tick)
from gesmas.server.kernel.auth import SYSTEM
from gesmas.server.kernel.sched import Task

from kernel_harness import H, replay

CONFIG = Config(step_budget=50_000, reserved_classes=RESERVED_CLASSES)

# name -> (class, constructor args, [(method, how its args are made from x)])
OBJECTS = {
    "qb": ("Queue", [1], [("produce", lambda x: [x]), ("consume", lambda x: []),
                          ("reserve", lambda x: []), ("ack", lambda x: [x % 4 + 1]),
                          ("try_consume", lambda x: [])]),
    "qu": ("Queue", [], [("produce", lambda x: [x]), ("consume", lambda x: []),
                         ("reserve", lambda x: [])]),
    "lr": ("Lock", [True], [("acquire", lambda x: []), ("release", lambda x: []),
                            ("try_acquire", lambda x: [])]),
    "lx": ("Lock", [], [("acquire", lambda x: []), ("release", lambda x: [])]),
    "so": ("Semaphore", [2], [("acquire", lambda x: []), ("release", lambda x: [1 + x % 2])]),
    "su": ("Semaphore", [0, False], [("acquire", lambda x: []),
                                     ("release", lambda x: [1 + x % 3]),
                                     ("available", lambda x: [])]),
    "el": ("LeaderElection", [], [("campaign", lambda x: [x]), ("resign", lambda x: []),
                                  ("leader", lambda x: []), ("observe", lambda x: [0])]),
    # classes whose waits are not parked, beside them: a checkpoint keeps or unwinds an
    # object's waiters all or none, and these keep their greenlets
    "la": ("CountDownLatch", [2], [("wait", lambda x: []), ("count_down", lambda x: [])]),
    "ba": ("Barrier", [3], [("wait", lambda x: []), ("reset", lambda x: []),
                            ("abort", lambda x: [])]),
    "rw": ("ReadWriteLock", [], [("acquire_read", lambda x: []),
                                 ("release_read", lambda x: []),
                                 ("acquire_write", lambda x: []),
                                 ("release_write", lambda x: [])]),
}
NAMES = sorted(OBJECTS)
TIMEOUTS = st.sampled_from([None, None, None, 0, 1.0, 2.5, 10.0])
KINDS = ["call"] * 12 + ["tick"] * 2 + ["retry", "cancel", "open", "expire", "close",
                                        "delete", "create", "checkpoint"]
# (what, which object of the script's, which method, which session, a number, a timeout)
op = st.tuples(st.sampled_from(KINDS), st.sampled_from([0, 1]), st.sampled_from(range(5)),
               st.sampled_from([0, 1, 2]), st.sampled_from(range(8)), TIMEOUTS)
# each script calls one or two objects, so that their waits meet often
ops = st.tuples(st.lists(st.sampled_from(NAMES), min_size=1, max_size=2, unique=True),
                st.lists(op, min_size=10, max_size=60))


def build(script) -> list[tuple[int, object]]:
    log: list[tuple[int, object]] = []
    clock = 0.0
    sessions: list[int] = []
    seqs: dict[int, int] = {}
    invokes: list[Invoke] = []

    def add(cmd):
        log.append((len(log) + 1, cmd))

    for _, src in standard_sources():
        add(RegisterClass(ts=clock, source=src, user=SYSTEM))
    for name in NAMES:
        cls, args, _ = OBJECTS[name]
        add(CreateObject(ts=clock, tag=f"mk-{name}", class_name=cls, name=name, args=args))
    for n in range(4):
        add(OpenSession(ts=clock, tag=f"open{n}", ttl=30.0))
        sessions.append(log[-1][0])
    focus, script = script
    for n, (what, which, m, i, x, timeout) in enumerate(script):
        name = focus[which % len(focus)]
        tag = f"c{n}"
        sid = sessions[i % len(sessions)] if sessions else 999
        if what == "call":
            method, make = OBJECTS[name][2][m % len(OBJECTS[name][2])]
            seqs[sid] = seqs.get(sid, 0) + 1
            cmd = Invoke(ts=clock, tag=tag, session=sid, seq=seqs[sid], name=name,
                         method=method, args=make(x), timeout=timeout)
            invokes.append(cmd)
            add(cmd)
        elif what == "retry" and invokes:
            old = invokes[(8 * i + x) % len(invokes)]
            add(Invoke(ts=clock, tag=tag, session=old.session, seq=old.seq, name=old.name,
                       method=old.method, args=old.args, timeout=old.timeout))
        elif what == "cancel" and invokes:
            old = invokes[(8 * i + x) % len(invokes)]
            add(Cancel(ts=clock, tag=tag, session=old.session, seq=old.seq, call_tag=old.tag))
        elif what == "tick":
            clock += (0.5, 1.0, 2.0, 5.0)[x % 4]
            add(Tick(ts=clock))
        elif what == "open":
            add(OpenSession(ts=clock, tag=tag, ttl=30.0 if x % 2 else 3.0))
            sessions.append(log[-1][0])
        elif what in ("expire", "close") and sessions:
            kind = ExpireSession if what == "expire" else CloseSession
            add(kind(ts=clock, tag=tag, session=sid))
            sessions.remove(sid)
        elif what == "delete":
            add(DeleteObject(ts=clock, tag=tag, name=name))
        elif what == "create":
            cls, args, _ = OBJECTS[name]
            add(CreateObject(ts=clock, tag=tag, class_name=cls, name=name, args=args))
        elif what == "checkpoint":
            add(Checkpoint(ts=clock, tag=tag, defer=bool(x % 2), calls_apart=True,
                           listed_after=True, touched_in_parts=True,
                           hooked_touched=bool(x % 3), keep_gone=bool(x % 3)))
    clock += 100.0
    add(Tick(ts=clock))                          # times out what still can
    return log


def kernel(park: bool) -> Kernel:
    k = Kernel(CONFIG)
    k.runner.park = park
    return k


def charged(k: Kernel) -> dict[str, tuple[int, int]]:
    return {name: (rec.runs, rec.steps) for name, rec in k.state.objects.items()}


def steps(k: Kernel) -> dict[str, int]:
    return {name: rec.steps for name, rec in k.state.objects.items()}


def last_blob(log, k_park: Kernel, k_keep: Kernel) -> tuple[bytes, bytes]:
    end = Checkpoint(ts=0.0, tag="end", defer=False)
    index = log[-1][0] + 1
    k_park.apply(index, end)
    k_keep.apply(index, end)
    return k_park.checkpoint_blob, k_keep.checkpoint_blob


SETTINGS = settings(max_examples=50, deadline=None, database=None,
                    phases=[Phase.explicit, Phase.generate, Phase.shrink],
                    suppress_health_check=[HealthCheck.too_slow])


def _calls(name, *calls):
    """An explicit script: (method number, session number, x, timeout) per call on `name`,
    then a tick."""
    return ([name], [("call", 0, m, i, x, t) for m, i, x, t in calls] +
            [("tick", 0, 0, 0, 3, None)])


@SETTINGS
@given(ops)
# a reader granted by the writer's release: run again from its start, it would see the lock
# free and count itself in twice (why ReadWriteLock's waits are not parked)
@example(_calls("rw", (2, 0, 0, None), (0, 1, 0, None), (0, 2, 0, None), (3, 0, 0, None),
                (1, 1, 0, None)))
# the latch opened: run again, its wait would not take the permit handed to it
@example(_calls("la", (0, 0, 0, None), (0, 1, 0, 1.0), (1, 2, 0, None), (1, 2, 0, None)))
# a barrier reset while parties wait: run again, they would pass as a new round
@example(_calls("ba", (0, 0, 0, None), (0, 1, 0, None), (1, 2, 0, None), (0, 2, 0, None)))
# an election's observer woken by a new term: run again, it would not wait
@example(_calls("el", (0, 0, 1, None), (3, 1, 0, None), (0, 1, 2, None), (1, 0, 0, None)))
# a reentrant lock waited for twice by one session, and three permits released to two
# waiting acquires of an unowned semaphore
@example(_calls("lr", (0, 0, 0, None), (0, 1, 0, None), (0, 1, 0, 2.5), (1, 0, 0, None),
                (1, 1, 0, None)))
@example(_calls("su", (0, 0, 0, None), (0, 1, 0, None), (1, 2, 2, None), (2, 2, 0, None)))
# producers waiting on a full bounded queue, consumers and a reserve between them
@example(_calls("qb", (0, 0, 1, None), (0, 1, 2, None), (0, 2, 3, 1.0), (1, 0, 0, None),
                (2, 1, 0, None), (1, 2, 0, None), (3, 1, 1, None)))
def test_parking_or_keeping_greenlets_gives_the_same_run(script):
    log = build(script)
    k1, t1 = replay(log, kernel(True), encoded=True)
    k2, t2 = replay(log, kernel(False), encoded=True)
    assert t1 == t2
    assert k1.state_digest() == k2.state_digest()
    assert charged(k1) == charged(k2)
    assert k1.runner.order == k2.runner.order
    b1, b2 = last_blob(log, k1, k2)
    assert b1 == b2


@settings(SETTINGS, max_examples=30)
@given(ops, st.data())
def test_a_replica_restored_from_a_parking_kernel_goes_on_as_one_that_never_parked(script,
                                                                                  data):
    log = build(script)
    pos = data.draw(st.integers(1, len(log) - 1), label="checkpoint after entry")
    k1, _ = replay(log[:pos], kernel(True), encoded=True)
    index = log[pos - 1][0]
    ck = Checkpoint(ts=0.0, tag="ck", defer=False)
    shifted = [(i + 1, c) for i, c in log[pos:]]     # the checkpoint takes index + 1
    k1.apply(index + 1, ck)
    restored = Kernel.restore(k1.checkpoint_blob, CONFIG)
    r, rtrace = replay(shifted, restored, encoded=True)
    k2, t2 = replay(log[:pos] + [(index + 1, ck)] + shifted, kernel(False), encoded=True)
    assert rtrace == [(i, out) for i, out in t2 if i > index + 1]
    assert r.state_digest() == k2.state_digest()
    assert steps(r) == steps(k2)                     # runs are counted per process


# -- what parking is for, and where it must not apply ---------------------------------------

def _tasks() -> int:
    """Greenlets running a request that has not ended (a waiting one: idle workers, kept
    for the next runs, hold none)."""
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, Task) and not o.dead
               and getattr(o, "request", None) is not None)


def _standard(park: bool = True) -> H:
    h = H(Config(reserved_classes=RESERVED_CLASSES))
    h.kernel.runner.park = park
    for _, src in standard_sources():
        h.run(RegisterClass(ts=h.ts, source=src, user=SYSTEM))
    return h


def test_waiting_consumes_hold_no_greenlet_and_are_served_in_order():
    h = _standard()
    h.create("Queue", "q")
    s = h.open_session()
    before = _tasks()
    tags = [h.call(s, "q", "consume") for _ in range(200)]
    assert not any(h.done(t) for t in tags)
    waiting = h.kernel.runner.blocked()
    assert len(waiting) == 200 and all(r.task is None and r.parked for r in waiting)
    assert _tasks() == before
    for n in range(200):
        h.call(s, "q", "produce", n)
    assert [h.value(t) for t in tags] == list(range(200))
    assert _tasks() == before


def test_without_parking_each_waiting_call_holds_its_greenlet():
    """The comparison the property above makes is between two different things."""
    h = _standard(park=False)
    h.create("Queue", "q")
    s = h.open_session()
    before = _tasks()
    for _ in range(50):
        h.call(s, "q", "consume")
    assert _tasks() == before + 50
    assert all(r.task is not None for r in h.kernel.runner.blocked())


def test_a_granted_call_takes_the_permit_handed_to_it_not_a_free_one():
    """Three permits released to two parked acquires: each re-run takes its own permit,
    and the third stays free, as when the acquires resumed."""
    for park in (True, False):
        h = _standard(park)
        h.create("Semaphore", "s", 0, False)
        a, b, c = (h.open_session() for _ in range(3))
        ta, tb = h.call(a, "s", "acquire"), h.call(b, "s", "acquire")
        h.call(c, "s", "release", 3)
        assert h.value(ta) is True and h.value(tb) is True
        assert h.value(h.call(c, "s", "available")) == 1, park


def test_a_parked_wait_that_times_out_or_whose_session_ends_ends_as_it_would_unwind():
    outcomes = []
    for park in (True, False):
        h = _standard(park)
        h.create("Lock", "l")
        a, b, c = (h.open_session() for _ in range(3))
        h.value(h.call(a, "l", "acquire"))
        tb = h.call(b, "l", "acquire", timeout=1.0)
        tc = h.call(c, "l", "acquire")
        h.tick(h.ts + 2.0)
        h.apply(ExpireSession(ts=h.ts, tag="x", session=c))
        outcomes.append((h.error(tb), h.error(tc), h.kernel.state_digest()))
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][0].type == "Timeout" and outcomes[0][1].type == "SessionExpired"


def test_an_uploaded_class_naming_parked_methods_keeps_its_greenlets():
    """Only the reserved class names are trusted with `_parked`: an upload that lists a
    method whose code before its wait changes state must not be run again from its start."""
    h = _standard()
    h.register('''
class Gate:
    _parked = ("enter",)

    def __init__(self):
        self.sem = Semaphore(0)
        self.entered = 0

    def enter(self):
        self.entered += 1
        self.sem.acquire()
        return self.entered

    def open(self):
        self.sem.release()
''')
    h.create("Gate", "g")
    s = h.open_session()
    t = h.call(s, "g", "enter")
    assert all(r.task is not None and not r.parked for r in h.kernel.runner.blocked())
    h.call(s, "g", "open")
    assert h.value(t) == 1                     # entered once: not run again


def test_object_code_cannot_reach_a_semaphores_grant():
    h = _standard()
    got = h.register('''
class Thief:
    def __init__(self):
        self.sem = Semaphore(0)

    def steal(self):
        return self.sem._grant
''')
    if got.error is None:
        h.create("Thief", "t")
        s = h.open_session()
        assert h.error(h.call(s, "t", "steal")) is not None


def test_a_restored_replica_parks_the_waits_it_runs_again():
    h = _standard()
    h.create("Queue", "q")
    s = h.open_session()
    tags = [h.call(s, "q", "consume") for _ in range(20)]
    h.checkpoint()
    restored = Kernel.restore(h.kernel.checkpoint_blob, Config(reserved_classes=RESERVED_CLASSES))
    waiting = restored.runner.blocked()
    assert len(waiting) == 20 and all(r.task is None and r.parked for r in waiting)
    h2 = H(kernel=restored)
    h2.seqs = dict(h.seqs)
    h2._tags = h._tags
    h2.ts = h.ts
    for n in range(20):
        h2.call(s, "q", "produce", n)
    assert [h2.value(t) for t in tags] == list(range(20))


# -- workers: a request's greenlet runs the next request once it ended --------------------------

PROBE = ("def probe(n):\n    try:\n        return probe(n + 1)\n    except RecursionError:\n"
         "        return n\n"
         "class P:\n    def __init__(self):\n        self.w = Semaphore(0)\n"
         "    def deep(self):\n        return probe(0)\n"
         "    def wait_deep(self):\n        self.w.acquire()\n        return probe(0)\n"
         "    def go(self):\n        self.w.release()\n")


def test_a_worker_runs_the_next_request_at_the_same_depth():
    """A request that ended leaves its worker for the next: a new greenlet is not made for
    each call, and uploaded code meets RecursionError at the same depth in a new worker, in
    one reused, and in one resumed after a wait."""
    h = H()
    s = h.open_session()
    assert h.register(PROBE).error is None
    h.create("P", "p")
    runner = h.kernel.runner
    runner.workers.idle.clear()                         # the next call makes a new worker
    first = h.value(h.call(s, "p", "deep"))
    worker = runner.workers.idle[-1]
    again = [h.value(h.call(s, "p", "deep")) for _ in range(3)]
    assert runner.workers.idle[-1] is worker            # the same greenlet ran them
    waiting = h.call(s, "p", "wait_deep")         # holds that worker while it waits
    assert worker not in runner.workers.idle
    other = h.value(h.call(s, "p", "deep"))      # in another
    h.call(s, "p", "go")
    assert again == [first] * 3 and other == first and h.value(waiting) == first


def test_idle_workers_are_bounded_and_a_finished_waiter_returns_its_worker():
    from gesmas.server.kernel.workers import IDLE_WORKERS
    h = _standard()
    h.create("Queue", "q", 5)
    s = h.open_session()
    for n in range(5):
        h.call(s, "q", "produce", n)
    waits = [h.call(s, "q", "produce", 10 + n) for n in range(3)]  # full: parked
    assert all(r.task is None for r in h.kernel.runner.blocked())
    for _ in range(8):
        h.value(h.call(s, "q", "consume"))
    assert all(h.value(t) is None for t in waits)
    assert 1 <= len(h.kernel.runner.workers.idle) <= IDLE_WORKERS
    assert all(w.request is None and not w.dead for w in h.kernel.runner.workers.idle)


def test_a_kernel_applied_from_another_thread_makes_workers_there():
    """Greenlets belong to the thread that made them: a kernel applied by one thread, then
    by another (a restore, then the apply thread), does not switch to the first's workers."""
    import threading
    h = _standard()
    h.create("Queue", "q")
    s = h.open_session()
    h.value(h.call(s, "q", "size"))
    assert h.kernel.runner.workers.idle
    got = []
    t = threading.Thread(target=lambda: got.append(h.value(h.call(s, "q", "size"))))
    t.start()
    t.join()
    assert got == [0]
    assert h.value(h.call(s, "q", "size")) == 0      # and back


# -- a kernel that is dropped lets its memory go ------------------------------------------------

def test_a_closed_kernel_is_freed_with_its_parked_waiters():
    """CPython's collector never frees a suspended greenlet, and a runner's launcher and
    idle workers refer to it: a kernel replaced by a snapshot's would stay in memory, state
    and all, unless closed."""
    import weakref
    h = _standard()
    h.create("Queue", "q")
    s = h.open_session()
    for _ in range(5):
        h.call(s, "q", "consume")
    h.value(h.call(s, "q", "size"))
    k = weakref.ref(h.kernel)
    assert h.kernel.runner.workers.idle and h.kernel.runner.workers._launch is not None
    h.kernel.close()
    del h
    gc.collect()
    assert k() is None


def test_the_applier_closes_the_state_machine_a_snapshot_replaces():
    from gesmas.server.replication.applier import Applier

    class SM:
        checkpoint_index = None
        checkpoint_blob = None
        made: list = []

        def __init__(self):
            self.closed = False
            SM.made.append(self)

        def apply(self, index, data):
            return []

        def capture_some(self, limit):
            return False

        @staticmethod
        def is_checkpoint(data):
            return False

        def close(self):
            self.closed = True

    a = Applier(SM, lambda blob: SM(), lambda out: None)
    a.apply(1, b"x")
    payload, _ = a.snapshot(1)
    b = Applier(SM, lambda blob: SM(), lambda out: None)
    old = b.sm
    b.load(payload, 1)
    assert b.sm is not old and old.closed and not b.sm.closed


def test_a_waiter_ended_for_good_ends_its_worker():
    """Ended for good (here: it caught Interrupted and waited again), a call's worker ends
    with it, even where its code catches BaseException: object code cannot catch the
    GreenletExit that ends it (had it returned, its worker would wait for another run,
    holding the request)."""
    h = H()
    s = h.open_session()
    h.register('''
class Stubborn:
    def __init__(self):
        self.s = Semaphore(0)

    def wait(self):
        while True:
            try:
                return self.s.acquire()
            except Interrupted:
                pass
            except BaseException:
                return "swallowed"
''')
    h.create("Stubborn", "st")
    before = _tasks()
    t = h.call(s, "st", "wait")
    assert _tasks() == before + 1
    h.checkpoint(defer=False)
    assert h.error(t).type == "Interrupted"
    assert _tasks() == before


def test_another_process_replays_parked_calls_to_the_same_state():
    """The same log, with parked calls granted, timed out and interrupted, replayed in another
    process (other addresses, another hash seed): the same completions, digest and
    checkpoint bytes."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys; sys.path.insert(0, %r); import test_parked as t; "
            "print(t._replayed())" % str(Path(__file__).resolve().parent))
    here = _replayed()
    for seed in ("0", "4242"):
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env=dict(os.environ, PYTHONHASHSEED=seed), timeout=120)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == here


def _replayed() -> str:
    """Digest, completions and final checkpoint of a fixed log that parks, as text."""
    import hashlib
    calls = [("call", 0, m, i, x, t) for m, i, x, t in
             [(0, 0, 1, None), (0, 1, 2, None), (1, 2, 0, 1.0), (1, 0, 0, None),
              (2, 1, 0, None), (0, 2, 3, 2.5), (1, 1, 0, None), (3, 0, 1, None)]]
    script = (["qb", "lr"], calls + [("checkpoint", 1, 0, 0, 1, None)] +
              [(k, 1 - w, m, i, x, t) for k, w, m, i, x, t in calls] +
              [("tick", 0, 0, 0, 3, None), ("expire", 0, 0, 1, 0, None)])
    log = build(script)
    k, trace = replay(log, kernel(True), encoded=True)
    end = Checkpoint(ts=0.0, tag="end", defer=False)
    k.apply(log[-1][0] + 1, end)
    return " ".join([k.state_digest(), hashlib.sha256(repr(trace).encode()).hexdigest(),
                     hashlib.sha256(k.checkpoint_blob).hexdigest(),
                     str(sum(1 for _, out in trace for _ in out))])

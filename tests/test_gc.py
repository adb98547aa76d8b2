"""The collector policy of a replica (gesmas.server.main.tune_gc): what survives a middle pass
is frozen out of every later pass, so nothing the kernel leaves behind may be a cycle (a
frozen cycle is never collected)."""
from __future__ import annotations

import collections
import gc
import subprocess
import sys
import weakref

from gesmas.server.kernel import DeleteObject, RegisterClass
from gesmas.server.kernel import untracked
from gesmas.server.kernel.auth import SYSTEM

from test_objects import OH


def unreachable_after(run, detail=False) -> list[str]:
    """Run `run()` with everything made before it frozen; the types of the objects a full
    pass over everything then finds unreachable (what freezing would have kept for good)."""
    gc.collect()
    gc.freeze()
    try:
        run()
    finally:
        gc.unfreeze()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        return [type(o).__name__ + ((" " + getattr(o, "label", "") + " " + str(getattr(o, "tags", ""))
                                     + " " + str(getattr(getattr(o, "outcome", None), "type", "")))
                                    if detail and type(o).__name__ == "Request" else "")
                for o in gc.garbage]
    finally:
        gc.garbage.clear()
        gc.set_debug(0)


def test_calls_that_waited_while_frozen_leave_no_cycle_when_they_end():
    """Waiting calls frozen (as a middle pass freezes them), then ended every way a wait ends:
    granted, timed out, cancelled, their session expired, interrupted by a checkpoint (an
    uploaded class's waiters), their object deleted."""
    src = """
class Gate:
    def __init__(self):
        self.s = Semaphore(0)
    def wait(self):
        self.s.acquire()
        return "through"
    def open(self, n):
        self.s.release(n)
"""
    h = OH()
    assert h.run(RegisterClass(ts=h.ts, source=src, user=SYSTEM)).error is None
    a, b, c, d = h.sessions(4)
    h.make("Queue", "q")
    h.make("Lock", "l")
    h.make("Gate", "g")
    h.make("Queue", "gone")
    consumers = [h.call((a, b)[i % 2], "q", "consume") for i in range(300)]
    timed = [h.call(a, "q", "consume", timeout=1.0) for _ in range(50)]
    h.ok(c, "l", "acquire")
    lockers = [(h.seqs[c] + 1, h.call(c, "l", "acquire", timeout=60)) for _ in range(20)]
    gated = [h.call(a, "g", "wait") for _ in range(50)]
    doomed = [h.call(d, "q", "consume") for _ in range(50)]
    deleted = [h.call(b, "gone", "consume") for _ in range(20)]

    def end_them():
        for i in range(300):
            h.ok(b, "q", "produce", i)
        h.tick(h.ts + 2)                          # the timed ones time out
        from gesmas.server.kernel import Cancel
        for seq, t in lockers:                    # every locker withdraws its wait
            h.run(Cancel(ts=h.ts, session=c, seq=seq, call_tag=t))
        h.checkpoint()                            # the Gate's waiters re-run
        h.ok(c, "g", "open", 50)
        from gesmas.server.kernel import ExpireSession
        h.apply(ExpireSession(ts=h.ts, tag=h.tag(), session=d))    # its waits end
        from gesmas.server.kernel import DeleteObject
        h.run(DeleteObject(ts=h.ts, name="gone"))
        h.ok(c, "l", "release")
        h.kernel.checkpoint_blob
    found = unreachable_after(end_them, detail=True)
    groups = {"consumers": consumers, "timed": timed, "gated": gated, "deleted": deleted,
              "doomed": doomed, "lockers": [t for _, t in lockers]}
    assert {k: sum(not h.done(t) for t in v) for k, v in groups.items()} == \
        dict.fromkeys(groups, 0)
    assert not found, collections.Counter(found).most_common(8)


def test_a_replica_freezes_what_survives_a_middle_pass():
    code = """
import gc
from gesmas.server.kernel import untracked
from gesmas.server.main import tune_gc, GC_THRESHOLDS
assert not untracked.enabled()                # off unless a replica's policy turns it on
tune_gc()
assert gc.get_threshold() == GC_THRESHOLDS, gc.get_threshold()
before = gc.get_freeze_count()
keep = [[i] for i in range(200_000)]          # lives through young and middle passes
print(gc.get_freeze_count() - before >= 150_000, untracked.enabled())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True True"
    off = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env={**__import__("os").environ, "GESMAS_GC_FREEZE": "0"})
    assert off.stdout.strip() == "False False", off.stderr


def _capture_run(on: bool):
    """Counters and Queues through two checkpoints and their captures, a Queue with a waiting
    consumer among them (its instance is kept, not replaced); untracking on or off."""
    was = untracked.enabled()
    untracked.enable(on)
    try:
        h = OH()
        s, t = h.sessions(2)
        for i in range(30):
            h.make("Counter", f"c{i}")
            h.ok(s, f"c{i}", "add", i)
        h.make("Queue", "q")
        h.ok(s, "q", "produce", [1, {"a": (2, 3)}])
        h.make("Queue", "held")
        waiting = h.call(t, "held", "consume")
        blobs = []
        for round_ in range(2):
            h.checkpoint()
            while h.kernel.capture_some(7):
                pass
            blobs.append(h.kernel.checkpoint_blob)
            for i in range(0, 30, 3):
                h.ok(s, f"c{i}", "add", round_ + 1)
        h.ok(s, "held", "produce", "x")
        assert h.done(waiting)
        return h, blobs
    finally:
        untracked.enable(was)


def test_a_capture_untracks_what_it_keeps_and_nothing_else_changes():
    """kernel/untracked.py: a saved object's copy and its size entry leave the collector's
    lists as they are made (what freezing would do after two passes); the blobs, values and
    state are those of a kernel that does not untrack."""
    on, blobs_on = _capture_run(True)
    off, blobs_off = _capture_run(False)
    assert blobs_on == blobs_off and all(blobs_on)
    assert on.kernel.state_digest() == off.kernel.state_digest()
    objects = on.kernel.state.objects
    assert not any(gc.is_tracked(objects[f"c{i}"].instance) for i in range(30))
    assert not gc.is_tracked(objects["q"].instance)
    assert all(gc.is_tracked(off.kernel.state.objects[f"c{i}"].instance) for i in range(30))
    sizes = on.kernel.checkpoints.deferred.sizes_next
    assert sizes and not any(gc.is_tracked(e) for e in sizes.values() if e is not None)
    # the Queue a consumer waited on through both captures kept its live instance (`keep`):
    # not a copy, so left as it was
    assert gc.is_tracked(objects["held"].instance)
    s, = on.sessions(1)
    assert on.ok(s, "q", "consume") == [1, {"a": [2, 3]}]
    assert on.ok(s, "c3", "get") == 3 + 1 + 2


def test_an_untracked_copy_is_freed_when_its_object_goes():
    was = untracked.enabled()
    untracked.enable(True)
    try:
        h = OH()
        h.make("Counter", "gone")
        h.checkpoint()
        while h.kernel.capture_some(10):
            pass
        inst = h.kernel.state.objects["gone"].instance
        assert not gc.is_tracked(inst)
        ref = weakref.ref(inst)
        del inst
        h.kernel.checkpoints.deferred.sizes_next.clear()   # the size entry holds its record
        assert h.run(DeleteObject(ts=h.ts, tag=h.tag(), name="gone")).error is None
        assert ref() is None                          # reference counting, no pass needed
    finally:
        untracked.enable(was)

"""Property tests of the kernel: determinism and checkpoint transparency.

Random command sequences over a bounded buffer whose put/get block (with acquire timeouts and
call timeouts), ticks, sessions that open, expire and close, retries of earlier calls (while
they wait and after they finished), acknowledgements, cancels, and deleting / re-creating the
object.

Commands take even log indices, so a Checkpoint can be slipped in at an odd index without
renumbering anything (session ids are log indices).

  A. Two fresh kernels fed the same log (one as bytes, one as dataclasses) give identical
     completions and the same state_digest().
  B. A Checkpoint at any position changes no other completion, and leaves the same digest.
  C. Restoring from that checkpoint's blob and applying the rest of the log gives the same
     completions after the checkpoint and the same final digest.
  G. ... and, with checkpoints as the leader proposes them, the next checkpoint the same
     bytes as the live replica's.

Each runs twice: on an uploaded class (a checkpoint interrupts and re-runs its waiters) and
on the standard bounded Queue registered as the replicas do (a checkpoint leaves its waiters
in place; only a restored kernel re-runs them).
"""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from gesmas.server.kernel import (Cancel, Checkpoint, encode, CloseSession, Config, CreateObject,
                                  DeleteObject, ExpireSession, Invoke, Kernel, OpenSession,
                                  Query, RegisterClass, Tick)

from gesmas.objects import RESERVED_CLASSES, standard_sources
from gesmas.server.kernel.auth import SYSTEM

from kernel_harness import replay

CONFIG = Config(step_budget=50_000, reserved_classes=RESERVED_CLASSES)
QUEUE = dict(standard_sources())["queue"]
# subject -> (class source, registering user, class, method for put / get / peek, put's args)
SUBJECTS = {
    "uploaded": ("", "Buffer", {"put": "put", "get": "get", "peek": "peek"}),
    "standard": (SYSTEM, "Queue", {"put": "produce", "get": "consume", "peek": "size"}),
}

BUFFER = '''
class Buffer:
    def __init__(self, cap):
        self.items = []
        self.free = Semaphore(cap)
        self.full = Semaphore(0)
        self.ended = []

    def put(self, x, t=None):
        self.free.acquire(t)
        self.items.append(x)
        self.full.release()
        return [len(self.items), context().request]

    def get(self, t=None):
        self.full.acquire(t)
        x = self.items.pop(0)
        self.free.release()
        return [x, context().now(), context().random()]

    def peek(self):
        return {"items": self.items, "free": self.free.value, "full": self.full.value,
                "waiting": [self.free.waiters, self.full.waiters], "ended": self.ended}

    def _on_session_end(self, session):
        self.ended.append(session)
'''

TIMEOUTS = st.sampled_from([None, None, None, None, 0, 1.0, 2.5, 10.0])

# put and get dominate so that requests pile up; the rest disturbs them
KINDS = (["put"] * 5 + ["get"] * 6 + ["retry"] * 2 + ["tick"] * 2
         + ["open", "expire", "close", "ack", "cancel", "delete", "create", "create", "peek",
            "stats"])
op = st.tuples(st.sampled_from(KINDS), st.integers(0, 63), st.integers(0, 99), TIMEOUTS,
               TIMEOUTS)
# each op: (what, time step before it, whether its timestamp lags the clock)
ops = st.lists(st.tuples(op, st.sampled_from([0.0, 0.0, 0.25, 1.0]), st.booleans()),
               min_size=8, max_size=40)


def build(script, subject: str = "uploaded") -> list[tuple[int, object]]:
    """Turn abstract ops into a log: [(index, command)], indices 2, 4, 6 ..."""
    user, cls, methods = SUBJECTS[subject]
    source = BUFFER if subject == "uploaded" else QUEUE
    log: list[tuple[int, object]] = []
    clock = 0.0
    sessions: list[int] = []          # open, in opening order
    seqs: dict[int, int] = {}
    acks: dict[int, int] = {}
    invokes: list[Invoke] = []

    def add(cmd):
        log.append((2 * (len(log) + 1), cmd))

    add(RegisterClass(ts=clock, tag="reg", source=source, user=user))
    add(CreateObject(ts=clock, tag="mk", class_name=cls, name="buf", args=[1]))
    for n in range(3):
        add(OpenSession(ts=clock, tag=f"open{n}", ttl=30.0))
        sessions.append(log[-1][0])

    for n, ((what, i, x, t1, t2), dt, lag) in enumerate(script):
        clock += dt
        ts = clock - 0.75 if lag else clock       # an older timestamp must not move time back
        tag = f"c{n}"
        sid = sessions[i % len(sessions)] if sessions else 999
        if what == "open":
            add(OpenSession(ts=ts, tag=tag, ttl=30.0 if x % 2 else 3.0))
            sessions.append(log[-1][0])
        elif what in ("expire", "close"):
            kind = ExpireSession if what == "expire" else CloseSession
            add(kind(ts=ts, tag=tag, session=sid))
            if sid in sessions:
                sessions.remove(sid)
        elif what in ("put", "get", "peek"):
            seqs[sid] = seqs.get(sid, 0) + 1
            if subject == "uploaded":
                args = {"put": [x, t1], "get": [t1], "peek": []}[what]
            else:                                  # the Queue has no acquire timeouts
                args = {"put": [x], "get": [], "peek": []}[what]
            cmd = Invoke(ts=ts, tag=tag, session=sid, seq=seqs[sid], ack=acks.get(sid, 0),
                         class_name=cls if n % 3 == 0 else "", name="buf",
                         method=methods[what], args=args,
                         timeout=None if what == "peek" else t2)
            if what != "peek":
                invokes.append(cmd)
            add(cmd)
        elif what == "retry" and invokes:
            old = invokes[i % len(invokes)]
            add(Invoke(ts=ts, tag=tag, session=old.session, seq=old.seq,
                       ack=acks.get(old.session, 0), class_name=old.class_name, name=old.name,
                       method=old.method, args=old.args, timeout=old.timeout))
        elif what == "ack":
            acks[sid] = min(seqs.get(sid, 0), acks.get(sid, 0) + 1 + x % 3)
            add(Tick(ts=ts))
        elif what == "cancel" and invokes:
            old = invokes[i % len(invokes)]
            add(Cancel(ts=ts, tag=tag, session=old.session, seq=old.seq, call_tag=old.tag))
        elif what == "tick":
            clock += (0.5, 1.0, 2.0, 5.0)[x % 4]
            add(Tick(ts=clock))
        elif what == "delete":
            add(DeleteObject(ts=ts, tag=tag, name="buf"))
        elif what == "create":
            add(CreateObject(ts=ts, tag=tag, class_name=cls, name="buf", args=[1 + x % 2],
                             measured=x % 3 == 0))        # version 8: measured as made
        else:
            add(Query(ts=ts, tag=tag, what="stats"))
    clock += 100.0
    add(Tick(ts=clock))                            # time out whatever still can
    return log


#: how a checkpoint writes its waiting calls and deferred objects: (calls_apart,
#: listed_after): in the header (formats 4 and 5), apart (6), listed after the frames (7)
# (calls_apart, listed_after, touched_in_parts, hooked_touched): formats 5 or older, 6, 7
# and 8, and 8 after which sessions remember only hooked objects (and the names of objects
# gone, version 10's keep_gone, drawn with it) (which the state digest
# does not see: it hashes what sessions remember as what their end acts on)
FORMS = st.sampled_from([(False, False, False, False), (True, False, False, False),
                         (True, True, False, False), (True, True, True, False),
                         (True, True, True, True)])
LEADER = (True, True, True, True)        # what the leader proposes (duties.py)
FORM = "calls apart, listed after, in parts, hooked"


def with_checkpoint(log, pos: int, defer: bool = False,
                    form: tuple[bool, bool, bool, bool] = (False, False, False, False)):
    """The log with a Checkpoint before its entry `pos` (the last entry is a Tick, so every
    interesting position is covered and the final index is the same)."""
    index = 2 * pos + 1
    ckpt = Checkpoint(ts=0.0, tag="ckpt", defer=defer, calls_apart=form[0],
                      listed_after=form[1], touched_in_parts=form[2], hooked_touched=form[3],
                      keep_gone=form[3])
    return log[:pos] + [(index, ckpt)] + log[pos:], index


def run(log, encoded=False):
    return replay(log, Kernel(CONFIG), encoded=encoded)


def drop(trace, index):
    return [(i, out) for i, out in trace if i != index]


def without_checkpoint_index(trace):
    """Query('stats') reports the last checkpoint's index, which a checkpoint does change."""
    def norm(c):
        if isinstance(c.value, dict) and "checkpoint_index" in c.value:
            return type(c)(c.tag, {k: v for k, v in c.value.items() if k != "checkpoint_index"},
                           c.error)
        return c
    return [(i, [norm(c) for c in out]) for i, out in trace]


# no database (nothing written into the repository) and no "explain" phase (slow)
SETTINGS = settings(max_examples=50, deadline=None, database=None,
                    phases=[Phase.explicit, Phase.generate, Phase.shrink],
                    suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("subject", list(SUBJECTS))
@SETTINGS
@given(ops)
def test_a_same_log_same_completions_and_digest(subject, script):
    log = build(script, subject)
    k1, t1 = run(log, encoded=True)
    k2, t2 = run(log, encoded=False)
    assert t1 == t2
    assert k1.state_digest() == k2.state_digest()
    tags = [c.tag for _, out in t1 for c in out]
    assert len(tags) == len(set(tags)), "a tag completed twice"


@pytest.mark.parametrize("subject", list(SUBJECTS))
@SETTINGS
@given(ops, st.data())
def test_b_checkpoint_changes_no_completion_nor_the_final_digest(subject, script, data):
    log = build(script, subject)
    base_k, base = run(log)
    pos = data.draw(st.integers(0, len(log) - 1), label="checkpoint before entry")
    ck_log, ck_index = with_checkpoint(log, pos, data.draw(st.booleans(), label="defer"),
                                       data.draw(FORMS, label=FORM))
    k, trace = run(ck_log)
    ck_out = dict(trace)[ck_index]
    assert [c.tag for c in ck_out] == ["ckpt"] and ck_out[0].error is None
    assert without_checkpoint_index(drop(trace, ck_index)) == without_checkpoint_index(base)
    assert k.checkpoint_index == ck_index
    assert k.state_digest() == base_k.state_digest()


@pytest.mark.parametrize("subject", list(SUBJECTS))
def test_b_the_hooked_rule_set_between_a_deletion_and_the_object_made_again(subject):
    """A case test_b found: calls on the object, its deletion, a checkpoint that sets the
    hooked-only rule (LEADER), more calls, the object made again. The rule's checkpoint made
    the sessions forget the deleted name, so the object made again had no longer their
    hooks, and the digest changed; a gone name is now kept, as without the rule."""
    put = (("put", 0, 0, None, None), 0.0, False)
    script = [put] * 18 + [(("delete", 0, 0, None, None), 0.0, False)] + [put] * 9 + \
        [(("create", 0, 0, None, None), 0.0, False)]
    log = build(script, subject)
    base_k, base = run(log)
    for pos in range(20, len(log)):
        ck_log, ck_index = with_checkpoint(log, pos, False, LEADER)
        k, trace = run(ck_log)
        assert without_checkpoint_index(drop(trace, ck_index)) == \
            without_checkpoint_index(base), pos
        assert k.state_digest() == base_k.state_digest(), pos   # Buffer.ended included


@pytest.mark.parametrize("subject", list(SUBJECTS))
@SETTINGS
@given(ops, st.data())
def test_c_restore_and_reapply_gives_same_completions_and_digest(subject, script, data):
    log = build(script, subject)
    pos = data.draw(st.integers(0, len(log) - 1), label="checkpoint before entry")
    ck_log, ck_index = with_checkpoint(log, pos, data.draw(st.booleans(), label="defer"),
                                       data.draw(FORMS, label=FORM))
    k, trace = run(ck_log)
    assert k.checkpoint_index == ck_index
    restored = Kernel.restore(k.checkpoint_blob, CONFIG)
    assert restored.index == ck_index
    rest = [(i, c) for i, c in ck_log if i > ck_index]
    r, rtrace = replay(rest, restored)
    assert rtrace == [(i, out) for i, out in trace if i > ck_index]
    assert r.state_digest() == k.state_digest()


@SETTINGS
@given(ops, st.data())
def test_d_keeping_the_standard_waiters_or_unwinding_them_gives_the_same_run(script, data):
    """What a replica that keeps the Queue's waiters through a checkpoint and one that
    unwinds and re-runs them (an older gesmas, or no reserved names) compute is the same."""
    log = build(script, "standard")
    pos = data.draw(st.integers(0, len(log) - 1), label="checkpoint before entry")
    ck_log, _ = with_checkpoint(log, pos)
    k1, t1 = replay(ck_log, Kernel(CONFIG))
    k2, t2 = replay(ck_log, Kernel(Config(step_budget=50_000)))
    assert t1 == t2
    assert k1.state_digest() == k2.state_digest()


@pytest.mark.parametrize("subject", list(SUBJECTS))
@SETTINGS
@given(ops, st.data())
def test_g_a_restored_replicas_next_checkpoint_is_the_live_replicas_bytes(subject, script, data):
    """With checkpoints as the leader proposes them (format 8), a replica restored from the
    first checkpoint and fed the rest of the log writes the second one byte for byte as the
    replica that never restarted: DESIGN §5's contract, every replica's checkpoint at K the
    same bytes, holds across a restart too (block numbers and waiters kept in place
    included)."""
    log = build(script, subject)
    p1 = data.draw(st.integers(0, len(log) - 2), label="first checkpoint before entry")
    p2 = data.draw(st.integers(p1 + 1, len(log) - 1), label="second checkpoint before entry")
    leader = dict(defer=True, calls_apart=True, listed_after=True, touched_in_parts=True,
                  hooked_touched=True, keep_gone=True)
    one, i1 = with_checkpoint(log, p1, True, LEADER)
    i2 = 2 * p2 + 1
    two = sorted(one + [(i2, Checkpoint(ts=0.0, tag="ckpt2", **leader))], key=lambda e: e[0])
    k, trace = replay(two, Kernel(CONFIG), encoded=True)    # as the log holds them
    restored = Kernel.restore(_blob_at(two, i1), CONFIG)
    r, rtrace = replay([(i, c) for i, c in two if i > i1], restored, encoded=True)
    assert rtrace == [(i, out) for i, out in trace if i > i1]
    assert r.checkpoint_index == k.checkpoint_index == i2
    assert r.checkpoint_blob == k.checkpoint_blob
    assert r.state_digest() == k.state_digest()


def _blob_at(log, index):
    """The checkpoint blob a kernel fed `log` writes at `index`."""
    k = Kernel(CONFIG)
    for i, cmd in log:
        if i > index:
            break
        k.apply(i, encode(cmd))
    return k.checkpoint_blob

def _stale_frames(k: Kernel) -> list[str]:
    """The objects whose checkpoint frame (State.frames) no longer holds their state: each
    frame's state pickle, loaded, is compared by value with the live instance."""
    import pickle
    from gesmas.server.kernel.checkpoint import unpickle_state
    from gesmas.server.kernel.sched import SAVING
    ck, st = k.checkpoints, k.state
    assert list(st.frames) == list(st.objects), "frames out of the objects' order"
    stale = []
    saving = SAVING.set(True)          # semaphores as a checkpoint writes them: no waiters
    try:
        _check_frames(ck, st, stale)
    finally:
        SAVING.reset(saving)
    return stale


def _check_frames(ck, st, stale):
    import pickle
    from gesmas.server.kernel.checkpoint import unpickle_state
    for name, rec in st.objects.items():
        frame = st.frames[name]
        if frame is None:
            continue                     # made or changed since: saved by the next checkpoint
        if name not in ck.runner.changed:
            _, _, _, data, owner, size = pickle.loads(frame)
            loaded = unpickle_state(ck.registry, data)
            if (ck._part_bytes(loaded, 1 << 22) != ck._part_bytes(rec.instance, 1 << 22)
                    or (owner, size) != (rec.owner, rec.size)):
                stale.append(name)


@pytest.mark.parametrize("subject", list(SUBJECTS))
@SETTINGS
@given(ops, st.data())
def test_e_incremental_checkpoints_keep_every_frame_fresh(subject, script, data):
    """Checkpoints save only the objects changed since the last one: after every entry of a
    log with two checkpoints, each object not marked changed has a frame that loads to its
    live state; a replica restored from the first checkpoint holds the same frames."""
    log = build(script, subject)
    p1 = data.draw(st.integers(0, len(log) - 2), label="first checkpoint before entry")
    p2 = data.draw(st.integers(p1 + 1, len(log) - 1), label="second checkpoint before entry")
    one, i1 = with_checkpoint(log, p1)
    two = sorted(one + [(2 * p2 + 1, Checkpoint(ts=0.0, tag="ckpt2"))], key=lambda e: e[0])
    k = Kernel(CONFIG)
    blobs = {}
    for index, cmd in two:
        k.apply(index, encode(cmd))
        assert _stale_frames(k) == [], f"after entry {index}"
        if isinstance(cmd, Checkpoint):
            blobs[index] = k.checkpoint_blob
    restored = Kernel.restore(blobs[i1], CONFIG)
    for index, cmd in two:
        if index > i1:
            restored.apply(index, encode(cmd))
            assert _stale_frames(restored) == [], f"restored, after entry {index}"
    assert restored.state_digest() == k.state_digest()
    # the objects' frames are the same bytes (the rest of the blob is not compared: these
    # format-4 checkpoints pickle the sessions with a memo, which differs on a restored
    # replica; test_g compares whole blobs of the format the leader proposes)
    assert restored.state.frames == k.state.frames


@pytest.mark.parametrize("subject", list(SUBJECTS))
@SETTINGS
@given(ops, st.data())
def test_f_a_deferred_capture_is_the_same_whenever_its_slices_run(subject, script, data):
    """kernel/capture.py: a deferred checkpoint saves the standard classes' objects after its
    entry, in idle slices or just before they change. Whenever the slices run (drawn between
    entries), every completion, the digest after every entry and each checkpoint's bytes are
    those of a kernel that saves everything right after the checkpoint's entry; a replica
    restored from the first blob goes on like the live one, to the same frames."""
    from gesmas.server.kernel.capture import PendingBlob
    log = build(script, subject)
    p1 = data.draw(st.integers(0, len(log) - 2), label="first checkpoint before entry")
    p2 = data.draw(st.integers(p1 + 1, len(log) - 1), label="second checkpoint before entry")
    form = data.draw(FORMS, label=FORM)
    one, i1 = with_checkpoint(log, p1, defer=True, form=form)
    two = sorted(one + [(2 * p2 + 1, Checkpoint(ts=0.0, tag="ckpt2", defer=True,
                                                calls_apart=form[0], listed_after=form[1],
                                                touched_in_parts=form[2],
                                                hooked_touched=form[3],
                                                keep_gone=form[3]))],
                 key=lambda e: e[0])

    def run_two(slices):
        k, trace, digests, results = Kernel(CONFIG), [], [], {}
        for n, (index, cmd) in enumerate(two):
            trace.append((index, k.apply(index, encode(cmd))))
            if isinstance(cmd, Checkpoint):
                results[index] = k.checkpoint_result
            if slices is None:
                k.checkpoint_blob                  # finishes any open capture at once
            elif slices[n]:
                k.capture_some(slices[n])
            digests.append(k.state_digest())
        blobs = {i: r.result() if isinstance(r, PendingBlob) else r for i, r in results.items()}
        return k, trace, digests, blobs

    eager = run_two(None)
    slices = data.draw(st.lists(st.sampled_from([0, 0, 0, 1, 2]), min_size=len(two),
                                max_size=len(two)), label="idle slices after each entry")
    lazy = run_two(slices)
    assert lazy[1] == eager[1]
    assert lazy[2] == eager[2]
    assert lazy[3] == eager[3]
    k, blobs = lazy[0], lazy[3]
    k.checkpoint_blob
    for at in (i1, 2 * p2 + 1):    # the second one's blob: with the sizes it still applies
        restored = Kernel.restore(blobs[at], CONFIG)
        rest = [(i, c) for i, c in two if i > at]
        r, rtrace = replay(rest, restored)
        assert rtrace == [(i, out) for i, out in lazy[1] if i > at]
        assert r.state_digest() == k.state_digest()
        r.checkpoint_blob                          # its capture finished
        assert r.state.frames == k.state.frames
        # (a user whose counts all went back to 0 keeps an empty entry on the live kernel)
        assert {u: c for u, c in r.state.usage.counts.items() if c} == \
            {u: c for u, c in k.state.usage.counts.items() if c}
        assert {n: o.size for n, o in r.state.objects.items()} == \
            {n: o.size for n, o in k.state.objects.items()}

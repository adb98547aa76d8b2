"""Tests of the linearizability checker (tests/lincheck.py) itself."""
from __future__ import annotations

import itertools
import math
import threading
from collections import deque

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

try:
    from tests.lincheck import (UNKNOWN, CounterModel, HistoryRecorder, LockModel, Op,
                                QueueModel, SemaphoreModel, check, check_queue_exactly_once)
except ImportError:  # tests/ is not a package: pytest puts tests/ itself on sys.path
    from lincheck import (UNKNOWN, CounterModel, HistoryRecorder, LockModel, Op,
                          QueueModel, SemaphoreModel, check, check_queue_exactly_once)

INF = math.inf


def op(client, kind, inp, out, call, ret, status="ok", key="k"):
    if status == "unknown":
        ret = INF
    return Op(client, key, call, ret, kind, tuple(inp), out, status)


def verdict(history, model, **kw):
    return check(history, model, **kw).verdict


# ---------------------------------------------------------------- lock

def test_lock_two_overlapping_holders_is_violation():
    h = [op(1, "acquire", (), 1, 0, 1), op(2, "acquire", (), 2, 2, 3),
         op(1, "release", (), None, 4, 5), op(2, "release", (), None, 6, 7)]
    r = check(h, LockModel())
    assert r.verdict == "violation" and r.key == "k"
    assert "c2 acquire() -> 2" in r.explanation


def test_lock_handoff_ok_including_overlapping_release_and_acquire():
    h = [op(1, "acquire", (), 3, 0, 1), op(1, "release", (), None, 4, 6),
         op(2, "acquire", (), 7, 5, 7), op(2, "release", (), None, 8, 9)]
    assert verdict(h, LockModel()) == "ok"


def test_lock_fence_must_increase():
    h = [op(1, "acquire", (), 5, 0, 1), op(1, "release", (), None, 2, 3),
         op(2, "acquire", (), 5, 4, 5)]
    assert verdict(h, LockModel()) == "violation"


def test_lock_release_by_non_holder_is_violation():
    h = [op(1, "acquire", (), 1, 0, 1), op(2, "release", (), None, 2, 3)]
    assert verdict(h, LockModel()) == "violation"


def test_lock_try_acquire_and_expire():
    h = [op(1, "acquire", (), 1, 0, 1), op(2, "try_acquire", (), None, 2, 3),
         op(1, "expire", (), None, 4, 5), op(2, "try_acquire", (), 9, 6, 7)]
    assert verdict(h, LockModel()) == "ok"
    h.append(op(3, "try_acquire", (), None, 5.5, 5.8))  # after the expiry: lock was free
    assert verdict(h, LockModel()) == "violation"


def test_lock_unknown_acquire_may_or_may_not_have_happened():
    took = [op(1, "acquire", (), None, 0, 0, "unknown"), op(1, "release", (), None, 2, 3)]
    assert verdict(took, LockModel()) == "ok"
    not_took = [op(1, "acquire", (), None, 0, 0, "unknown"),
                op(2, "acquire", (), 4, 2, 3), op(2, "release", (), None, 4, 5)]
    assert verdict(not_took, LockModel()) == "ok"
    # an unknown acquire that took effect must have had a fence > 4, hence 5 is too small
    after = not_took + [op(1, "release", (), None, 6, 7), op(3, "acquire", (), 5, 8, 9)]
    assert verdict(after, LockModel()) == "violation"


# ---------------------------------------------------------------- queue

def test_queue_fifo_ok_and_out_of_order_violation():
    h = [op(1, "produce", ("a",), None, 0, 1), op(1, "produce", ("b",), None, 2, 3),
         op(2, "consume", (), "a", 4, 5), op(2, "consume", (), "b", 6, 7)]
    assert verdict(h, QueueModel()) == "ok"
    h[2], h[3] = op(2, "consume", (), "b", 4, 5), op(2, "consume", (), "a", 6, 7)
    r = check(h, QueueModel())
    assert r.verdict == "violation" and "FIFO order" in r.explanation
    # the same found by search (the model without its fast refutation)
    class Plain(QueueModel):
        def refute(self, ops):
            return None
    r = check(h, Plain())
    assert r.verdict == "violation" and "state then: ('a', 'b')" in r.explanation


def test_queue_overlapping_produces_allow_reorder():
    h = [op(1, "produce", ("a",), None, 0, 3), op(2, "produce", ("b",), None, 1, 2),
         op(3, "consume", (), "b", 4, 5), op(3, "consume", (), "a", 6, 7)]
    assert verdict(h, QueueModel()) == "ok"


def test_queue_blocking_consume_waits_for_overlapping_produce():
    h = [op(2, "consume", (), "a", 0, 10), op(1, "produce", ("a",), None, 5, 6)]
    assert verdict(h, QueueModel()) == "ok"
    h = [op(2, "consume", (), "a", 0, 4), op(1, "produce", ("a",), None, 5, 6)]
    assert verdict(h, QueueModel()) == "violation"


def test_queue_unknown_produce_ok_either_way():
    base = [op(1, "produce", ("a",), None, 0, 0, "unknown"),
            op(1, "produce", ("b",), None, 2, 3)]
    happened = base + [op(2, "consume", (), "a", 4, 5), op(2, "consume", (), "b", 6, 7)]
    not_happened = base + [op(2, "consume", (), "b", 4, 5),
                           op(2, "try_consume", (), None, 6, 7)]
    assert verdict(happened, QueueModel()) == "ok"
    assert verdict(not_happened, QueueModel()) == "ok"
    # an unknown op may take effect late, but never before its call
    late = base + [op(2, "consume", (), "b", 4, 5), op(2, "consume", (), "a", 6, 7)]
    assert verdict(late, QueueModel()) == "ok"
    early = [op(2, "consume", (), "a", 0, 1), op(1, "produce", ("a",), None, 2, 2, "unknown")]
    assert verdict(early, QueueModel()) == "violation"


def test_queue_try_consume_empty_while_nonempty_and_ghost_item():
    h = [op(1, "produce", ("a",), None, 0, 1), op(2, "try_consume", (), None, 2, 3)]
    assert verdict(h, QueueModel()) == "violation"
    assert verdict([op(2, "try_consume", (), "z", 0, 1)], QueueModel()) == "violation"


def test_queue_failed_ops_are_dropped_and_lists_frozen():
    h = [op(1, "produce", ("a",), "garbage", 0, 1, "fail"),
         op(1, "produce", ([1, 2],), None, 2, 3), op(2, "consume", (), [1, 2], 4, 5)]
    assert verdict(h, QueueModel()) == "ok"


def test_queue_capacity():
    h = [op(1, "produce", ("a",), None, 0, 1), op(1, "produce", ("b",), None, 2, 3)]
    assert verdict(h, QueueModel(capacity=1)) == "violation"
    h.insert(1, op(2, "consume", (), "a", 1.5, 1.8))
    assert verdict(h, QueueModel(capacity=1)) == "ok"


def test_queue_refutations_lost_item_and_false_empty():
    base = [op(1, "produce", ("a",), None, 0, 1), op(1, "produce", ("b",), None, 2, 3)]
    lost = base + [op(2, "consume", (), "b", 4, 5)]
    r = check(lost, QueueModel())
    assert r.verdict == "violation" and "'a' was never consumed" in r.explanation
    # ... unless a consume of unknown outcome may have taken it
    assert verdict(lost + [op(3, "consume", (), None, 3.5, 0, "unknown")], QueueModel()) == "ok"
    empty = base + [op(2, "consume", (), "a", 4, 5), op(3, "try_consume", (), None, 4.5, 4.8),
                    op(2, "consume", (), "b", 6, 7)]
    r = check(empty, QueueModel())
    assert r.verdict == "violation" and "found the queue empty" in r.explanation
    empty[3] = op(3, "try_consume", (), None, 4.5, 6.5)  # overlaps the consume of 'b'
    assert verdict(empty, QueueModel()) == "ok"


def test_lock_release_error_output_means_rejected():
    h = [op(1, "acquire", (), 1, 0, 1), op(2, "release", (), ("error", "NotOwner"), 2, 3),
         op(1, "release", (), None, 4, 5)]
    assert verdict(h, LockModel()) == "ok"
    h[1] = op(1, "release", (), ("error", "NotOwner"), 2, 3)  # the holder was refused
    assert verdict(h, LockModel()) == "violation"


# ---------------------------------------------------------------- semaphore

def test_semaphore_too_many_holders():
    two = [op(1, "acquire", (), None, 0, 1), op(2, "acquire", (), None, 0, 1)]
    assert verdict(two, SemaphoreModel(2)) == "ok"
    three = two + [op(3, "acquire", (), None, 0, 1)]
    assert verdict(three, SemaphoreModel(2)) == "violation"
    released = three + [op(1, "release", (), None, 0.5, 2)]
    assert verdict(released, SemaphoreModel(2)) == "ok"


def test_semaphore_release_by_non_holder_and_try_acquire():
    h = [op(1, "acquire", (), None, 0, 1), op(2, "release", (), None, 2, 3)]
    assert verdict(h, SemaphoreModel(2)) == "violation"
    assert verdict([op(1, "try_acquire", (), False, 0, 1)], SemaphoreModel(1)) == "violation"
    h = [op(1, "acquire", (2,), None, 0, 1), op(2, "try_acquire", (), False, 2, 3),
         op(1, "expire", (), None, 4, 5), op(2, "try_acquire", (), True, 6, 7)]
    assert verdict(h, SemaphoreModel(2)) == "ok"


# ---------------------------------------------------------------- counter

def test_counter():
    h = [op(1, "add", (2,), 2, 0, 1), op(2, "get", (), 2, 2, 3), op(1, "set", (7,), None, 4, 5),
         op(2, "cas", (7, 9), True, 6, 7), op(1, "cas", (7, 1), False, 8, 9)]
    assert verdict(h, CounterModel()) == "ok"
    stale = h + [op(2, "get", (), 7, 10, 11)]
    assert verdict(stale, CounterModel()) == "violation"


def test_counter_lost_update_and_concurrent_read():
    lost = [op(1, "add", (1,), 1, 0, 2), op(2, "add", (1,), 1, 1, 3)]
    assert verdict(lost, CounterModel()) == "violation"
    h = [op(1, "add", (1,), 1, 0, 4), op(2, "get", (), 0, 1, 2), op(3, "get", (), 1, 2.5, 3)]
    assert verdict(h, CounterModel()) == "ok"
    h.append(op(4, "get", (), 0, 3.5, 5))  # the add is seen at 3, so 0 at 3.5 is stale
    assert verdict(h, CounterModel()) == "violation"


def test_counter_bounds_count_adds_that_may_overlap_the_read():
    # an unknown add called exactly when the read returns may still come before it
    h = [op(0, "add", (0,), 1, 0.5, 3.5), op(0, "add", (1,), None, 3.5, 0, "unknown")]
    assert verdict(h, CounterModel()) == "ok"


def test_blind_writes_are_not_taken_as_reads():
    # set(0) at value 0 changes nothing *there*, yet it must come after set(5) here
    h = [op(1, "set", (0,), None, 0, 10), op(2, "set", (5,), None, 1, 2),
         op(3, "get", (), 0, 3, 4)]
    assert verdict(h, CounterModel()) == "ok"

    class Wrong(CounterModel):
        blind_writes = frozenset()
    assert verdict(h, Wrong()) == "violation"


# ---------------------------------------------------------------- check() at large

def test_partitions_per_key_and_model_mapping():
    h = [op(1, "add", (1,), 1, 0, 1, key="c"), op(1, "acquire", (), 1, 0, 1, key="l"),
         op(2, "acquire", (), 2, 2, 3, key="l")]
    r = check(h, {"c": CounterModel(), "l": LockModel()})
    assert (r.verdict, r.key) == ("violation", "l")
    assert check(h[:2], {"c": CounterModel(), "l": LockModel()}).verdict == "ok"


def test_step_budget_gives_unknown():
    # 10 concurrent produces and one consume of unknown outcome, then a try_consume that finds
    # the queue empty: refuting it means trying every order of the produces (10! queue states)
    h = [op(i, "produce", (i,), None, 0, 1) for i in range(10)]
    h.append(op(0, "consume", (), None, 0, 0, "unknown"))
    r = check(h + [op(0, "try_consume", (), None, 2, 3)], QueueModel(), max_steps=2000)
    assert r.verdict == "unknown" and r.key == "k" and "budget" in r.explanation
    assert check(h + [op(0, "consume", (), 7, 2, 3)], QueueModel()).verdict == "ok"


def test_search_violation_explanation():
    h = [op(1, "set", (1,), None, 0, 1), op(2, "add", (1,), 2, 0, 1), op(3, "get", (), 1, 2, 3)]
    r = check(h, CounterModel())
    assert r.verdict == "violation"
    assert "linearizes 2 of 3" in r.explanation and "state then: 2" in r.explanation
    assert "c3 get() -> 1 [2, 3]" in r.explanation
    # add/get-only counters are refuted directly, with bounds
    h = [op(1, "add", (1,), 1, 0, 1), op(2, "add", (1,), 2, 0, 1), op(3, "get", (), 1, 2, 3)]
    assert "outside [2, 2]" in check(h, CounterModel()).explanation
    h = [op(1, "add", (1,), 1, 0, 1), op(2, "add", (1,), 1, 0, 1)]
    assert "both returned 1" in check(h, CounterModel()).explanation


def test_long_sequential_history_is_fast():
    h = []
    for i in range(3000):
        h.append(op(1, "produce", (i,), None, 4 * i, 4 * i + 1))
        h.append(op(2, "consume", (), i, 4 * i + 2, 4 * i + 3))
    assert verdict(h, QueueModel()) == "ok"
    h[-1] = op(2, "consume", (), -1, h[-1].call, h[-1].ret)
    assert verdict(h, QueueModel()) == "violation"


# ---------------------------------------------------------------- queue exactly-once

def test_queue_exactly_once():
    good = [op(1, "produce", ("a",), None, 0, 1), op(1, "produce", ("b",), None, 0, 0, "unknown"),
            op(2, "consume", (), "a", 2, 3), op(2, "try_consume", (), None, 4, 5)]
    assert check_queue_exactly_once(good) == []
    bad = good + [op(3, "consume", (), "a", 6, 7), op(3, "consume", (), "z", 6, 7),
                  op(1, "produce", ("f",), None, 0, 1, "fail"),
                  op(3, "consume", (), "f", 8, 9), op(1, "produce", ("late",), None, 20, 21),
                  op(3, "consume", (), "late", 10, 11)]
    problems = check_queue_exactly_once(bad)
    assert len(problems) == 4, problems
    assert any("'a' consumed 2x" in p for p in problems)
    assert any("'z'" in p and "never produced" in p for p in problems)
    assert any("'f'" in p and "definitely failed" in p for p in problems)
    assert any("'late'" in p and "before" in p for p in problems)
    lost = [op(1, "produce", ("a",), None, 0, 1)]
    assert check_queue_exactly_once(lost) == []
    assert len(check_queue_exactly_once(lost, require_drained=True)) == 1


# ---------------------------------------------------------------- recorder

def test_recorder_threads_and_statuses():
    rec = HistoryRecorder()

    def worker(c):
        for i in range(50):
            h = rec.invoke(c, "q", "produce", (f"{c}-{i}",))
            rec.ok(h, None)
    threads = [threading.Thread(target=worker, args=(c,)) for c in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    hf, hu, hp = (rec.invoke(9, "q", "consume") for _ in range(3))
    rec.fail(hf)
    rec.unknown(hu)
    with pytest.raises(ValueError):
        rec.ok(hf, "x")
    hist = rec.history()
    assert len(hist) == 203
    assert all(o.call <= o.ret for o in hist)
    assert [o.status for o in hist[-3:]] == ["fail", "unknown", "unknown"]
    assert hist[-1].ret == INF and hist[-2].ret == INF and hp == 202
    assert verdict(hist, QueueModel()) == "ok"
    assert check_queue_exactly_once(hist, require_drained=False) == []


# ---------------------------------------------------------------- properties

class Sim:
    """Reference implementations generating (client, kind, input, output, bad_output, effect).
    `bad_output` is an output the model must reject in that state; `effect` applies the op."""

    def __init__(self, name, draw):
        self.name, self.draw = name, draw
        self.q, self.holder, self.fence, self.held, self.value = deque(), None, 0, [], 0
        self.permits = draw(st.integers(1, 3))
        self.fresh = 0

    def model(self):
        return {"queue": QueueModel, "lock": LockModel, "counter": CounterModel,
                "semaphore": lambda: SemaphoreModel(self.permits)}[self.name]()

    def next(self):
        d, c = self.draw, self.draw(st.integers(0, 2))
        if self.name == "queue":
            k = d(st.sampled_from(["produce", "consume", "try_consume"]))
            if k == "produce":
                self.fresh += 1
                item = self.fresh
                return c, k, (item,), None, "bad", lambda: self.q.append(item)
            if not self.q:
                return c, "try_consume", (), None, -1, lambda: None
            return c, k, (), self.q[0], (None if k == "try_consume" else -1), self.q.popleft
        if self.name == "counter":
            k = d(st.sampled_from(["add", "get", "set", "cas"]))
            v, x = self.value, d(st.integers(-3, 3))
            if k == "add":
                return c, k, (x,), v + x, v + x + 1, lambda: setattr(self, "value", v + x)
            if k == "get":
                return c, k, (), v, v + 1, lambda: None
            if k == "set":
                return c, k, (x,), None, "bad", lambda: setattr(self, "value", x)
            e = d(st.sampled_from([v, x]))
            return c, k, (e, x), e == v, e != v, lambda: setattr(self, "value", x if e == v else v)
        if self.name == "lock":
            k = d(st.sampled_from(["acquire", "try_acquire", "release", "expire"]))
            if k == "expire":
                return c, k, (), None, "bad", lambda: self.holder == c and self._free()
            if self.holder is None:
                f = self.fence + d(st.integers(1, 3))  # fences are log indices: gaps allowed
                k = "acquire" if k == "release" else k
                return c, k, (), f, self.fence, lambda: self._grant(c, f)
            if k == "release":
                return self.holder, k, (), None, "bad", self._free
            return c, "try_acquire", (), None, self.fence + 9, lambda: None
        k = d(st.sampled_from(["acquire", "try_acquire", "release", "expire"]))
        full = len(self.held) >= self.permits
        if k == "expire":
            return c, k, (), None, "bad", lambda: self.held.__setitem__(
                slice(None), [h for h in self.held if h != c])
        if k == "release" and c in self.held:
            return c, k, (), None, "bad", lambda: self.held.remove(c)
        if k == "acquire" and not full:
            return c, k, (), None, "bad", lambda: self.held.append(c)
        return c, "try_acquire", (), not full, full, (lambda: None) if full else (
            lambda: self.held.append(c))

    def _grant(self, c, f):
        self.holder, self.fence = c, f

    def _free(self):
        self.holder = None


models = st.sampled_from(["queue", "lock", "semaphore", "counter"])


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=models, data=st.data())
def test_histories_of_a_real_sequential_run_are_linearizable(name, data):
    d = data.draw
    keys = [f"{name}{i}" for i in range(d(st.integers(1, 3)))]
    sims = {key: Sim(name, d) for key in keys}
    history = []
    for t in range(d(st.integers(0, 25))):
        key = d(st.sampled_from(keys))
        c, k, inp, out, bad, effect = sims[key].next()
        fate = d(st.sampled_from(["ok"] * 8 + ["unknown", "spurious-unknown", "fail"]))
        call, ret = t - d(st.floats(0, 3)), t + d(st.floats(0, 3))
        if fate in ("ok", "unknown"):
            effect()  # took effect at instant t, inside [call, ret]
        status = {"ok": "ok", "fail": "fail"}.get(fate, "unknown")
        history.append(Op(c, key, call, INF if status == "unknown" else ret, k, inp,
                          bad if fate == "fail" else out, status))
    r = check(history, {key: s.model() for key, s in sims.items()}, max_steps=200_000)
    assert r.verdict == "ok", (r, history)


@settings(max_examples=100, deadline=None)
@given(name=models, data=st.data())
def test_mutating_one_output_of_a_sequential_history_is_a_violation(name, data):
    d = data.draw
    sim = Sim(name, d)
    history, bads = [], []
    for _ in range(d(st.integers(1, 20))):
        c, k, inp, out, bad, effect = sim.next()
        effect()
        t = 2 * len(history)
        history.append(Op(c, "k", t, t + 1, k, inp, out, "ok"))
        bads.append(bad)
    model = sim.model()
    assert check(history, model).verdict == "ok"
    i = d(st.integers(0, len(history) - 1))
    o = history[i]
    history[i] = Op(o.client, o.key, o.call, o.ret, o.kind, o.input, bads[i], "ok")
    assert check(history, model).verdict == "violation", (i, history)



def brute_force_linearizable(history, model):
    """Reference: every subset of the 'unknown' ops, every order of it plus the 'ok' ops that
    respects real time, run through the plain model (no prepare, refute or ranks)."""
    ok = [o for o in history if o.status == "ok"]
    unk = [o for o in history if o.status == "unknown"]
    for r in range(len(unk) + 1):
        for chosen in itertools.combinations(unk, r):
            for perm in itertools.permutations(ok + list(chosen)):
                if any(b.ret < a.call for i, a in enumerate(perm) for b in perm[i + 1:]):
                    continue
                state, legal = model.init, True
                for o in perm:
                    out = UNKNOWN if o.status == "unknown" else o.output
                    legal, state = model.step(state, o.kind, o.input, out, o.client)
                    if not legal:
                        break
                if legal:
                    return True
    return False


SMALL = {
    "queue": (QueueModel, [("produce", st.tuples(st.integers(0, 2)), st.none()),
                           ("consume", st.just(()), st.integers(0, 2)),
                           ("try_consume", st.just(()), st.one_of(st.none(), st.integers(0, 2)))]),
    "lock": (LockModel, [("acquire", st.just(()), st.integers(0, 3)),
                         ("try_acquire", st.just(()), st.one_of(st.none(), st.integers(0, 3))),
                         ("release", st.just(()), st.none()), ("expire", st.just(()), st.none())]),
    "semaphore": (lambda: SemaphoreModel(2), [
        ("acquire", st.just(()), st.none()), ("try_acquire", st.just(()), st.booleans()),
        ("release", st.just(()), st.none()), ("expire", st.just(()), st.none())]),
    "counter": (CounterModel, [("add", st.tuples(st.integers(-1, 1)), st.integers(-1, 2)),
                               ("get", st.just(()), st.integers(-1, 2)),
                               ("set", st.tuples(st.integers(0, 1)), st.none()),
                               ("cas", st.tuples(st.integers(0, 1), st.integers(0, 1)),
                                st.booleans())]),
}


@settings(max_examples=250, deadline=None)
@given(name=st.sampled_from(sorted(SMALL)), data=st.data())
def test_small_random_histories_agree_with_brute_force(name, data):
    factory, kinds = SMALL[name]
    history = []
    for _ in range(data.draw(st.integers(1, 6))):
        kind, inputs, outputs = data.draw(st.sampled_from(kinds))
        call = data.draw(st.integers(0, 8)) / 2
        status = data.draw(st.sampled_from(["ok"] * 4 + ["unknown", "fail"]))
        ret = INF if status == "unknown" else call + data.draw(st.integers(0, 6)) / 2
        history.append(Op(data.draw(st.integers(0, 2)), "k", call, ret, kind,
                          data.draw(inputs), data.draw(outputs), status))
    expected = brute_force_linearizable([o for o in history if o.status != "fail"], factory())
    got = check(history, factory())
    assert got.verdict == ("ok" if expected else "violation"), (got, history)

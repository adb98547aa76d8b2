"""The Map's linearizability model (tests/lincheck_map.py): it agrees with the real Map on
random sequential runs (driven through the kernel), refuses each mutated answer of such a
run, and judges concurrent histories as the definition says."""
from __future__ import annotations

import math
import random

import pytest

try:
    from tests.lincheck import Op, check
    from tests.lincheck_map import MapModel
    from tests.test_objects import OH
except ImportError:  # tests/ is not a package: pytest puts tests/ itself on sys.path
    from lincheck import Op, check
    from lincheck_map import MapModel
    from test_objects import OH

INF = math.inf
KEYS = ("a", "b", "c")


def random_op(rng: random.Random, n: int) -> tuple[str, tuple]:
    k, k2 = rng.choice(KEYS), rng.choice(KEYS)
    kind = rng.choice(("get", "put", "put", "delete", "cas", "txn"))
    if kind == "get" or kind == "delete":
        return kind, (k,)
    if kind == "put":
        return kind, (k, n)
    if kind == "cas":
        return kind, (k, rng.randrange(3), n)
    compares = [[k, rng.choice(("version", "mod_revision", "exists", "value")),
                 rng.choice(("==", "!=", ">", "<=")), 0]]
    if compares[0][1] == "exists":
        compares[0][2:] = ["==", rng.random() < 0.5]
    success = [["put", k2, n], ["get", k]]
    failure = [["delete", k2]] if n % 2 else []
    return kind, (compares, success, failure)


def sequential_history(seed: int, n: int = 40) -> list[Op]:
    """Run random calls one after another on a real Map; the history of what they said."""
    rng = random.Random(seed)
    h = OH()
    h.make("Map", "m")
    sessions = h.sessions(3)
    ops = []
    for i in range(n):
        kind, inp = random_op(rng, i)
        s = sessions[i % 3]
        out = h.ok(s, "m", kind, *inp)
        ops.append(Op(s, "m", 2 * i, 2 * i + 1, kind, inp, out, "ok"))
    return ops


@pytest.mark.parametrize("seed", range(6))
def test_a_real_sequential_run_is_linearizable_and_any_changed_answer_is_not(seed):
    ops = sequential_history(seed)
    assert check(ops, MapModel()).verdict == "ok"
    rng = random.Random(seed)
    for i in rng.sample(range(len(ops)), 8):
        o = ops[i]
        wrong = _mutated(o.output)
        bad = ops[:i] + [Op(o.client, o.key, o.call, o.ret, o.kind, o.input, wrong, "ok")] \
            + ops[i + 1:]
        assert check(bad, MapModel()).verdict == "violation", (o, wrong)


def _mutated(out):
    if isinstance(out, bool):
        return not out
    if isinstance(out, dict):
        changed = dict(out)
        changed["revision"] = out["revision"] + 1
        return changed
    return ("not", out)


def op(client, kind, inp, out, call, ret, status="ok"):
    return Op(client, "m", call, INF if status == "unknown" else ret, kind, tuple(inp), out,
              status)


def test_concurrent_puts_may_take_either_order_but_a_stale_read_may_not():
    put1 = op(1, "put", ("k", "x"), {"revision": 2, "version": 2}, 0, 5)
    put2 = op(2, "put", ("k", "y"), {"revision": 1, "version": 1}, 1, 4)   # overlapping
    assert check([put1, put2, op(3, "get", ("k",), "x", 6, 7)], MapModel()).verdict == "ok"
    stale = op(3, "get", ("k",), "y", 6, 7)                                # after both
    assert check([put1, put2, stale], MapModel()).verdict == "violation"


def test_an_unknown_put_may_or_may_not_have_happened():
    lost = op(1, "put", ("k", "x"), None, 0, None, "unknown")
    after = op(2, "put", ("k", "y"), {"revision": 1, "version": 1}, 1, 2)
    assert check([lost, after], MapModel()).verdict == "ok"                # it never did
    took = op(2, "put", ("k", "y"), {"revision": 2, "version": 2}, 1, 2)
    assert check([lost, took], MapModel()).verdict == "ok"                 # it did, first
    later = op(2, "put", ("k", "z"), {"revision": 3, "version": 3}, 3, 4)   # it did, between
    assert check([lost, after, later], MapModel()).verdict == "ok"
    twice = op(2, "put", ("k", "z"), {"revision": 4, "version": 4}, 3, 4)   # not twice
    assert check([lost, after, twice], MapModel()).verdict == "violation"


def test_a_txn_sees_one_state_and_changes_it_at_one_revision():
    setup = op(1, "put", ("a", 1), {"revision": 1, "version": 1}, 0, 1)
    t = op(2, "txn", ([["a", "value", "==", 1]], [["put", "b", 2], ["delete", "a"]],
                      [["put", "c", 3]]),
           {"succeeded": True, "revision": 2, "results": [{"version": 1}, {"deleted": True}]},
           2, 3)
    assert check([setup, t, op(3, "get", ("a",), None, 4, 5)], MapModel()).verdict == "ok"
    split = op(2, "txn", t.input, {"succeeded": True, "revision": 3,
                                    "results": [{"version": 1}, {"deleted": True}]}, 2, 3)
    assert check([setup, split], MapModel()).verdict == "violation"

"""`state_size` against the walk it replaces, which visited every reference one by one: the same
totals to the byte (quota decisions and the checkpoint's `over_limit` depend on them, so every
version of gesmas must measure alike), including where the walk stops past its limit."""
from __future__ import annotations

import collections
import random
from typing import Any

import pytest

from gesmas.server.kernel.measure import _ATOMS, _instance_dict, state_size


def walk_every_reference(obj: Any, limit: int, unfold: bool = False) -> int:
    """The measure as gesmas wrote it before values were memoized."""
    total = 0
    seen: set[int] = set()
    stack = [obj]
    bases = (list, tuple, set, frozenset, collections.deque)
    while stack:
        v = stack.pop()
        t = type(v)
        if t is str or t is bytes or t is bytearray:
            total += 8 + len(v)
        elif t in _ATOMS:
            total += 8 + ((v.bit_length() >> 3) if t is int else 0)
        else:
            if not unfold and t is not tuple and t is not frozenset:
                if id(v) in seen:
                    continue
                seen.add(id(v))
            if isinstance(v, dict):
                total += 8 + 16 * dict.__len__(v)
                stack.extend(dict.keys(v))
                stack.extend(dict.values(v))
            elif isinstance(v, bases):
                base: Any = next(b for b in bases if isinstance(v, b))
                total += 8 + 8 * base.__len__(v)
                stack.extend(base.__iter__(v))
            else:
                total += 16
                d = _instance_dict(v)
                if type(d) is dict:
                    stack.append(d)
        if total > limit:
            break
    return total


class Box:
    def __init__(self, v: Any) -> None:
        self.v = v


Point = collections.namedtuple("Point", "x y")


def random_state(rng: random.Random) -> Any:
    """Values built from earlier ones: shared tuples, tuples holding mutables that hold the
    tuples back (cycles through a list, a dict, an instance), frozensets, namedtuples."""
    pool: list[Any] = [0, "s", b"bb", 2 ** 70, 1.5, None, True, ()]
    lists: list[Any] = []
    for _ in range(rng.randrange(1, 60)):
        pick = lambda: rng.choice(pool)            # noqa: E731
        kind = rng.randrange(9)
        if kind < 3:
            v: Any = tuple(pick() for _ in range(rng.randrange(0, 4)))
        elif kind == 3:
            members = [rng.randrange(5), "k", pick()]
            try:
                v = frozenset(members)
            except TypeError:                      # a tuple holding a list
                v = frozenset(members[:2])
        elif kind == 4:
            v = [pick() for _ in range(rng.randrange(0, 3))]
            lists.append(v)
        elif kind == 5:
            v = {rng.randrange(4): pick(), "x": pick()}
        elif kind == 6:
            v = Box(pick())
        elif kind == 7:
            v = Point(pick(), pick())
        else:
            v = collections.deque([pick(), pick()])
        pool.append(v)
    for lst in lists:                              # close cycles through the mutables
        if rng.random() < 0.5:
            lst.append(rng.choice(pool))
    return pool[-1] if rng.random() < 0.5 else pool


@pytest.mark.parametrize("seed", range(200))
def test_the_same_totals_as_walking_every_reference(seed):
    rng = random.Random(seed)
    state = random_state(rng)
    full = walk_every_reference(state, 10 ** 12)
    assert state_size(state, 10 ** 12) == full
    for limit in sorted({rng.randrange(0, full + 2) for _ in range(12)}):
        assert state_size(state, limit) == walk_every_reference(state, limit), limit


@pytest.mark.parametrize("seed", range(100))
def test_unfolded_the_same_up_to_the_limit_and_past_it_when_it_was(seed):
    """Unfolded (what the digest asks: does a part unfold past the limit?), every size up to
    the limit is the same; past it, only that it is past."""
    rng = random.Random(seed)
    state = random_state(rng)
    for limit in (0, 50, 300, 2000, 10 ** 5):
        old, new = walk_every_reference(state, limit, True), state_size(state, limit, True)
        assert (old > limit) == (new > limit), (limit, old, new)
        if old <= limit:
            assert new == old


def test_a_tree_of_shared_tuples_measures_as_if_unfolded():
    t: Any = ()
    sizes = [8]
    for _ in range(40):
        t = (t, t)
        sizes.append(24 + 2 * sizes[-1])
    assert state_size([t], 10 ** 15) == 16 + sizes[-1]
    for limit in (1000, 12_345, 99_999):         # where the old walk stops, to the byte
        assert state_size([t], limit) == walk_every_reference([t], limit)
    # the default max_object_bytes: the walk stopped after ~2.8 million tuples (~12 s)
    assert 64 << 20 < state_size(t, 64 << 20) <= (64 << 20) + 24
    assert state_size(t, 10 ** 15, unfold=True) == sizes[-1]
    assert state_size(t, 64 << 20, unfold=True) > 64 << 20
    cycle: list[Any] = [t]
    cycle.append((cycle,))
    assert state_size(cycle, 64 << 20, unfold=True) > 64 << 20


def test_a_tuple_in_a_cycle_through_a_list():
    lst: list[Any] = []
    tup = (lst, "abc", (1, 2))
    lst.extend([tup, tup, (tup, tup)])
    for limit in range(0, 400, 7):
        assert state_size(tup, limit) == walk_every_reference(tup, limit)
    assert state_size([tup, lst], 10 ** 9) == walk_every_reference([tup, lst], 10 ** 9)


def test_a_tuple_met_again_inside_its_own_walk():
    """`tup` is reached again through `b` while `a`, under it, is not counted yet: that visit
    walks it, counting `a` before the second `y` (as the old walk did), instead of adding its
    memoized size."""
    a: list[Any] = ["x" * 50]
    b: list[Any] = []
    tup = (a, ("y" * 30,), b)
    b.append(tup)
    full = walk_every_reference(tup, 10 ** 9)
    assert state_size(tup, 10 ** 9) == full
    for limit in range(full + 1):
        assert state_size(tup, limit) == walk_every_reference(tup, limit), limit

"""Walking values without running uploaded code: the logical size of a state (the same on
every replica, bounded by a limit, not by the state), the unfolded size that repr, hash and
== would walk, and whether a set's order is the same on every replica."""
from __future__ import annotations

from typing import Any, Callable

import dataclasses as _dataclasses
import sys

from .budget import _IDENTITY, MAX_SIZE, ResourceLimit, _charge, _charge_scan, _deque
from .charge import ATOM, _key_, charge_value, kind

# Before Python 3.12 None's hash is its address: a set holding None iterates in an order of
# its own on each replica.
_NONE_HASH_FIXED = sys.version_info >= (3, 12)

_WALKED = (tuple, list, dict, set, frozenset, _deque)


def _walkable(obj: Any, what: str) -> None:
    """Charge for walking `obj` (repr, str, format walk it unfolded: charge.py) and refuse a
    set whose order is not the same on every replica."""
    if kind(type(obj)) != ATOM:
        try:
            charge_value(obj)
        except ResourceLimit as exc:
            raise ResourceLimit(f"{what}: {exc}") from None
        if isinstance(obj, (set, frozenset)):
            _ordered_set(obj)


def _stable_hash(x: Any) -> bool:
    """Whether hash(x) is the same on every replica (not an address, not NaN's)."""
    t = type(x)
    if t is str or t is int or t is bytes or t is bool or t is complex:
        return True
    if x is None:
        return _NONE_HASH_FIXED
    if t is float:
        return x == x
    if isinstance(x, (tuple, frozenset)):
        return all(_stable_hash(y) for y in x)
    if isinstance(x, type) or t.__hash__ is object.__hash__ or isinstance(x, _IDENTITY):
        return False
    if _dataclasses.is_dataclass(x):     # a generated hash hashes the fields' tuple
        return all(_stable_hash(getattr(x, f.name, None)) for f in _dataclasses.fields(x))
    return True


_PLAIN_MEMBERS = frozenset({int, str, bytes, bool})


def _member_(x: Any) -> Any:
    """`x`, about to become a member of a set: charged its hash, and refused if its hash (so
    the set's order, and the bytes a checkpoint writes for the set) differs between replicas."""
    if type(x) in _PLAIN_MEMBERS:
        return _key_(x)
    _key_(x)
    if not _stable_hash(x):
        _unordered(x)
    return x


def members(s: Any) -> Any:
    """`s`, a set just made or grown: every member hashes the same on every replica."""
    if type(s) is set or type(s) is frozenset:
        if not set(map(type, s)) <= _PLAIN_MEMBERS:
            for x in s:
                if not _stable_hash(x):
                    _unordered(x)
    return s


def _unordered(x: Any) -> None:
    raise TypeError(f"a set cannot hold a {type(x).__name__} value: its hash is an address "
                    "or NaN's, so the set's order would not be the same on every replica "
                    "(use a dict or a list)")


def _charge_table(s: Any) -> None:
    """Iterating a set walks its whole table, which does not shrink when members leave."""
    slots = s.__sizeof__() >> 4
    if slots > 4096:
        _charge(slots >> 3)


def _ordered_set(s: Any) -> Any:
    """`s` (a set about to be iterated), once every member is known to hash the same on every
    replica; a set's order follows its members' hashes."""
    _charge_scan(s)
    _charge_table(s)
    if not set(map(type, s)) <= _PLAIN_MEMBERS:
        for x in s:
            if not _stable_hash(x):
                raise TypeError(f"a set holding a {type(x).__name__} has no order that is "
                                "the same on every replica (its hash is an address or NaN's); "
                                "use a list or a dict")
    return s


def _set_iter(it: Any) -> Any:
    """RestrictedPython's `_getiter_`: every `for` loop and comprehension source."""
    t = type(it)
    if t is set or t is frozenset:
        _ordered_set(it)
    return it


def _set_args(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A builtin that iterates its arguments in order (enumerate, zip, map, filter, list...)."""
    def call(*args: Any, **kwargs: Any) -> Any:
        for a in args:
            t = type(a)
            if t is set or t is frozenset:
                _ordered_set(a)
        return fn(*args, **kwargs)
    call.__name__ = getattr(fn, "__name__", "call")
    return call


_ATOMS = (type(None), bool, int, float, complex, str, bytes, range)


def _instance_dict(v: Any) -> Any:
    try:
        return object.__getattribute__(v, "__dict__")
    except AttributeError:
        return None


class _Done:
    """Pushed under an immutable container's items: when it is popped, the walk of the items
    under it is over (`state_size`)."""
    __slots__ = ("v",)

    def __init__(self, v: Any) -> None:
        self.v = v


def _atom_size(v: Any) -> int | None:
    t = type(v)
    if t is str or t is bytes or t is bytearray:
        return 8 + len(v)
    if t in _ATOMS:
        return 8 + ((v.bit_length() >> 3) if t is int else 0)
    return None


def _shared_size(v: Any, memo: dict[int, int]) -> int:
    """What a walk adds for the immutable container `v` (a tuple or frozenset) once every
    mutable value under it is already counted: its slots, its atoms, and the same for the
    immutable containers in it, at every reference. The same number whenever it is asked, so
    it is kept in `memo` (by id: the whole state stays alive during a measure)."""
    got = memo.get(id(v))
    if got is not None:
        return got
    work: list[tuple[Any, bool]] = [(v, False)]
    while work:
        x, ready = work.pop()
        if ready:
            size = 8 + 8 * len(x)
            for c in x:
                tc = type(c)
                if tc is tuple or tc is frozenset:
                    size += memo[id(c)]
                else:
                    a = _atom_size(c)
                    if a is not None:
                        size += a
            memo[id(x)] = size
        elif id(x) not in memo:
            work.append((x, True))
            for c in x:
                tc = type(c)
                if (tc is tuple or tc is frozenset) and id(c) not in memo:
                    work.append((c, False))
    return memo[id(v)]


def _descend(v: Any, total: int, limit: int, memo: dict[int, int]) -> int:
    """`total` after walking the immutable container `v` again item by item, in the order of
    `state_size`'s stack, until it passes `limit` (which the caller knows it does): the same
    total, to the byte, as the walk without `memo` stops at."""
    total += 8 + 8 * len(v)
    if total > limit:
        return total
    for c in reversed(list(v)):          # the stack pops the last item first
        tc = type(c)
        if tc is tuple or tc is frozenset:
            add = _shared_size(c, memo)
            if total + add > limit:
                return _descend(c, total, limit, memo)
            total += add
        else:
            a = _atom_size(c)
            if a is not None:
                total += a
                if total > limit:
                    return total
    return total


_BASES = (list, tuple, set, frozenset, _deque)


def state_size(obj: Any, limit: int, unfold: bool = False) -> int:
    """A logical size of `obj` in bytes, the same on every replica whatever the history of
    the process: strings and bytes count their length, numbers 8 (big integers their bytes),
    a container 8 per slot plus its items; mutable containers and instances count once
    however often they are referenced, immutable values at every reference (their sharing
    differs between a replica restored from a snapshot and one that was not). Stops as soon
    as the total passes `limit` (so its cost is bounded by the limit, not by the state).
    With `unfold`, every reference counts: the size the value has for an operation that
    walks it without a memo (repr, hash, ==, a pickle without memo).

    A tuple or frozenset met again once its first walk is over adds a number computed once
    (`_shared_size`), not a walk: a tree of shared tuples (`t = (t, t)` forty times) has a
    logical size of terabytes and ~120 distinct values, and is measured in the time of those.
    The totals are those of walking every reference, to the byte, including where the walk
    stops past the limit (`_descend`), so every version of gesmas measures the same."""
    if unfold:
        return _unfolded_size(obj, limit)
    total = 0
    seen: set[int] = set()           # mutable values counted
    walked: dict[int, bool] = {}     # immutable containers: True once their first walk is over
    memo: dict[int, int] = {}
    stack = [obj]
    while stack:
        v = stack.pop()
        t = type(v)
        if t is str or t is bytes or t is bytearray:
            total += 8 + len(v)
        elif t in _ATOMS:
            total += 8 + ((v.bit_length() >> 3) if t is int else 0)
        elif t is _Done:
            walked[id(v.v)] = True
            continue
        elif t is tuple or t is frozenset:
            state = walked.get(id(v))
            if state:
                add = _shared_size(v, memo)
                if total + add > limit:
                    return _descend(v, total, limit, memo)
                total += add
                continue
            if state is None:
                walked[id(v)] = False
                stack.append(_Done(v))
            total += 8 + 8 * len(v)
            stack.extend(v)
        else:
            if id(v) in seen:
                continue
            seen.add(id(v))
            total += _expand(v, t, stack)
        if total > limit:
            break
    return total


def _expand(v: Any, t: type, stack: list[Any]) -> int:
    """The size of the mutable container or instance `v` itself; its items go on `stack`."""
    # the builtin methods themselves: a subclass's keys() or __iter__ is not called
    if isinstance(v, dict):
        stack.extend(dict.keys(v))
        stack.extend(dict.values(v))
        return 8 + 16 * dict.__len__(v)
    for base in _BASES:
        if isinstance(v, base):
            b: Any = base
            stack.extend(b.__iter__(v))
            return 8 + 8 * b.__len__(v)
    if t.__module__.startswith("gesmas.server"):
        return 64                                # a Semaphore, a context: fixed, opaque
    d = _instance_dict(v)
    if type(d) is dict:
        stack.append(d)
    for slot in getattr(type(v), "__slots__", ()):
        if isinstance(slot, str) and hasattr(v, slot):
            stack.append(getattr(v, slot))
    return 16


def _unfolded_size(obj: Any, limit: int) -> int:
    """`state_size(obj, limit, unfold=True)`: the size with every reference walked, computed
    once per distinct value (a tree of shared values unfolds to terabytes from a few dozen);
    a cycle unfolds without end. Past `limit` the number is only some number past it, found as
    soon as it is known: at a cycle, or when the distinct values alone pass `limit` (so the
    cost is bounded by the limit, not by the state)."""
    over = limit + 1
    a = _atom_size(obj)
    if a is not None:
        return a
    memo: dict[int, int] = {}
    open_: dict[int, tuple[int, list[Any]]] = {}   # expanded, items not all sized yet
    distinct = 0
    work: list[tuple[Any, bool]] = [(obj, False)]
    while work:
        x, ready = work.pop()
        if ready:
            size, kids = open_.pop(id(x))
            for c in kids:
                a = _atom_size(c)
                size += memo[id(c)] if a is None else a
            memo[id(x)] = min(size, over)
            continue
        if id(x) in memo:
            continue
        if id(x) in open_:               # met again under itself
            return over
        items: list[Any] = []
        own = _expand(x, type(x), items)
        distinct += own
        if distinct > limit:
            return over
        open_[id(x)] = (own, items)
        work.append((x, True))
        for c in items:
            if _atom_size(c) is None and id(c) not in memo:
                work.append((c, False))
    return memo[id(obj)]

"""What native work costs: measuring a value before C code walks it.

A comparison, a hash, a sort or a dict lookup runs in C and holds the interpreter for as long
as it walks its operands, and what it walks is the value *unfolded*: a list that holds the same
inner list twice is walked twice, so forty rounds of ``a = [a, a]`` (80 steps to build) make
one ``a == b`` walk 2^40 items. Every such operation the dialect can reach goes through a
function here that first measures what the operation may walk, charges the running request
for it, and only then hands the values to C.

`unfold(v)` is the measure: the number of items an operation that walks `v` without a memo
(==, <, hash) reaches, shared parts counted each time they are reached. It is computed with a
memo, so its own cost follows the value's *distinct* containers, not its unfolded size (forty
levels of sharing are forty visits), and it is charged as it goes. A value that contains
itself, or unfolds to more than MAX_UNFOLD items, or nests deeper than MAX_DEPTH, is refused
with ResourceLimit: no operation may walk it.

Cost rules, charged before the native call (one step per 8 items walked, as `budget._cost`):

- compare a with b: min(U(a), U(b)); a number, None or a bool against anything is O(1);
  str/bytes against str/bytes: their length / 64;
- hash k, or look k up in a dict or set (hash, then a comparison on a matching hash): U(k);
- search a sequence for x (`in`, index, count, remove): len(seq) * U(x);
- sort n items: U(items) * log2(n); min, max: U(items); a heap or bisect step: U(item) per
  comparison, each comparison charged (`_lt_`);
- consume an iterable (constructors, extend, update, join, star-arguments...): `consume`
  charges a sized container's length up front, and wraps anything else in a counting
  iterator that charges per item (plus the item's U where the consumer hashes or compares).

Values whose comparison runs uploaded code (instances of uploaded classes with their own
``__eq__``) count 1: that code spends steps itself. Dataclass instances compare and hash a
tuple of their fields in generated (uncounted) code, so their fields are walked.
"""
from __future__ import annotations

import collections as _collections
import dataclasses as _dataclasses
import operator as _op
import types as _types
import typing as _typing
from itertools import compress as _compress
from typing import Any, Callable, Iterable

from .budget import MAX_SIZE, ResourceLimit, _charge, _cost

MAX_UNFOLD = MAX_SIZE       # items an operation may walk, shared parts counted each time
MAX_DEPTH = 200             # nesting a walked value may have (CPython recurses in C per level)

_deque = _collections.deque
_KEYS: type = type({}.keys())
_VALUES: type = type({}.values())
_ITEMS: type = type({}.items())

# kinds of types, by what an operation that walks a value of the type walks
ATOM, STR, SEQ, MAP, SET, RECORD, KEYS, VALUES, ITEMS, EXC, SLICE, ALIAS = range(12)
# typing's generic aliases (typing.Tuple[a, b], Union, Optional, Callable, Literal...) compare,
# hash and print through their arguments, and typing hashes them on every subscription (its
# cache): 40 levels of `t = Tuple[t, t]` are 2^40 items to walk. They are walked as their
# __args__. Their identity (`is`) follows typing's cache and is refused (runtime._is_).
_ALIASES = (getattr(_typing, "_BaseGenericAlias"), _types.GenericAlias, _types.UnionType)
ALIAS_WEIGHT = 64    # items an alias counts for: typing walks them in Python, not in C

_KIND: dict[type, int] = {t: ATOM for t in (type(None), bool, int, float, complex)}
_KIND.update({slice: SLICE, str: STR, bytes: STR, bytearray: STR, list: SEQ, tuple: SEQ, _deque: SEQ,
              dict: MAP, set: SET, frozenset: SET, _KEYS: KEYS, _VALUES: VALUES,
              _ITEMS: ITEMS})
_ATOMS = frozenset({type(None), bool, int, float, complex})
_STRS = frozenset({str, bytes, bytearray})


def kind(t: type) -> int:
    """The kind of values of type `t` (cached per type)."""
    k = _KIND.get(t)
    if k is None:
        if issubclass(t, (str, bytes, bytearray)):
            k = STR
        elif issubclass(t, (list, tuple, _deque)):
            k = SEQ
        elif issubclass(t, dict):
            k = MAP
        elif issubclass(t, (set, frozenset)):
            k = SET
        elif issubclass(t, (int, float, complex)):
            k = ATOM
        elif _dataclasses.is_dataclass(t):
            k = RECORD
        elif issubclass(t, BaseException):
            k = EXC                       # its message is the repr of its args
        elif issubclass(t, _ALIASES):
            k = ALIAS
        else:
            k = ATOM                      # compares by identity or by counted uploaded code
        _KIND[t] = k
    return k


def _strs(items: Any) -> int:
    """Extra cost of the str/bytes items of a flat container: their lengths / 64."""
    total = 0
    for s in _compress(items, map(_STRS.__contains__, map(type, items))):
        total += len(s)
    return total >> 6


def unfold(v: Any, cap: int = MAX_UNFOLD, charged: bool = True) -> int:
    """U(v): the items an operation that walks `v` reaches (see the module docstring); at most
    `cap` + 1 (past `cap` the walk stops). Charges the walk's own cost unless `charged` is
    False (the kernel's own checks, outside any request's budget). Raises ResourceLimit for a
    value that contains itself or nests deeper than MAX_DEPTH."""
    t = type(v)
    if t in _ATOMS:
        return 1
    k = kind(t)
    if k == ATOM:
        return 1
    if k == STR:
        return 1 + (len(v) >> 6)
    return _Walk(cap, charged).size(v, k, 0)


class _Walk:
    __slots__ = ("cap", "memo", "open", "charged")

    def __init__(self, cap: int, charged: bool = True) -> None:
        self.cap = cap
        self.charged = charged
        self.memo: dict[int, int] = {}
        self.open: set[int] = set()

    def size(self, v: Any, k: int, depth: int) -> int:
        key = id(v)
        got = self.memo.get(key)
        if got is not None:
            return got
        if key in self.open:
            raise ResourceLimit("a value that contains itself cannot be compared, hashed or "
                                "sorted in gesmas classes")
        if depth > MAX_DEPTH:
            raise ResourceLimit(f"a value nested deeper than {MAX_DEPTH} levels cannot be "
                                "compared, hashed or sorted in gesmas classes")
        items: Any
        if k == SEQ or k == SET:
            items = v
        elif k == MAP or k == KEYS:
            items = dict.keys(v) if k == MAP else v
        elif k == VALUES:
            items = v
        elif k == ITEMS:
            items = None
        elif k == SLICE:                   # compared and hashed as (start, stop, step)
            items = [v.start, v.stop, v.step]
        elif k == EXC:
            args = getattr(v, "args", ())
            items = list(args) if type(args) is tuple else [args]
        elif k == ALIAS:
            args = getattr(v, "__args__", ())
            items = args if type(args) is tuple else [args]
        else:                              # RECORD: the fields the generated code compares
            d = getattr(v, "__dict__", None)
            items = list(d.values()) if type(d) is dict else [
                getattr(v, f.name, None) for f in _dataclasses.fields(v)]
        n = len(items) if items is not None else 0
        if self.charged:
            _charge(1 + (n >> 3))          # the walk itself: a visit and a C scan of the items
        self.open.add(key)
        total = 1 + n if k != ALIAS else ALIAS_WEIGHT + n
        if k == MAP:
            total += self._items(dict.values(v), depth) + self._items(items, depth)
            total += n
        elif k == ITEMS:
            m = dict(v.mapping) if hasattr(v, "mapping") else dict(v)
            if self.charged:
                _charge(len(m) >> 3)
            total += 2 * len(m) + self._items(m.keys(), depth) + self._items(m.values(), depth)
        else:
            total += self._items(items, depth)
        self.open.discard(key)
        self.memo[key] = total
        if total > self.cap:
            return self.cap + 1
        return total

    def _items(self, items: Any, depth: int) -> int:
        types = set(map(type, items))
        if types <= _ATOMS:
            return 0
        extra = _strs(items) if types & _STRS else 0
        if types <= _ATOMS | _STRS:
            return extra
        for x in items:
            t = type(x)
            if t in _ATOMS or t in _STRS:
                continue
            k = kind(t)
            if k == ATOM:
                continue
            if k == STR:
                extra += len(x) >> 6
                continue
            extra += self.size(x, k, depth + 1)
            if extra > self.cap:
                return self.cap + 1
        return extra


def charge_items(n: int) -> None:
    """Charge the walk of `n` items (one step per 8)."""
    if n > MAX_UNFOLD:
        raise ResourceLimit(f"an operation would walk more than {MAX_UNFOLD} items (shared "
                            "parts counted each time they are reached)")
    if n >= 8:
        _charge(n >> 3)


def charge_value(v: Any) -> int:
    """Measure `v`, charge for walking it once, return U(v)."""
    n = unfold(v)
    charge_items(n)
    return n


# -- comparing ----------------------------------------------------------------------------------

def _pair(a: Any, b: Any) -> None:
    """Charge what comparing a with b may walk."""
    ta, tb = type(a), type(b)
    if ta in _ATOMS or tb in _ATOMS:
        return
    ka, kb = kind(ta), kind(tb)
    if ka == ATOM or kb == ATOM:
        return
    if ka == STR or kb == STR:
        if ka == kb:
            n = min(len(a), len(b))
            if n > 4096:
                _charge(n >> 6)
        return
    ua = unfold(a)
    charge_items(min(ua, unfold(b, ua)))


_CMP: dict[str, Callable[[Any, Any], Any]] = {
    "==": _op.eq, "!=": _op.ne, "<": _op.lt, "<=": _op.le, ">": _op.gt, ">=": _op.ge,
}


def _cmp_(a: Any, op: str, b: Any) -> Any:
    """One comparison `a op b` (dialect.py rewrites comparisons of two non-constants)."""
    ta, tb = type(a), type(b)
    if not (ta in _ATOMS or tb in _ATOMS):
        _pair(a, b)
    return _CMP[op](a, b)


def _lt_(a: Any, b: Any) -> Any:
    """`a < b` charged: the comparison heaps, bisect and sorts of non-atoms make."""
    if not (type(a) in _ATOMS and type(b) in _ATOMS):
        _pair(a, b)
    return a < b


# -- hashing ------------------------------------------------------------------------------------

def _key_(k: Any) -> Any:
    """`k`, about to be hashed and looked up in a dict or set: charged U(k)."""
    t = type(k)
    if t in _ATOMS:
        return k
    if t is str or t is bytes:
        if len(k) > 4096:
            _charge(len(k) >> 6)
        return k
    kd = kind(t)
    if kd == ATOM:
        return k
    charge_value(k)
    return k


_PLAIN = frozenset({list, dict, tuple, str, bytes, bytearray, _deque, range})


def _sub_(x: Any) -> Any:
    """`x`, about to be subscripted: a typing alias with type variables substitutes through
    its whole tree of arguments (`t = t[Tuple[T, T]]` doubles it), so it is charged U(x)."""
    t = type(x)
    if t in _PLAIN:
        return x
    if kind(t) == ALIAS:
        charge_value(x)
    return x


def keys(items: Any) -> Any:
    """An iterable whose items a native consumer will hash (set(), dict.fromkeys(), update...):
    a sized container is charged its unfolded size, anything else is counted per item."""
    return consume(items, _key_)


# -- consuming ----------------------------------------------------------------------------------

_SIZED = (list, tuple, dict, set, frozenset, _deque, str, bytes, bytearray, range, _KEYS,
          _VALUES, _ITEMS)


class Counted:  # noqa: E302
    """An iterator that charges per item it hands out: one step, plus `each(item)`'s charge."""

    __slots__ = ("_it", "_each")

    def __init__(self, it: Iterable[Any], each: Callable[[Any], Any] | None = None) -> None:
        self._it = iter(it)
        self._each = each

    def __iter__(self) -> Counted:
        return self

    def __next__(self) -> Any:
        item = next(self._it)
        _charge(1)
        if self._each is not None:
            self._each(item)
        return item

    def __repr__(self) -> str:
        return "<iterator>"


#: iterables that charge per item themselves (Counted, the itertools proxies' iterators, big
#: ranges): consumed as they are
SELF_COUNTED: set[type] = {Counted}


def consume(items: Any, each: Callable[[Any], Any] | None = None) -> Any:
    """`items`, about to be consumed whole by native code: a sized builtin container is charged
    one step per 8 items now (and, with `each`, the unfolded size of what it holds); anything
    else (an iterator, a generator, a view of uploaded code) is wrapped so that every item it
    hands out is charged."""
    if isinstance(items, _SIZED):
        if type(items) is range or isinstance(items, (str, bytes, bytearray)):
            n = len(items)
            if n >= 512:
                _charge(n >> (6 if type(items) is not range else 3))
            return items
        if each is None:
            n = len(items)  # type: ignore[arg-type]
            if n >= 8:
                _charge(n >> 3)
        else:
            charge_value(items)
        return items
    if each is None and type(items) in SELF_COUNTED:
        return items
    return Counted(items, each)


def _cost_of(item: Any) -> None:
    """The charge for an item handed out that may be big (an element of a Counter)."""
    n = _cost(item)
    if n:
        _charge(n)


def compared(items: Any) -> Any:
    """An iterable whose items native code will compare with each other (min, max): charged
    its unfolded size."""
    return consume(items, charge_value)

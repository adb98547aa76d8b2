"""Every method of a builtin value that uploaded code can reach, with what it costs.

Uploaded code reaches methods of builtin values (``d.get(k)``, ``s.startswith(p)``,
``q.extend(xs)``) through `sandbox._getattr_`, which looks the method up in `METHODS` by the
value's kind. A method listed as `OK` does bounded work and is handed out as it is; any other
listed method is wrapped so that it charges, before it runs, the native work it can do
(charge.py's rules: hashing its key, searching for its argument, consuming its input...);
a method that is not listed is not available (AttributeError naming it). Sorting, min, max,
heaps and bisect are here too, as the functions the builtins and module proxies hand out.
"""
from __future__ import annotations

import bisect as _bisect
import functools as _functools
import heapq as _heapq
from typing import Any, Callable

from .budget import MAX_SIZE, ResourceLimit, _charge, _sized
from .charge import (_ATOMS, _STRS, ATOM, EXC, ITEMS, SLICE, KEYS, MAP, RECORD, SEQ, SET, STR, VALUES,
                     _key_, _lt_, _strs, charge_items, charge_value, consume, keys, kind,
                     unfold)

from .limits import _guarded_method
from .measure import _member_, _ordered_set, members

OK = None          # a method handed out as it is: bounded work


def _log2(n: int) -> int:
    return max(n, 1).bit_length()


# -- sorting and choosing -----------------------------------------------------------------------

def _charge_sort(items: list[Any]) -> None:
    """A sort makes at most n*log2(n) comparisons, each walking at most what its two items
    unfold to, and most stop at their first item: one step per 16 items of U * log2(n)."""
    n = len(items)
    if n < 2:
        return
    types = set(map(type, items))
    if types <= _ATOMS | _STRS:
        walked = n + (_strs(items) if types & _STRS else 0)
    else:
        walked = unfold(items)
    _charge((walked * _log2(n)) >> 4)


def sort(items: list[Any], key: Any = None, reverse: bool = False) -> None:
    """`items.sort(key=key, reverse=reverse)`, charged for its comparisons first."""
    if key is None:
        _charge_sort(items)
        items.sort(reverse=bool(reverse))
        return
    ks = [key(x) for x in items]        # the key function is called once per item, as sort does
    _charge_sort(ks)
    order = sorted(range(len(ks)), key=ks.__getitem__, reverse=bool(reverse))
    items[:] = [items[i] for i in order]


def sorted_(iterable: Any, /, *, key: Any = None, reverse: bool = False) -> list[Any]:
    if isinstance(iterable, (set, frozenset)):
        _ordered_set(iterable)          # ties keep the set's order: the same on every replica
    items = list(consume(iterable))
    sort(items, key, reverse)
    return _sized(items, "sorted()")


def _choose(fn: Callable[..., Any], args: tuple[Any, ...], key: Any, default: Any) -> Any:
    if not args:
        raise TypeError(f"{fn.__name__} expected at least 1 argument, got 0")
    source = args[0] if len(args) == 1 else args
    if isinstance(source, (set, frozenset)):
        _ordered_set(source)
    items = list(consume(source))
    if not items:
        if default is _NO_DEFAULT:
            raise ValueError(f"{fn.__name__}() arg is an empty sequence")
        return default
    ks = items if key is None else [key(x) for x in items]
    _charge_sort(ks) if len(ks) > 1 and not set(map(type, ks)) <= _ATOMS else None
    best = fn(range(len(ks)), key=ks.__getitem__)
    return items[best]


_NO_DEFAULT = object()


def min_(*args: Any, key: Any = None, default: Any = _NO_DEFAULT) -> Any:
    _charge(1)
    return _choose(min, args, key, default)


def max_(*args: Any, key: Any = None, default: Any = _NO_DEFAULT) -> Any:
    _charge(1)
    return _choose(max, args, key, default)


def any_(iterable: Any) -> bool:
    return any(consume(iterable))


def all_(iterable: Any) -> bool:
    return all(consume(iterable))


# -- heaps and bisect: every comparison charged -------------------------------------------------

def _less(a: Any, b: Any) -> bool:
    _charge(1)
    return bool(_lt_(a, b))


def _siftdown(heap: list[Any], start: int, pos: int) -> None:
    item = heap[pos]
    while pos > start:
        parent = (pos - 1) >> 1
        if _less(item, heap[parent]):
            heap[pos] = heap[parent]
            pos = parent
            continue
        break
    heap[pos] = item


def _siftup(heap: list[Any], pos: int) -> None:
    end, start, item = len(heap), pos, heap[pos]
    child = 2 * pos + 1
    while child < end:
        right = child + 1
        if right < end and not _less(heap[child], heap[right]):
            child = right
        heap[pos] = heap[child]
        pos, child = child, 2 * child + 1
    heap[pos] = item
    _siftdown(heap, start, pos)


def _heap(h: Any) -> list[Any]:
    if type(h) is not list:
        raise TypeError("heap argument must be a list")
    return h


def heappush(heap: Any, item: Any) -> None:
    h = _heap(heap)
    if len(h) >= MAX_SIZE:
        raise ResourceLimit(f"a heap of more than {MAX_SIZE} items")
    h.append(item)
    _siftdown(h, 0, len(h) - 1)


def heappop(heap: Any) -> Any:
    h = _heap(heap)
    last = h.pop()
    if h:
        top, h[0] = h[0], last
        _siftup(h, 0)
        return top
    return last


def heapreplace(heap: Any, item: Any) -> Any:
    h = _heap(heap)
    top, h[0] = h[0], item
    _siftup(h, 0)
    return top


def heappushpop(heap: Any, item: Any) -> Any:
    h = _heap(heap)
    if h and _less(h[0], item):
        item, h[0] = h[0], item
        _siftup(h, 0)
    return item


def heapify(heap: Any) -> None:
    h = _heap(heap)
    types = set(map(type, h))
    if types <= _ATOMS | _STRS:          # comparisons of numbers and strings: native is bounded
        charge_items(2 * len(h) + (2 * _strs(h) if types & _STRS else 0))
        _heapq.heapify(h)
        return
    for i in reversed(range(len(h) // 2)):
        _siftup(h, i)


def nsmallest(n: int, iterable: Any, key: Any = None) -> list[Any]:
    return sorted_(iterable, key=key)[:n]


def nlargest(n: int, iterable: Any, key: Any = None) -> list[Any]:
    return sorted_(iterable, key=key, reverse=True)[:n]


def merge(*iterables: Any, key: Any = None, reverse: bool = False) -> Any:
    items: list[Any] = []
    for it in iterables:
        items.extend(consume(it))
    return iter(sorted_(items, key=key, reverse=reverse))


def _probe(x: Any, a: Any) -> None:
    """A bisection compares x with about log2(len(a)) items."""
    charge_items(unfold(x) * (_log2(len(a)) + 1))


def charged_key(key: Any) -> Any:
    """A key function whose results native code compares: each result charged its U."""
    if key is None:
        return None

    def call(item: Any) -> Any:
        k = key(item)
        charge_items(unfold(k))
        return k
    return call


def _bisecting(fn: Callable[..., Any], inserts: bool) -> Callable[..., Any]:
    def call(a: Any, x: Any, *args: Any, **kwargs: Any) -> Any:
        _charge(1)
        if kwargs.get("key") is not None:
            kwargs["key"] = charged_key(kwargs["key"])
        _probe(x, a)
        if inserts:
            if len(a) >= MAX_SIZE:
                raise ResourceLimit(f"a sequence of more than {MAX_SIZE} items")
            _charge(len(a) >> 6)
        return fn(a, x, *args, **kwargs)
    call.__name__ = fn.__name__
    return call


HEAPQ = {"heappush": heappush, "heappop": heappop, "heapify": heapify,
         "heapreplace": heapreplace, "heappushpop": heappushpop, "nlargest": nlargest,
         "nsmallest": nsmallest, "merge": merge}
BISECT = {n: _bisecting(getattr(_bisect, n), n.startswith("insort")) for n in (
    "bisect", "bisect_left", "bisect_right", "insort", "insort_left", "insort_right")}


# -- method wrappers ----------------------------------------------------------------------------

def _scan(shift: int, sized: bool = True) -> Callable[[Any, str], Any]:
    """Work proportional to the value's length (a copy, a reverse, a predicate of a str)."""
    def make(obj: Any, name: str) -> Any:
        method = getattr(obj, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            _charge(1 + (len(obj) >> shift))
            out = method(*args, **kwargs)
            return _sized(out, f"{name}()") if sized else out
        return call
    return make


def _keyed(obj: Any, name: str) -> Any:
    """A method whose first argument is hashed (dict.get, set.add, ...)."""
    method = getattr(obj, name)

    def call(*args: Any, **kwargs: Any) -> Any:
        if args:
            _key_(args[0])
        return method(*args, **kwargs)
    return call


def _search(obj: Any, name: str) -> Any:
    """A method that compares its argument with every item (list.index, count, remove)."""
    method = getattr(obj, name)

    def call(*args: Any, **kwargs: Any) -> Any:
        n = len(obj)
        charge_items(n * (unfold(args[0]) if args else 1))
        return method(*args, **kwargs)
    return call


def _hashing(obj: Any, name: str) -> Any:
    """A method that hashes every item of its arguments (set.update, dict.fromkeys...)."""
    method = getattr(obj, name)

    def call(*args: Any, **kwargs: Any) -> Any:
        _charge(1 + (len(obj) >> 3) if hasattr(obj, "__len__") else 1)
        out = method(*(keys(a) for a in args), **kwargs)
        if out is None:
            members(obj)                   # grown in place
            return out
        return members(_sized(out, f"{name}()"))
    return call


def _consuming(obj: Any, name: str) -> Any:
    """A method that takes in a whole iterable (extend)."""
    method = getattr(obj, name)

    def call(items: Any) -> Any:
        if hasattr(items, "__len__") and len(obj) + len(items) > MAX_SIZE:
            raise ResourceLimit(f"{name}() would hold more than {MAX_SIZE} items")
        method(consume(items))
        _sized(obj, f"{name}()")
    return call


def _sorting(obj: Any, name: str) -> Any:
    def call(*, key: Any = None, reverse: bool = False) -> None:
        sort(obj, key, reverse)
    return call


def _most_common(obj: Any, name: str) -> Any:
    def call(n: Any = None) -> Any:
        charge_value(list(obj.values()))
        _charge(len(obj) >> 3)
        return _sized(obj.most_common(n), "most_common()")
    return call


def _affixed(obj: Any, name: str) -> Any:
    """startswith / endswith: a comparison with each prefix given."""
    method = getattr(obj, name)

    def call(prefix: Any, *args: Any) -> Any:
        ps = prefix if type(prefix) is tuple else (prefix,)
        _charge(1 + len(ps) + sum(len(p) for p in ps if isinstance(p, (str, bytes))) // 64)
        return method(prefix, *args)
    return call


def _stripping(obj: Any, name: str) -> Any:
    """strip(chars): each stripped character is looked up among `chars`."""
    method = getattr(obj, name)

    def call(chars: Any = None) -> Any:
        m = len(chars) if isinstance(chars, (str, bytes, bytearray)) else 1
        charge_items(len(obj) * (m >> 3 or 1) // 8)
        return _sized(method(chars), f"{name}()")
    return call


def _insert(obj: Any, name: str) -> Any:
    method = getattr(obj, name)

    def call(*args: Any) -> Any:
        if len(obj) >= MAX_SIZE:
            raise ResourceLimit(f"a sequence of more than {MAX_SIZE} items")
        _charge(1 + (len(obj) >> 6))
        return method(*args)
    return call


def _pop(obj: Any, name: str) -> Any:
    k = kind(type(obj))
    if k == MAP:
        return _keyed(obj, name)
    if k == SET:
            return _ordered_set(obj).pop
    if type(obj) is list or type(obj) is bytearray:
        return _scan(6, sized=False)(obj, name)      # pop(i) moves the items after i
    return obj.pop


def _fromhex(obj: Any, name: str) -> Any:
    method = getattr(obj, name)

    def call(text: Any) -> Any:
        if isinstance(text, (str, bytes)):
            _charge(1 + (len(text) >> 6))
        return _sized(method(text), f"{name}()")
    return call


def _guarded(obj: Any, name: str) -> Any:
    """The checks that limits.py already had for growing and formatting methods."""
    return _guarded_method(obj, name)


def _mapping_refused(obj: Any, name: str) -> Any:
    raise AttributeError(f"attribute {name!r} of {type(obj).__name__} is not available in "
                         "gesmas classes")


Rule = Callable[[Any, str], Any] | None

_STR_SCAN = _scan(6)
_STR_METHODS: dict[str, Rule] = {
    **{n: _STR_SCAN for n in """isalnum isalpha isascii isdecimal isdigit isidentifier
        islower isnumeric isprintable isspace istitle isupper removeprefix removesuffix
        rindex""".split()},
    **{n: _guarded for n in """center ljust rjust zfill expandtabs join replace translate
        encode decode hex upper lower title capitalize swapcase casefold partition rpartition
        sort copy index count find rfind split rsplit splitlines format format_map""".split()},
    "strip": _stripping, "lstrip": _stripping, "rstrip": _stripping,
    "startswith": _affixed, "endswith": _affixed, "maketrans": _hashing, "fromhex": _fromhex,
}
_BYTEARRAY: dict[str, Rule] = {"append": OK, "clear": OK, "copy": _scan(6), "extend": _consuming,
                               "insert": _insert, "pop": _pop, "remove": _scan(6),
                               "reverse": _scan(6)}
_SEQ_METHODS: dict[str, Rule] = {
    "append": OK, "appendleft": OK, "popleft": OK, "clear": OK, "maxlen": OK,
    "copy": _scan(3), "reverse": _scan(3), "rotate": _scan(3),
    "count": _search, "index": _search, "remove": _search,
    "extend": _consuming, "extendleft": _consuming, "insert": _insert, "pop": _pop,
    "sort": _sorting,
}
_MAP_METHODS: dict[str, Rule] = {
    "clear": OK, "keys": OK, "values": OK, "items": OK, "popitem": OK, "default_factory": OK,
    "copy": _scan(3), "total": _scan(3),
    "get": _keyed, "pop": _pop, "setdefault": _keyed, "move_to_end": _keyed,
    "update": _hashing, "subtract": _hashing, "fromkeys": _hashing,
    "most_common": _most_common, "elements": _guarded,
}
def _adding(obj: Any, name: str) -> Any:
    method = getattr(obj, name)

    def call(item: Any) -> None:
        method(_member_(item))
    return call


_SET_METHODS: dict[str, Rule] = {
    "clear": OK, "copy": _scan(3), "add": _adding, "discard": _keyed, "remove": _keyed,
    "pop": _pop,
    **{n: _hashing for n in """difference difference_update intersection intersection_update
        isdisjoint issubset issuperset symmetric_difference symmetric_difference_update union
        update""".split()},
}
_NUMBER: dict[str, Rule] = {
    **{n: OK for n in """as_integer_ratio bit_count bit_length conjugate denominator imag
        numerator real is_integer hex""".split()},
    "to_bytes": _guarded, "from_bytes": _guarded, "fromhex": _fromhex,
}
_VIEW: dict[str, Rule] = {"isdisjoint": _hashing, "mapping": _mapping_refused}

#: the methods of each kind (ATOM: the numbers; other atoms' attributes are not looked up here)
METHODS: dict[int, dict[str, Rule]] = {
    STR: _STR_METHODS, SEQ: _SEQ_METHODS, MAP: _MAP_METHODS, SET: _SET_METHODS,
    KEYS: _VIEW, ITEMS: _VIEW, VALUES: {"mapping": _mapping_refused},
}
_RANGE: dict[str, Rule] = {"start": OK, "stop": OK, "step": OK, "count": _search,
                           "index": _search}


def method(obj: Any, name: str) -> Any:
    """`obj.name` for a builtin value `obj`, checked and charged as this module says; the plain
    attribute for any other value (`None` as the answer means: not a builtin value)."""
    t = type(obj)
    k = kind(t)
    if name == "keywords" and isinstance(obj, _functools.partial):
        return dict(obj.keywords)               # a copy: the partial may be module-level
    if k == ATOM or k == RECORD or k == EXC or k == SLICE:
        if t is range:
            table: dict[str, Rule] = _RANGE
        elif isinstance(obj, (int, float, complex)):
            table = _NUMBER
        else:
            return getattr(obj, name)
    elif k == STR and isinstance(obj, bytearray):
        table = _BYTEARRAY if name in _BYTEARRAY else _STR_METHODS
    else:
        table = METHODS[k]
    if name not in table:
        if k == SEQ and isinstance(obj, tuple) and name in getattr(t, "_fields", ()):
            return getattr(obj, name)           # a namedtuple's field
        if hasattr(obj, name):
            raise AttributeError(f"{type(obj).__name__}.{name} is not available in gesmas "
                                 "classes")
        raise AttributeError(f"{type(obj).__name__!r} object has no attribute {name!r}")
    rule = table[name]
    if rule is None:
        return getattr(obj, name)
    return rule(obj, name)

"""The allowed modules as uploaded code sees them: proxies of vetted public names.

`import x` in uploaded code returns the `ModuleProxy` of x from `MODULES`, never the module:
names that reach the interpreter (`typing.sys`, `collections._sys`, `enum.bltns`), that
mutate process-wide state (`functools.lru_cache`, `collections.abc` registration) or that
make classes from strings (`dataclasses.make_dataclass`, the functional Enum API) are not
there. Iterators from itertools spend steps per item; math functions that make huge numbers
check their arguments.
"""
from __future__ import annotations

import bisect as _bisect
import collections as _collections
import dataclasses as _dataclasses
import enum as _enum
import functools as _functools
import heapq as _heapq
import itertools as _itertools
import math as _math
import sys as _sys
import types as _types
import typing as _typing
from typing import Any, Callable

from .budget import MAX_BITS, MAX_SIZE, ResourceLimit, _charge, _cost, _sized
from .charge import SELF_COUNTED, Counted, _key_, charge_value, consume, keys
from .limits import _mul_
from .natives import BISECT, HEAPQ, charged_key

class ModuleProxy:
    """An allowed module as uploaded code sees it: a fixed set of vetted public names."""

    __slots__ = ("_name", "_names")

    def __init__(self, name: str, names: dict[str, Any]) -> None:
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_names", names)

    def __getattr__(self, attr: str) -> Any:
        try:
            return self._names[attr]
        except KeyError:
            raise AttributeError(f"module {self._name!r} has no attribute {attr!r} in gesmas "
                                 "classes") from None

    def __setattr__(self, attr: str, value: Any) -> None:
        raise TypeError(f"module {self._name!r} is read-only")

    def __repr__(self) -> str:
        return f"<module {self._name!r}>"

    __hash__ = None  # type: ignore[assignment]


class _Counted:
    """An iterator that spends steps per item it hands out (one, plus the item's size)."""

    __slots__ = ("_it",)

    def __init__(self, it: Any) -> None:
        self._it = iter(it)

    def __iter__(self) -> _Counted:
        return self

    def __next__(self) -> Any:
        item = next(self._it)
        _charge(1 + (len(item) >> 3 if type(item) is tuple else _cost(item)))
        return item

    def __repr__(self) -> str:
        return "<iterator>"


SELF_COUNTED.add(_Counted)


def _counted(fn: Callable[..., Any], check: Callable[..., None] | None = None
             ) -> Callable[..., Any]:
    @_functools.wraps(fn)
    def make(*args: Any, **kwargs: Any) -> Any:
        if check is not None:
            check(*args, **kwargs)
        return _Counted(fn(*args, **kwargs))
    return make


def _check_product(*pools: Any, repeat: int = 1) -> None:
    n = sum(len(p) if hasattr(p, "__len__") else MAX_SIZE + 1 for p in pools)
    if type(repeat) is not int or n * max(repeat, 1) > MAX_SIZE:
        raise ResourceLimit("product() of inputs this large is not allowed")


def _check_r(iterable: Any, r: Any = None) -> None:
    if r is not None and (type(r) is not int or r > 4096):
        raise ResourceLimit("r over 4096 is not allowed")


def _check_tee(iterable: Any, n: int = 2) -> None:
    if type(n) is not int or n > 1024:
        raise ResourceLimit("tee() of more than 1024 iterators is not allowed")


def _tee(iterable: Any, n: int = 2) -> tuple[_Counted, ...]:
    _check_tee(iterable, n)
    return tuple(_Counted(t) for t in _itertools.tee(iterable, n))


def _limit_n(fn: Callable[..., Any], limit: int) -> Callable[..., Any]:
    @_functools.wraps(fn)
    def call(*args: Any) -> Any:
        if any(isinstance(a, int) and int(a) > limit for a in args):
            raise ResourceLimit(f"{fn.__name__}() of numbers over {limit} is not allowed")
        n = max((int(a) for a in args if isinstance(a, int)), default=0)
        _charge((n * n) >> 10)               # products of n numbers of up to n bits
        return fn(*(int(a) if isinstance(a, int) else a for a in args))
    return call


def _prod(iterable: Any, *, start: Any = 1) -> Any:
    r = start
    for x in iterable:
        _charge(1)
        r = _mul_(r, x)
    return r


def _lcm(*ints: Any) -> Any:
    if sum(i.bit_length() for i in ints if type(i) is int) > MAX_BITS:
        raise ResourceLimit(f"lcm() could have more than {MAX_BITS} bits")
    return _math.lcm(*ints)


def _no_functional_api(cls: Any, *args: Any, **kwargs: Any) -> Any:
    raise TypeError("the functional Enum API is not available in gesmas classes; "
                    "use a class statement")


class _EnumType(_enum.EnumType):
    """The metaclass of uploaded enums: a lookup by value (`E(v)`), by name (`E[n]`) or a
    membership test hashes its argument, charged first."""

    def __call__(cls, value: Any, *args: Any, **kwargs: Any) -> Any:
        if not args and not kwargs:
            _key_(value)
        return super().__call__(value, *args, **kwargs)

    def __getitem__(cls, name: Any) -> Any:
        return super().__getitem__(_key_(name))

    def __contains__(cls, value: Any) -> bool:
        return super().__contains__(_key_(value))


class _Enum_Enum(_enum.Enum, metaclass=_EnumType):
    pass


class _Enum_IntEnum(_enum.IntEnum, metaclass=_EnumType):
    pass


class _Enum_Flag(_enum.Flag, metaclass=_EnumType):
    pass


class _Enum_IntFlag(_enum.IntFlag, metaclass=_EnumType):
    pass


class _Enum_StrEnum(_enum.StrEnum, metaclass=_EnumType):
    pass


for _base in (_Enum_Enum, _Enum_IntEnum, _Enum_Flag, _Enum_IntFlag, _Enum_StrEnum):
    type.__setattr__(_base, "_create_", classmethod(_no_functional_api))


#: the classes made by the source being loaded now (set by the registry), else None
LOADING: list[list[type] | None] = [None]


def _at_load(decorator: Callable[..., Any]) -> Callable[..., Any]:
    """A class decorator that changes the class it gets (dataclass, total_ordering): only for
    a class the source being loaded has just made, never at run time, never another class."""
    def check(cls: Any) -> Any:
        made = LOADING[0]
        if made is None or not any(cls is c for c in made):
            raise TypeError(f"{decorator.__name__} applies only to a class of this source, "
                            "as a decorator where the class is defined")
        return cls

    def apply(cls: Any, kwargs: dict[str, Any]) -> Any:
        cls = check(cls)
        if decorator is not _dataclasses.dataclass:
            return decorator(cls, **kwargs)
        n = annotated_fields(cls)
        if n > MAX_FIELDS:
            raise ResourceLimit(f"dataclass {cls.__name__}: {n} fields, more than "
                                f"{MAX_FIELDS}")
        out = decorator(cls, **kwargs)
        _charged_init(out, n)
        return out

    @_functools.wraps(decorator)
    def wrapper(cls: Any = None, /, **kwargs: Any) -> Any:
        if kwargs.get("slots"):
            raise TypeError("dataclass(slots=True) is not available in gesmas classes")
        if cls is None:
            return lambda c: apply(c, kwargs)
        return apply(cls, kwargs)
    return wrapper


def annotated_fields(cls: type) -> int:
    """How many annotations `cls` and its bases hold: an upper bound of the fields a
    dataclass or NamedTuple of it gets."""
    return sum(len(vars(c).get("__annotations__", ())) for c in cls.__mro__)


def _charged_init(cls: type, n: int) -> None:
    """The __init__ a dataclass generated assigns every field in uncounted code: wrap it so
    that each call is charged first (one step per 8 fields), as the rest of native work is.
    An __init__ written in the class (compiled from the upload) counts its own steps."""
    init = vars(cls).get("__init__")
    if not isinstance(init, _types.FunctionType) or \
            init.__code__.co_filename.startswith("<class source "):
        return
    cost = 1 + (n >> 3)

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        _charge(cost)
        init(self, *args, **kwargs)

    __init__.__qualname__ = f"{cls.__qualname__}.__init__"
    __init__.__gesmas_charged__ = True       # type: ignore[attr-defined]  # sandbox._special
    type.__setattr__(cls, "__init__", __init__)


MAX_FIELDS = 1000


def _namedtuple(typename: Any, field_names: Any, **kwargs: Any) -> Any:
    """collections.namedtuple while the source loads (it compiles a class), at most
    MAX_FIELDS fields."""
    if LOADING[0] is None:
        raise TypeError("namedtuple() makes a class: only at the top of the source, while it "
                        "loads, not inside a call")
    if isinstance(field_names, str):
        field_names = field_names.replace(",", " ").split()
    names = list(consume(field_names))
    if len(names) > MAX_FIELDS:
        raise ResourceLimit(f"a namedtuple of more than {MAX_FIELDS} fields")
    if "defaults" in kwargs and kwargs["defaults"] is not None:
        kwargs["defaults"] = list(consume(kwargs["defaults"]))
    kwargs["module"] = _sys._getframe(1).f_globals.get("__name__")   # the uploaded source's
    return _collections.namedtuple(typename, names, **kwargs)


class _Partial(_functools.partial):
    """functools.partial whose every call is charged for the arguments it passes on (a
    partial of a native function would copy them each time for free)."""

    def __call__(self, /, *args: Any, **kwargs: Any) -> Any:
        n = len(self.args) + len(self.keywords)
        if n >= 8:
            _charge(n >> 3)
        return super().__call__(*args, **kwargs)


def _pooled(fn: Callable[..., Any], check: Callable[..., None] | None = None
            ) -> Callable[..., Any]:
    """An itertools function that copies its inputs into tuples first (product,
    permutations, combinations): the copies are charged, then each output item."""
    @_functools.wraps(fn)
    def make(*args: Any, **kwargs: Any) -> Any:
        if check is not None:
            check(*args, **kwargs)
        return _Counted(fn(*(consume(a) if not isinstance(a, int) else a for a in args),
                           **kwargs))
    return make


def _pick(module: Any, names: str) -> dict[str, Any]:
    return {n: getattr(module, n) for n in names.split()}


def _deque(iterable: Any = (), maxlen: Any = None) -> Any:
    return _sized(_collections.deque(consume(iterable), maxlen), "deque()")


def _hashed_container(cls: type) -> Callable[..., Any]:
    """Counter / OrderedDict / defaultdict: each hashes every key it is given."""
    def make(*args: Any, **kwargs: Any) -> Any:
        if cls is _collections.defaultdict:
            head, rest = args[:1], args[1:]
        else:
            head, rest = (), args
        return _sized(cls(*head, *(keys(a) for a in rest), **dict(consume(kwargs))),
                      cls.__name__)
    make.__name__ = cls.__name__
    return make


class _Hashed(type):
    """A collections class as uploaded code sees it: isinstance works, calls are charged."""

    _real: type
    _make: Callable[..., Any]

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, cls._real)

    def __subclasscheck__(cls, sub: Any) -> bool:
        return issubclass(sub, cls._real)

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        return cls._make(*args, **kwargs)

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        raise AttributeError(f"{cls._real.__name__}.{name} is not available in gesmas "
                             "classes (call it on an instance)")

    def __repr__(cls) -> str:
        return repr(cls._real)


def _wrapped(real: type, make: Callable[..., Any]) -> type:
    name = "_collections_" + real.__name__
    cls = _Hashed(name, (), {"_real": real, "__module__": __name__, "__qualname__": name})
    type.__setattr__(cls, "_make", staticmethod(make))
    globals()[name] = cls                  # found by pickle (defaultdict(deque) in a state)
    return cls


def _reduce(function: Any, iterable: Any, *initial: Any) -> Any:
    return _functools.reduce(function, consume(iterable), *initial)


def _deep_copy(fn: Callable[..., Any]) -> Callable[..., Any]:
    """dataclasses.asdict / astuple copy every value they reach: charged by the unfolded size."""
    @_functools.wraps(fn)
    def call(obj: Any, *args: Any, **kwargs: Any) -> Any:
        charge_value(obj)
        return fn(obj, *args, **kwargs)
    return call


def _consuming(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A math function that reads whole iterables (fsum, dist, sumprod)."""
    @_functools.wraps(fn)
    def call(*args: Any) -> Any:
        return fn(*(consume(a) if not isinstance(a, (int, float)) else a for a in args))
    return call


def _skipping(fn: Callable[..., Any], at: int,
              each: Callable[[Any], Any] | None = None) -> Callable[..., Any]:
    """An itertools function that can pass over items without handing them out (islice,
    dropwhile, filterfalse, compress, groupby): its input is counted per item it reads."""
    @_functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        a = list(args)
        for i in range(len(a)) if at < 0 else (at,):
            if i < len(a):
                a[i] = Counted(a[i], each)
        return _Counted(fn(*a, **kwargs))
    return call


def _grouping(iterable: Any, key: Any = None) -> Any:
    """itertools.groupby: it compares neighbours' keys natively, each charged first."""
    if key is None:
        return _Counted(_itertools.groupby(Counted(iterable, charge_value)))
    return _Counted(_itertools.groupby(Counted(iterable), charged_key(key)))


def _bigint(fn: Callable[..., Any]) -> Callable[..., Any]:
    """math.isqrt and the like on a big integer: quadratic in its bits."""
    @_functools.wraps(fn)
    def call(*args: Any) -> Any:
        bits = max((int.bit_length(int(a)) for a in args if isinstance(a, int)), default=0)
        _charge((bits * bits) >> 16)
        return fn(*args)
    return call


MODULES: dict[str, ModuleProxy] = {
    "collections": ModuleProxy("collections", {
        "deque": _wrapped(_collections.deque, _deque),
        "defaultdict": _wrapped(_collections.defaultdict,
                                _hashed_container(_collections.defaultdict)),
        "OrderedDict": _wrapped(_collections.OrderedDict,
                                _hashed_container(_collections.OrderedDict)),
        "Counter": _wrapped(_collections.Counter, _hashed_container(_collections.Counter)),
        "namedtuple": _namedtuple}),
    "heapq": ModuleProxy("heapq", dict(HEAPQ)),
    "bisect": ModuleProxy("bisect", dict(BISECT)),
    "math": ModuleProxy("math", {
        **{n: getattr(_math, n) for n in dir(_math)
           if not n.startswith("_") and n not in ("factorial", "comb", "perm", "prod", "lcm")},
        "factorial": _limit_n(_math.factorial, 5000), "comb": _limit_n(_math.comb, 5000),
        "perm": _limit_n(_math.perm, 5000), "prod": _prod, "lcm": _lcm,
        "isqrt": _bigint(_math.isqrt), "gcd": _bigint(_math.gcd),
        **{n: _consuming(getattr(_math, n)) for n in ("fsum", "dist", "sumprod")
           if hasattr(_math, n)}}),
    "itertools": ModuleProxy("itertools", {
        **{n: _counted(getattr(_itertools, n)) for n in (
            "accumulate chain count cycle pairwise repeat starmap takewhile "
            "zip_longest").split()},
        "islice": _skipping(_itertools.islice, 0), "dropwhile": _skipping(_itertools.dropwhile, 1),
        "filterfalse": _skipping(_itertools.filterfalse, 1),
        "compress": _skipping(_itertools.compress, -1),
        "groupby": _grouping,
        "product": _pooled(_itertools.product, _check_product),
        "permutations": _pooled(_itertools.permutations, _check_r),
        "combinations": _pooled(_itertools.combinations, _check_r),
        "combinations_with_replacement": _pooled(_itertools.combinations_with_replacement,
                                                 _check_r),
        "tee": _tee}),
    "functools": ModuleProxy("functools", {
        **_pick(_functools, "partialmethod cmp_to_key"), "reduce": _reduce,
        "partial": _Partial,
        "total_ordering": _at_load(_functools.total_ordering)}),
    "dataclasses": ModuleProxy("dataclasses", {**_pick(
        _dataclasses, "field fields replace is_dataclass "
                      "FrozenInstanceError InitVar MISSING KW_ONLY"),
        "asdict": _deep_copy(_dataclasses.asdict), "astuple": _deep_copy(_dataclasses.astuple),
        "dataclass": _at_load(_dataclasses.dataclass)}),
    "enum": ModuleProxy("enum", {
        "Enum": _Enum_Enum, "IntEnum": _Enum_IntEnum, "Flag": _Enum_Flag,
        "IntFlag": _Enum_IntFlag, "StrEnum": _Enum_StrEnum, "auto": _enum.auto,
        "unique": _enum.unique}),
    "typing": ModuleProxy("typing", {
        **_pick(_typing, "Any Optional Union List Dict Set FrozenSet Tuple Callable Iterable "
                         "Iterator Sequence Mapping MutableMapping Deque DefaultDict NamedTuple "
                         "ClassVar Final Literal Generic TypeVar cast overload"),
        "TYPE_CHECKING": False}),
}
ALLOWED_IMPORTS = tuple(MODULES)
#: what `type(x)` answers for values of these native classes: the dialect's checked ones
STAND_INS: dict[type, Any] = {
    _collections.deque: MODULES["collections"].deque,
    _collections.defaultdict: MODULES["collections"].defaultdict,
    _collections.OrderedDict: MODULES["collections"].OrderedDict,
    _collections.Counter: MODULES["collections"].Counter,
    _Partial: _Partial, _Counted: _Counted, Counted: Counted,
}
# classes from the proxies above that uploaded classes may derive from (with their metaclass)

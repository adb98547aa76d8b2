"""What uploaded code runs with: guarded builtins, module proxies and size checks.

`dialect.py` rewrites the source so that the operations below go through the functions here;
this module supplies them (`make_globals`). The rules they keep (DESIGN §7a):

- Allowed modules are handed out as `ModuleProxy` objects holding a vetted list of public
  functions and classes, never the module itself (`typing.sys`, `collections._sys`,
  `enum.bltns` are not reachable).
- An attribute whose name starts with `_` is readable only on instances of uploaded classes
  (and on uploaded classes); an attribute can be written only on instances of uploaded classes
  (not on a class, a module, a function, a `Semaphore` or a context).
- Classes are made only while the source loads, with the metaclass `type` (or the enum or
  NamedTuple ones), never from a kernel class; `type()` takes one argument and refuses a class.
- Identity is not observable: `object()` instances, uploaded classes without `__repr__` /
  `__hash__` get a repr without an address and refuse `hash()`; `repr()` and format
  conversions remove addresses from what builtins print.
- Work done in native code is bounded: integer results over MAX_BITS bits and sequences over
  MAX_SIZE items are refused, and big results cost steps (`_charge`), so one call cannot spend
  more memory or time than its step budget allows.

Any violation raises an ordinary exception (TypeError, AttributeError, ResourceLimit...) in the
calling method, the same on every replica.
"""
from __future__ import annotations

import bisect as _bisect
import builtins
import collections as _collections
import dataclasses as _dataclasses
import enum as _enum
import functools as _functools
import heapq as _heapq
import itertools as _itertools
import math as _math
import re
import typing as _typing
from typing import Any, Callable

from . import sched

MAX_BITS = 1 << 16          # largest integer an operation may produce, in bits
MAX_SIZE = 1 << 22          # longest str/bytes/list/tuple an operation may produce
MAX_WIDTH = 10_000          # largest width or precision in a format specification

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


class ResourceLimit(Exception):
    """An operation would produce a value bigger than the dialect allows."""


class Budget:
    """Steps left to the running request. Reset by the kernel each time it resumes one.
    `current` is the budget of the kernel running uploaded code now (one at a time per
    process: kernels are single-threaded and never nest)."""

    __slots__ = ("steps", "limit")
    current: Budget | None = None

    def __init__(self, limit: int) -> None:
        self.steps = 0
        self.limit = limit


def _charge(n: int) -> None:
    b = Budget.current
    if b is not None:
        b.steps += n
        if b.steps > b.limit:
            raise sched.BudgetExceeded(b.limit)


def _cost(v: Any) -> int:
    """Steps a freshly made value costs: one per 64 bytes (8 references) it holds."""
    t = type(v)
    if t is str or t is bytes or t is bytearray:
        return len(v) >> 6
    if t is list or t is tuple:
        return len(v) >> 3
    if t is int:
        return v.bit_length() >> 9
    return 0


def _sized(v: Any, what: str) -> Any:
    t = type(v)
    if t is int:
        if v.bit_length() > MAX_BITS:
            raise ResourceLimit(f"{what} would have more than {MAX_BITS} bits")
    elif t in _SEQ and len(v) > MAX_SIZE:
        raise ResourceLimit(f"{what} would hold more than {MAX_SIZE} items")
    n = _cost(v)
    if n:
        _charge(n)
    return v


_SEQ = (str, bytes, bytearray, list, tuple)
_SEQ_ALL = (str, bytes, bytearray, list, tuple, _collections.deque)


# -- identity-free base objects ----------------------------------------------------------------

def _no_hash(self: Any) -> int:
    raise TypeError(f"{type(self).__name__} objects have no hash: an identity hash differs "
                    "between replicas (define __eq__ and __hash__, or key by a value)")


def _plain_repr(self: Any) -> str:
    return f"<{type(self).__name__} object>"


class Object:
    """`object` in uploaded code: no address in its repr, no identity hash."""

    __slots__ = ()
    __hash__ = _no_hash
    __repr__ = _plain_repr


class SyncObject(Object):
    """Optional base class for gesmas objects. Public methods are invocable; a method
    `_on_session_end(self, session)` is called when a session that used the object ends."""

    __slots__ = ()


# -- arithmetic with size checks (dialect.py rewrites the operators to these) -------------------

def _mul_(a: Any, b: Any) -> Any:
    ta, tb = type(a), type(b)
    if ta is int and tb is int:
        if a.bit_length() + b.bit_length() > MAX_BITS:
            raise ResourceLimit(f"a product would have more than {MAX_BITS} bits")
    elif isinstance(b, int) and isinstance(a, _SEQ_ALL):
        if len(a) * b > MAX_SIZE:
            raise ResourceLimit(f"repetition would hold more than {MAX_SIZE} items")
    elif isinstance(a, int) and isinstance(b, _SEQ_ALL):
        if len(b) * a > MAX_SIZE:
            raise ResourceLimit(f"repetition would hold more than {MAX_SIZE} items")
    return _sized(a * b, "a product")


def _add_(a: Any, b: Any) -> Any:
    r = a + b
    t = type(r)
    if t is int or t is float:
        return r
    return _sized(r, "a concatenation")


def _pow_(a: Any, b: Any, mod: Any = None) -> Any:
    if type(a) is int and type(b) is int and b > 0:
        if mod is None:
            if a not in (0, 1, -1) and a.bit_length() * b > MAX_BITS:
                raise ResourceLimit(f"a power would have more than {MAX_BITS} bits")
        elif type(mod) is int and b.bit_length() * max(mod.bit_length(), 1) > MAX_BITS * 64:
            raise ResourceLimit("a modular power with numbers this big is not allowed")
    return _sized(pow(a, b) if mod is None else pow(a, b, mod), "a power")


def _lshift_(a: Any, b: Any) -> Any:
    if type(a) is int and type(b) is int and a and b > MAX_BITS:
        raise ResourceLimit(f"a shift would make more than {MAX_BITS} bits")
    return _sized(a << b, "a shift")


def _divcost(a: Any, b: Any) -> None:
    if type(a) is int and type(b) is int:
        n = (a.bit_length() * b.bit_length()) >> 14
        if n:
            _charge(n)


def _floordiv_(a: Any, b: Any) -> Any:
    _divcost(a, b)
    return a // b


_FORMAT_NUMBER = re.compile(r"%[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?")
_SPEC_NUMBER = re.compile(r"\d+")


def _check_widths(fmt: Any) -> None:
    if isinstance(fmt, bytes):
        fmt = fmt.decode("latin-1")
    for m in _FORMAT_NUMBER.finditer(fmt):
        for g in m.groups():
            if g == "*":
                raise ResourceLimit("'*' widths are not allowed in % formats")
            if g is not None and int(g) > MAX_WIDTH:
                raise ResourceLimit(f"format width {g} is over {MAX_WIDTH}")


def _mod_(a: Any, b: Any) -> Any:
    if isinstance(a, (str, bytes)):
        _check_widths(a)
        return _sized(_scrub(a % b) if type(a) is str else a % b, "a formatted string")
    _divcost(a, b)
    return a % b


def _divmod_(a: Any, b: Any) -> Any:
    _divcost(a, b)
    return divmod(a, b)


def _check_spec(spec: str) -> None:
    for n in _SPEC_NUMBER.findall(spec):
        if int(n) > MAX_WIDTH:
            raise ResourceLimit(f"format width {n} is over {MAX_WIDTH}")


def _scrub(s: str) -> str:
    return _ADDRESS.sub("", s) if " at 0x" in s else s


def _fmt_(value: Any, conversion: int, spec: Any) -> str:
    """One f-string field: `f"{value!conversion:spec}"`."""
    if conversion == 114:        # !r
        value = _repr_(value)
    elif conversion == 115:      # !s
        value = str(value)
    elif conversion == 97:       # !a
        value = ascii(value)
    if spec:
        _check_spec(spec)
    return _sized(_scrub(format(value, spec)), "a formatted string")


def _format_(value: Any, spec: str = "") -> str:
    return _fmt_(value, -1, spec)


def _repr_(obj: Any) -> str:
    return _scrub(repr(obj))


def _hash_(obj: Any) -> int:
    if type(obj).__hash__ is object.__hash__:
        _no_hash(obj)
    return hash(obj)


# -- str/bytes methods whose result can outgrow their input --------------------------------------

def _safe_format(s: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    return _sized(_scrub(_SafeFormatter().vformat(s, args, kwargs)), "a formatted string")


class _SafeFormatter:
    """str.format without attribute fields (`{0.attr}`) and with bounded widths."""

    def vformat(self, s: str, args: tuple[Any, ...], kwargs: Any) -> str:
        import string
        f = string.Formatter()
        out = []
        auto = 0
        for literal, field, spec, conv in f.parse(s):
            out.append(literal)
            if field is None:
                continue
            if "." in field or "[" in field:
                raise ValueError(f"format field {field!r}: only plain positions and names "
                                 "are allowed in gesmas classes")
            if field == "":
                field, auto = str(auto), auto + 1
            value = args[int(field)] if field.isdigit() else kwargs[field]
            if spec and "{" in spec:
                raise ValueError("nested format fields are not allowed")
            out.append(_fmt_(value, {"r": 114, "s": 115, "a": 97}.get(conv or "", -1),
                             spec or ""))
        return "".join(out)


def _width_method(name: str) -> Callable[..., Any]:
    def check(obj: Any) -> Any:
        method = getattr(obj, name)

        def call(*args: Any) -> Any:
            if args and type(args[0]) is int and args[0] > MAX_SIZE:
                raise ResourceLimit(f"{name}() to {args[0]} is over {MAX_SIZE}")
            return _sized(method(*args), f"{name}()")
        return call
    return check


def _growth_method(name: str) -> Callable[..., Any]:
    def check(obj: Any) -> Any:
        method = getattr(obj, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            if name == "join":
                items = list(args[0])
                total = len(obj) * max(len(items) - 1, 0) + sum(
                    len(x) for x in items if isinstance(x, (str, bytes, bytearray)))
                if total > MAX_SIZE:
                    raise ResourceLimit(f"join() would make more than {MAX_SIZE} items")
                return _sized(method(items), "join()")
            if name == "replace" and len(args) >= 2:
                old, new = args[0], args[1]
                grows = max(len(new) - len(old), 0) * (len(obj) + 1)
                if len(obj) + grows > MAX_SIZE:
                    raise ResourceLimit(f"replace() could make more than {MAX_SIZE} items")
            if name == "to_bytes" and args and type(args[0]) is int and args[0] > MAX_SIZE:
                raise ResourceLimit(f"to_bytes() of {args[0]} bytes is over {MAX_SIZE}")
            return _sized(method(*args, **kwargs), f"{name}()")
        return call
    return check


_STR_TYPES = (str, bytes, bytearray)


def _guarded_method(obj: Any, name: str) -> Any:
    """`obj.name` for a str/bytes/int method that is formatted or can grow its result."""
    if name == "format" and isinstance(obj, str):
        return lambda *a, **k: _safe_format(obj, a, k)
    if name == "format_map" and isinstance(obj, str):
        return lambda m: _safe_format(obj, (), m)
    guard = _GUARDED_METHODS.get(name)
    return guard(obj) if guard is not None else getattr(obj, name)
_GUARDED_METHODS: dict[str, Callable[[Any], Any]] = {
    **{n: _width_method(n) for n in ("center", "ljust", "rjust", "zfill", "expandtabs")},
    **{n: _growth_method(n) for n in ("join", "replace", "translate", "to_bytes")},
}
#: attribute names dialect.py sends through `_getattr_` even though they are public
GUARDED_NAMES = frozenset(_GUARDED_METHODS) | {"format", "format_map"}
_NAMEDTUPLE_API = frozenset(("_asdict", "_replace", "_fields", "_make", "_field_defaults"))
_INSPECT = frozenset("""ag_await ag_code ag_frame co_code cr_await cr_code cr_frame cr_origin
    f_back f_builtins f_code f_generator f_globals f_locals f_trace gi_code gi_frame
    gi_yieldfrom tb_frame tb_next mro""".split())


# -- module proxies ------------------------------------------------------------------------------

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
        if any(type(a) is int and a > limit for a in args):
            raise ResourceLimit(f"{fn.__name__}() of numbers over {limit} is not allowed")
        return fn(*args)
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


class _Enum_Enum(_enum.Enum):
    pass


class _Enum_IntEnum(_enum.IntEnum):
    pass


class _Enum_Flag(_enum.Flag):
    pass


class _Enum_IntFlag(_enum.IntFlag):
    pass


class _Enum_StrEnum(_enum.StrEnum):
    pass


for _base in (_Enum_Enum, _Enum_IntEnum, _Enum_Flag, _Enum_IntFlag, _Enum_StrEnum):
    type.__setattr__(_base, "_create_", classmethod(_no_functional_api))


def _pick(module: Any, names: str) -> dict[str, Any]:
    return {n: getattr(module, n) for n in names.split()}


_MODULES: dict[str, ModuleProxy] = {
    "collections": ModuleProxy("collections", _pick(
        _collections, "deque defaultdict OrderedDict Counter namedtuple ChainMap")),
    "heapq": ModuleProxy("heapq", _pick(
        _heapq, "heappush heappop heapify heapreplace heappushpop nlargest nsmallest merge")),
    "bisect": ModuleProxy("bisect", _pick(
        _bisect, "bisect bisect_left bisect_right insort insort_left insort_right")),
    "math": ModuleProxy("math", {
        **{n: getattr(_math, n) for n in dir(_math)
           if not n.startswith("_") and n not in ("factorial", "comb", "perm", "prod", "lcm")},
        "factorial": _limit_n(_math.factorial, 5000), "comb": _limit_n(_math.comb, 5000),
        "perm": _limit_n(_math.perm, 5000), "prod": _prod, "lcm": _lcm}),
    "itertools": ModuleProxy("itertools", {
        **{n: _counted(getattr(_itertools, n)) for n in (
            "accumulate chain compress count cycle dropwhile filterfalse groupby islice "
            "pairwise repeat starmap takewhile zip_longest").split()},
        "product": _counted(_itertools.product, _check_product),
        "permutations": _counted(_itertools.permutations, _check_r),
        "combinations": _counted(_itertools.combinations, _check_r),
        "combinations_with_replacement": _counted(_itertools.combinations_with_replacement,
                                                  _check_r),
        "tee": _tee}),
    "functools": ModuleProxy("functools", _pick(
        _functools, "reduce partial partialmethod cmp_to_key total_ordering cached_property")),
    "dataclasses": ModuleProxy("dataclasses", _pick(
        _dataclasses, "dataclass field fields asdict astuple replace is_dataclass "
                      "FrozenInstanceError InitVar MISSING KW_ONLY")),
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
ALLOWED_IMPORTS = tuple(_MODULES)
# classes from the proxies above that uploaded classes may derive from (with their metaclass)
_ALLOWED_BASES = frozenset({Object, SyncObject, _Enum_Enum, _Enum_IntEnum, _Enum_Flag,
                            _Enum_IntFlag, _Enum_StrEnum, _typing.Generic,
                            _collections.OrderedDict, _collections.defaultdict,
                            _collections.Counter, _collections.deque, dict, list, set, int, str,
                            float, tuple, bytes, frozenset})
_ALLOWED_BASES |= {getattr(_typing, "_NamedTuple")}
_ALLOWED_META = frozenset({type, _enum.EnumType, getattr(_typing, "NamedTupleMeta")})


# -- the guards that know which classes are uploaded ---------------------------------------------

class _StandIn(type):
    """Stand-in for a builtin type (`bytes`, `bytearray`, `str`): isinstance checks and
    type() comparisons work as with the type itself, calls are checked (a size for bytes, no
    addresses in str())."""

    _real: type

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, cls._real)

    def __subclasscheck__(cls, sub: Any) -> bool:
        return issubclass(_REAL[sub] if isinstance(sub, _StandIn) else sub, cls._real)

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        real = cls._real
        if real is str:
            if len(args) == 1 and not kwargs:
                return _sized(_scrub(str(args[0])), "str()")
            return _sized(str(*args, **kwargs), "str()")
        if args and isinstance(args[0], int) and args[0] > MAX_SIZE:
            raise ResourceLimit(f"{real.__name__}({args[0]}) is over {MAX_SIZE} bytes")
        return _sized(real(*args, **kwargs), real.__name__)

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(cls._real, name)

    def __repr__(cls) -> str:
        return repr(cls._real)


class bytes_(metaclass=_StandIn):
    _real = bytes


class bytearray_(metaclass=_StandIn):
    _real = bytearray


class str_(metaclass=_StandIn):
    _real = str


_STANDIN: dict[type, type] = {bytes: bytes_, bytearray: bytearray_, str: str_}
_REAL: dict[Any, type] = {v: k for k, v in _STANDIN.items()}


class UserTypes:
    """The classes one kernel's uploaded sources defined, and whether a source is loading."""

    def __init__(self) -> None:
        self.readable: set[type] = set()    # instances and the classes: `_` names readable
        self.writable: set[type] = set()    # instances whose attributes may be set
        self.loading: list[type] | None = None   # classes made by the source being loaded

    def add(self, cls: type) -> None:
        self.readable.add(cls)
        if not isinstance(cls, _enum.EnumType):
            self.writable.add(cls)


def make_guards(types: UserTypes, budget: Budget) -> dict[str, Any]:
    """The functions dialect.py calls, bound to one kernel's uploaded classes."""
    readable, writable = types.readable, types.writable

    def _step_() -> None:
        budget.steps += 1
        if budget.steps > budget.limit:
            raise sched.BudgetExceeded(budget.limit)

    def _stepc_() -> bool:
        budget.steps += 1
        if budget.steps > budget.limit:
            raise sched.BudgetExceeded(budget.limit)
        return True

    def _self_(obj: Any) -> None:
        """Entry of a method whose `self` is trusted with `self._name`."""
        budget.steps += 1
        if budget.steps > budget.limit:
            raise sched.BudgetExceeded(budget.limit)
        if type(obj) not in readable:
            raise TypeError(f"a method of an uploaded class was called on a "
                            f"{type(obj).__name__}")

    def _getattr_(obj: Any, name: str, *default: Any) -> Any:
        if type(name) is not str:
            raise TypeError("attribute name must be a str")
        if name.startswith("_"):
            if name.startswith("__") or not (
                    type(obj) in readable or obj in readable if isinstance(obj, type)
                    else type(obj) in readable or name in _NAMEDTUPLE_API):
                if default:
                    return default[0]
                raise AttributeError(f"attribute {name!r} of {type(obj).__name__} is not "
                                     "accessible in gesmas classes")
        elif name in _INSPECT:
            raise AttributeError(f"attribute {name!r} is not accessible in gesmas classes")
        elif name in GUARDED_NAMES:
            if isinstance(obj, _STR_TYPES + (int,)):
                return _guarded_method(obj, name)
            if isinstance(obj, type) and issubclass(_REAL.get(obj, obj), _STR_TYPES + (int,)):
                return lambda self, *a, **k: _guarded_method(self, name)(*a, **k)
        return getattr(obj, name, *default)

    def _write_(obj: Any) -> Any:
        if type(obj) in writable:
            return obj
        if isinstance(obj, type):
            raise TypeError(f"class {obj.__name__} is read-only after its source is loaded")
        raise TypeError(f"attributes of {type(obj).__name__} objects cannot be set in gesmas "
                        "classes (only instances of uploaded classes)")

    def _setattr_(obj: Any, name: str, value: Any) -> None:
        _name_ok(name)
        setattr(_write_(obj), name, value)

    def _delattr_(obj: Any, name: str) -> None:
        _name_ok(name)
        delattr(_write_(obj), name)

    def _hasattr_(obj: Any, name: str) -> bool:
        try:
            _getattr_(obj, name)
        except AttributeError:
            return False
        return True

    def _augattr_(obj: Any, name: str, op: str, value: Any) -> None:
        target = _write_(obj)
        setattr(target, name, _inplace(op, getattr(target, name), value))

    def _augitem_(obj: Any, key: Any, op: str, value: Any) -> None:
        obj[key] = _inplace(op, obj[key], value)

    def _type_(*args: Any) -> Any:
        if len(args) != 1:
            raise TypeError("type() takes exactly one argument in gesmas classes "
                            "(classes are made with a class statement)")
        obj = args[0]
        if isinstance(obj, type):
            raise TypeError("type() of a class is not available in gesmas classes")
        t = type(obj)
        return _STANDIN.get(t, t)

    maker = ClassMaker(types)
    return {
        "_step_": _step_, "_stepc_": _stepc_, "_self_": _self_, "_getattr_": _getattr_,
        "_write_": _write_, "_augattr_": _augattr_, "_augitem_": _augitem_,
        "_inplacevar_": _inplace, "__metaclass__": maker,
        "_mul_": _mul_, "_add_": _add_, "_pow_": _pow_, "_lshift_": _lshift_,
        "_mod_": _mod_, "_floordiv_": _floordiv_, "_fmt_": _fmt_,
        "builtins": {"getattr": _getattr_, "setattr": _setattr_, "delattr": _delattr_,
                     "hasattr": _hasattr_, "type": _type_},
    }


def _name_ok(name: Any) -> None:
    if type(name) is not str or name.startswith("__"):
        raise AttributeError(f"attribute name {name!r} is not allowed")


class ClassMaker:
    """The metaclass of every class statement in uploaded code (dialect.py passes it as
    `metaclass=__metaclass__`): checks the bases, then makes the class with the metaclass the
    bases call for."""

    def __init__(self, types: UserTypes) -> None:
        self._types = types

    def _meta(self, name: str, bases: tuple[Any, ...]) -> tuple[type, tuple[type, ...]]:
        if self._types.loading is None:
            raise TypeError(f"class {name}: classes can only be defined while the source "
                            "loads, not inside a call")
        real = tuple(_REAL.get(b, b) if isinstance(b, _StandIn) else b for b in bases)
        for b in real:
            if not isinstance(b, type) or not (
                    b in self._types.readable or b in _ALLOWED_BASES
                    or (issubclass(b, BaseException) and b.__module__ == "builtins")):
                raise TypeError(f"class {name}: cannot derive from {b!r}")
        meta: type = type
        for b in real:
            m = type(b)
            if issubclass(m, meta):
                meta = m
        if meta not in _ALLOWED_META:
            raise TypeError(f"class {name}: metaclass {meta.__name__} is not allowed")
        return meta, real

    def __prepare__(self, name: str, bases: tuple[Any, ...], **kw: Any) -> Any:
        meta, real = self._meta(name, bases)
        return meta.__prepare__(name, real, **kw)

    def __call__(self, name: str, bases: tuple[Any, ...], ns: Any, **kw: Any) -> type:
        meta, real = self._meta(name, bases)
        if not real:
            real = (Object,)
        cls = meta(name, real, ns, **kw)
        self._types.add(cls)
        assert self._types.loading is not None
        self._types.loading.append(cls)
        return cls


_INPLACE: dict[str, Callable[[Any, Any], Any]] = {
    "+=": _add_, "-=": lambda a, b: a - b, "*=": _mul_, "/=": lambda a, b: a / b,
    "//=": _floordiv_, "%=": _mod_, "**=": _pow_, "<<=": _lshift_,
    ">>=": lambda a, b: a >> b, "|=": lambda a, b: a | b, "&=": lambda a, b: a & b,
    "^=": lambda a, b: a ^ b, "@=": lambda a, b: a @ b,
}


def _inplace(op: str, a: Any, b: Any) -> Any:
    # `x += y`: mutable containers keep their identity, as in plain Python
    if op == "+=" and type(a) is list:
        a += b
        return _sized(a, "a list")
    if op == "|=" and type(a) in (set, dict):
        a |= b
        return a
    return _INPLACE[op](a, b)


# -- after a source loaded: its classes are sealed, its top level must be immutable -------------

_IMMUTABLE_LEAVES = (type(None), bool, int, float, complex, str, bytes, range, type(Ellipsis),
                     ModuleProxy, type(len), type(NotImplemented), Object)


def seal(ns: dict[str, Any], made: list[type], types: UserTypes) -> None:
    """Give the classes `made` identity-free repr/hash, then check that nothing a method could
    change lives at module or class level (it would not be part of any checkpoint). Raises
    TypeError naming the first mutable value."""
    for cls in made:
        if cls.__hash__ is object.__hash__:
            type.__setattr__(cls, "__hash__", _no_hash)
        if cls.__repr__ is object.__repr__:
            type.__setattr__(cls, "__repr__", _plain_repr)
    seen: set[int] = set()
    for name, value in ns.items():
        if not (name.startswith("__") or name.startswith("_") and name.endswith("_")):
            _immutable(value, name, seen, types)


def _immutable(v: Any, path: str, seen: set[int], types: UserTypes) -> None:
    if type(v) in _IMMUTABLE_LEAVES or id(v) in seen:
        return
    seen.add(id(v))
    if type(v) in (tuple, frozenset):
        for i, x in enumerate(v):
            _immutable(x, f"{path}[{i}]", seen, types)
        return
    if isinstance(v, type):
        if v in types.readable:
            for k, x in vars(v).items():
                if not k.startswith("_") or not k.endswith("_") or k in (
                        "__init__", "__post_init__"):
                    _immutable(x, f"{path}.{k}", seen, types)
        return              # a class from the dialect or a proxy: read-only for uploaded code
    if isinstance(v, _enum.Enum):
        _immutable(v.value, f"{path}.value", seen, types)
        return
    if isinstance(v, (staticmethod, classmethod)):
        _immutable(v.__func__, path, seen, types)
        return
    if isinstance(v, property):
        for f in (v.fget, v.fset, v.fdel):
            if f is not None:
                _immutable(f, path, seen, types)
        return
    if isinstance(v, (_functools.partial, _functools.partialmethod)):
        _immutable(v.func, f"{path}.func", seen, types)
        _immutable(tuple(v.args), f"{path}.args", seen, types)
        if v.keywords:
            raise TypeError(f"{path}: a partial with keyword arguments at module or class "
                            "level is not allowed (its keywords dict is mutable)")
        return
    if isinstance(v, _functools.cached_property):
        _immutable(v.func, path, seen, types)
        return
    if type(v).__name__ == "function" or callable(v) and type(v).__module__ in (
            "builtins", "functools", "_functools", "itertools", "math", "_heapq", "_bisect",
            "collections", "dataclasses", "enum", "typing", __name__):
        for part in ("__defaults__", "__kwdefaults__"):
            d = getattr(v, part, None)
            if d:
                _immutable(tuple(d.values()) if isinstance(d, dict) else d,
                           f"{path} (default argument)", seen, types)
        for cell in getattr(v, "__closure__", None) or ():
            try:
                content = cell.cell_contents
            except ValueError:
                continue
            if not (isinstance(content, type) and content in types.readable):
                _immutable(content, f"{path} (closure)", seen, types)
        return
    if isinstance(v, (_typing.TypeVar,)) or type(v).__module__ == "typing":
        return
    if isinstance(v, _dataclasses.Field) or v is _dataclasses.MISSING:
        return
    raise TypeError(f"{path}: a {type(v).__name__} at module or class level could be changed "
                    "by a method, and such state is not saved in checkpoints; keep state in "
                    "the object (self) and use immutable values (tuple, frozenset, ...) here")

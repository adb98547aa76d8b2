"""The runtime rules of uploaded code: who may read and write what, which classes may be made,
what module and class level may hold.

`dialect.py` rewrites the source so that attribute access, attribute writes and class
statements go through the guards made here (`make_guards`), one set per kernel since they
know which classes that kernel's sources defined (`UserTypes`). Size checks are in
`limits.py`, the module proxies in `modules.py`. The rules together (DESIGN §7a):

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

import collections as _collections
import dataclasses as _dataclasses
import enum as _enum
import functools as _functools
import itertools as _itertools
import types as _types
import typing as _typing
from typing import Any

from . import modules, natives, sched
from .charge import ATOM, consume, keys, kind
from .measure import members
from .limits import (_CODECS, _charge_scan, _INSPECT, _NAMEDTUPLE_API, GUARDABLE, GUARDED_NAMES, MAX_SIZE, Budget,
                     Object, ResourceLimit, SyncObject, _add_, _floordiv_, _fmt_, _from_bytes,
                     _guarded_method, _in_, _inplace, _lshift_, _mod_, _mul_, _no_hash,
                     _ordered_set, _plain_repr, _pow_, _scrub, _setslice_, _sized, _slice_,
                     _walkable)
from .modules import (_EnumType, _Enum_Enum, _Enum_Flag, _Enum_IntEnum, _Enum_IntFlag, _Enum_StrEnum,
                      ModuleProxy)

#: the special methods a class may define (dialect.py), and name as Base.__init__ or
#: super().__eq__ where uploaded code wrote them (_special)
SPECIAL_METHODS = frozenset("""
    __init__ __repr__ __str__ __eq__ __ne__ __lt__ __le__ __gt__ __ge__ __hash__ __len__
    __contains__ __iter__ __next__ __getitem__ __setitem__ __delitem__ __bool__ __post_init__
    __enter__ __exit__ __call__ __add__ __sub__ __mul__ __neg__
""".split())
_SPECIAL = SPECIAL_METHODS

# Not the builtin containers and scalars: a subclass can override the methods that pickle,
# the size measure or the builtins themselves call (items, __iter__...), so the state saved in
# a checkpoint could differ from the live one. Hold a dict in an attribute instead.
_ALLOWED_BASES = frozenset({Object, SyncObject, _Enum_Enum, _Enum_IntEnum, _Enum_Flag,
                            _Enum_IntFlag, _Enum_StrEnum, _typing.Generic})
_ALLOWED_BASES |= {getattr(_typing, "_NamedTuple")}
_ALLOWED_META = frozenset({type, _enum.EnumType, _EnumType,
                           getattr(_typing, "NamedTupleMeta")})


# -- the guards that know which classes are uploaded ---------------------------------------------

class _StandIn(type):
    """Stand-in for a builtin type (str, bytes, bytearray, list, tuple, dict, set, frozenset):
    isinstance checks and type() comparisons work as with the type itself; calls are checked
    (a size for bytes, no addresses in str(), the size of what is made for all) and cost steps
    by the size of what they make."""

    _real: type

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, cls._real)

    def __subclasscheck__(cls, sub: Any) -> bool:
        return issubclass(_REAL[sub] if isinstance(sub, _StandIn) else sub, cls._real)

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        real = cls._real
        if real is str:
            if len(args) == 1 and not kwargs:
                _walkable(args[0], "str()")
                return _sized(_scrub(str(args[0])), "str()")
            return _sized(str(*args, **kwargs), "str()")
        if args and isinstance(args[0], (set, frozenset)) and real is not set and \
                real is not frozenset and real is not dict:
            _ordered_set(args[0])                # list(s), tuple(s)... keep the set's order
        if (real is float or real is complex or real is int) and args and \
                isinstance(args[0], (str, bytes, bytearray)):
            _charge_scan(args[0])                # parsed whole
        if real in (str, bytes, bytearray) and (len(args) > 1 or "encoding" in kwargs):
            codec = str(kwargs.get("encoding", args[1] if len(args) > 1 else ""))
            if codec.lower().replace("-", "_") not in _CODECS:
                raise ResourceLimit(f"{real.__name__}() with {codec!r} is not available (use "
                                    "utf-8, ascii, latin-1, utf-16 or utf-32)")
        if real is bytes or real is bytearray:
            if args and isinstance(args[0], int) and args[0] > MAX_SIZE:
                raise ResourceLimit(f"{real.__name__}({args[0]}) is over {MAX_SIZE} bytes")
        if args and real not in (int, float, complex) and not isinstance(args[0], (int, str)):
            # the input is consumed whole: charged by its length, or counted per item; the
            # containers that hash their items are charged for hashing them
            args = (keys(args[0]) if real in (set, frozenset, dict) else consume(args[0]),
                    *args[1:])
        if kwargs and real is dict:
            kwargs = dict(consume(kwargs))
        out = _sized(real(*args, **kwargs), real.__name__)
        return members(out) if real is set or real is frozenset else out

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(cls._real, name)

    def __getitem__(cls, item: Any) -> Any:
        """`list[int]` in an annotation: the builtin's generic alias (immutable)."""
        real = tuple(_REAL.get(x, x) if isinstance(x, _StandIn) else x for x in item) \
            if type(item) is tuple else _REAL.get(item, item) if isinstance(item, _StandIn) \
            else item
        return cls._real[real]  # type: ignore[index]

    def __repr__(cls) -> str:
        return repr(cls._real)


def _stand_in(real: type) -> type:
    name = real.__name__ + "_"          # a module-level name, so pickle finds it (defaultdict(list))
    return _StandIn(name, (), {"_real": real, "__module__": __name__, "__qualname__": name})


bytes_, bytearray_, str_ = _stand_in(bytes), _stand_in(bytearray), _stand_in(str)
int_ = _stand_in(int)
float_, complex_ = _stand_in(float), _stand_in(complex)
list_, tuple_, dict_ = _stand_in(list), _stand_in(tuple), _stand_in(dict)
set_, frozenset_ = _stand_in(set), _stand_in(frozenset)
_STANDIN: dict[type, type] = {bytes: bytes_, bytearray: bytearray_, str: str_, int: int_,
                              float: float_, complex: complex_,
                              list: list_,
                              tuple: tuple_, dict: dict_, set: set_, frozenset: frozenset_}
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
        t = type(obj)
        if name in _SPECIAL:
            try:
                return _special(obj, name, readable)
            except AttributeError:
                if default:
                    return default[0]
                raise
        if t is super and name.startswith("_") and not name.startswith("__") and \
                not name.endswith("_"):
            return getattr(obj, name, *default)   # _super_ made it: an uploaded instance
        if name.startswith("_"):
            if name.startswith("__") or name.endswith("_") or not (
                    t in readable or obj in readable if isinstance(obj, type)
                    else t in readable or name in _NAMEDTUPLE_API):
                if default:
                    return default[0]
                raise AttributeError(f"attribute {name!r} of {t.__name__} is not "
                                     "accessible in gesmas classes")
            if name == "_make" and t not in readable:        # a namedtuple class's _make
                return lambda items: obj._make(consume(items))
            return getattr(obj, name, *default)
        if t in readable:
            return getattr(obj, name, *default)
        if name in _INSPECT:
            raise AttributeError(f"attribute {name!r} is not accessible in gesmas classes")
        if isinstance(obj, type):
            return _class_attr(obj, name, default)
        if name == "from_bytes":
            return _from_bytes
        if t is super:
            found = getattr(obj, name, *default)
            if isinstance(found, _NATIVE_METHODS):
                raise AttributeError(f"{name}: a builtin method through super() is not "
                                     "available in gesmas classes (call it on the value)")
            return found
        try:
            return natives.method(obj, name)
        except AttributeError:
            if default:
                return default[0]
            raise

    def _super_(*args: Any) -> Any:
        """super() in a method (dialect.py passes the method's class and first argument),
        or super(Class, obj): only over uploaded classes and their instances, so what it
        reaches is what `obj` itself may reach."""
        if len(args) != 2:
            raise TypeError("super() takes no arguments in a method (super().m()), or an "
                            "uploaded class and an instance of it: super(Base, self)")
        cls, obj = args
        if not isinstance(cls, type) or cls not in readable:
            raise TypeError("super(): the first argument must be a class of an uploaded "
                            f"source, not {_what(cls)}")
        if isinstance(obj, type):
            ok = obj in readable and issubclass(obj, cls)
        else:
            ok = type(obj) in readable and isinstance(obj, cls)
        if not ok:
            raise TypeError(f"super(): {_what(obj)} is not an instance or subclass of "
                            f"{cls.__name__}")
        return super(cls, obj)

    def _write_(obj: Any) -> Any:
        if type(obj) in writable:
            return obj
        if isinstance(obj, type):
            raise TypeError(f"class {obj.__name__} is read-only after its source is loaded")
        raise TypeError(f"attributes of {type(obj).__name__} objects cannot be set in gesmas "
                        "classes (only instances of uploaded classes)")

    def _setattr_(obj: Any, name: str, value: Any) -> None:
        _name_ok(name)
        if name == "args" and isinstance(obj, BaseException):
            value = consume(value)               # copied into a tuple natively
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
        if t in _STANDIN:
            return _STANDIN[t]
        wrapped = modules.STAND_INS.get(t)
        if wrapped is not None:
            return wrapped
        if t in _REFUSED_TYPES:        # calling it would skip the dialect's charges
            raise TypeError(f"type() of a {t.__name__} is not available in gesmas classes")
        return t

    maker = ClassMaker(types)
    return {
        "_step_": _step_, "_stepc_": _stepc_, "_self_": _self_, "_getattr_": _getattr_,
        "_write_": _write_, "_augattr_": _augattr_, "_augitem_": _augitem_,
        "_inplacevar_": _inplace, "__metaclass__": maker,
        "_mul_": _mul_, "_add_": _add_, "_pow_": _pow_, "_lshift_": _lshift_,
        "_mod_": _mod_, "_floordiv_": _floordiv_, "_fmt_": _fmt_, "_in_": _in_,
        "_slice_": _slice_, "_setslice_": _setslice_,
        "builtins": {"getattr": _getattr_, "setattr": _setattr_, "delattr": _delattr_,
                     "hasattr": _hasattr_, "type": _type_, "super": _super_},
    }


def _what(v: Any) -> str:
    return f"class {v.__name__}" if isinstance(v, type) else f"a {type(v).__name__}"


def _special(obj: Any, name: str, readable: set[type]) -> Any:
    """`x.__init__`, `Base.__eq__`, `super().__repr__`: a special method is handed out only
    if uploaded code wrote it (it counts its own steps; a dataclass's generated __init__ is
    charged, modules._charged_init). __init__ may also be object's, a builtin exception's or
    enum's, which do constant work. Anything else (a dataclass's generated __eq__ or __repr__,
    which walk the fields natively; object.__setattr__ through super; a builtin's slot) is
    refused: write the operator instead (a == b, repr(x))."""
    if type(obj) is super:
        start: type = getattr(obj, "__self_class__")
        mro = start.__mro__
        mro = mro[mro.index(getattr(obj, "__thisclass__")) + 1:]
    elif isinstance(obj, type):
        if obj not in readable and not (name == "__init__" and _builtin_exception(obj)):
            raise AttributeError(f"{name} of {obj.__name__} is not accessible in gesmas "
                                 "classes")
        mro = obj.__mro__
    elif type(obj) in readable:
        mro = type(obj).__mro__
    else:
        raise AttributeError(f"{name} of a {type(obj).__name__} is not accessible in gesmas "
                             "classes (use the operator or builtin it stands for)")
    for owner in mro:
        raw = vars(owner).get(name, _MISSING)
        if raw is _MISSING:
            continue
        if _uploaded_function(raw) or name == "__init__" and (
                owner is object or _builtin_exception(owner) or owner.__module__ == "enum"):
            return getattr(obj, name)
        break
    raise AttributeError(f"{name} here is not written in uploaded code and is not available "
                         "by name in gesmas classes (use the operator or builtin it stands "
                         "for: ==, repr(), hash(), len() ...)")


_MISSING = object()


def _builtin_exception(cls: type) -> bool:
    return issubclass(cls, BaseException) and cls.__module__ == "builtins"


def _uploaded_function(f: Any) -> bool:
    """Whether `f` is a function compiled from an uploaded source (or a wrapper the kernel
    made for one, marked __gesmas_charged__)."""
    if isinstance(f, (staticmethod, classmethod)):
        f = f.__func__
    if not isinstance(f, _types.FunctionType):
        return False
    return f.__code__.co_filename.startswith("<class source ") or \
        getattr(f, "__gesmas_charged__", False)


_CLASS_CALLS = {"fromkeys": lambda real: lambda items, *value: _sized(
                    real.fromkeys(keys(items), *value), "fromkeys()"),
                "maketrans": lambda real: lambda *args: real.maketrans(
                    *(consume(a) if isinstance(a, dict) else a for a in args)),
                "from_bytes": lambda real: _from_bytes}


# native classes that consume an iterable when called, without the dialect's charges
_REFUSED_TYPES = frozenset({filter, _functools.partial, _functools.partialmethod, super} | {
    v for v in vars(_itertools).values() if isinstance(v, type)})
_NATIVE_METHODS = (_types.BuiltinMethodType, _types.MethodWrapperType,
                   _types.MethodDescriptorType, _types.WrapperDescriptorType)


def _class_attr(cls: Any, name: str, default: tuple[Any, ...]) -> Any:
    """`cls.name` for a class: a builtin type's methods are the checked ones of its values."""
    real = _REAL.get(cls, cls)
    if real.__module__ in ("builtins", "collections") and kind(real) != ATOM or \
            real in (int, float, complex, bool):
        make = _CLASS_CALLS.get(name)
        if make is not None:
            return make(real)
        if name == "fromhex":
            return natives.method(real(), name)
        if not hasattr(real, name):
            if default:
                return default[0]
            raise AttributeError(f"type object {real.__name__!r} has no attribute {name!r}")

        def unbound(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not isinstance(self, real):
                raise TypeError(f"{real.__name__}.{name} needs a {real.__name__}, not a "
                                f"{type(self).__name__}")
            return natives.method(self, name)(*args, **kwargs)
        return unbound
    return getattr(cls, name, *default)


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
        fields = ns.get("__annotations__") if isinstance(ns, dict) else None
        if meta is not type and fields and len(fields) > modules.MAX_FIELDS:
            raise ResourceLimit(f"class {name}: {len(fields)} fields, more than "
                                f"{modules.MAX_FIELDS}")     # a NamedTuple compiles them
        cls = meta(name, real, ns, **kw)
        if issubclass(cls, BaseException) and not any(
                "args" in vars(c) for c in cls.__mro__ if c.__module__ != "builtins"):
            type.__setattr__(cls, "args", _CHARGED_ARGS)
        self._types.add(cls)
        assert self._types.loading is not None
        self._types.loading.append(cls)
        return cls


_BASE_ARGS = vars(BaseException)["args"]


def _set_args(exc: BaseException, value: Any) -> None:
    _BASE_ARGS.__set__(exc, tuple(consume(value)))


# An exception's `args`, however it is assigned (`self.args = v` in its own method, `e.args =
# v`, a for loop's target): the native setter copies any iterable into a tuple, so the copy
# is counted item by item.
_CHARGED_ARGS = property(_BASE_ARGS.__get__, _set_args, doc="the exception's arguments")


# -- after a source loaded: its classes are sealed, its top level must be immutable -------------

_TUPLEGETTER = type(getattr(_collections.namedtuple("_T", "a"), "a"))   # a namedtuple's field
_IMMUTABLE_LEAVES = (type(None), bool, int, float, complex, str, bytes, range, type(Ellipsis),
                     _TUPLEGETTER,
                     ModuleProxy, type(len), type(NotImplemented), Object)


_BUILTIN_METHOD = type(len)


def _read_only(self: Any, *args: Any) -> None:
    raise TypeError(f"{type(self).__name__} members are read-only")


def seal(ns: dict[str, Any], made: list[type], types: UserTypes) -> None:
    """Give the classes `made` identity-free repr/hash, then check that nothing a method could
    change lives at module or class level (it would not be part of any checkpoint). Raises
    TypeError naming the first mutable value."""
    for cls in made:
        if isinstance(cls, _enum.EnumType):      # members are module-level: read-only
            type.__setattr__(cls, "__setattr__", _read_only)
            type.__setattr__(cls, "__delattr__", _read_only)
        if cls.__hash__ is object.__hash__:
            type.__setattr__(cls, "__hash__", _no_hash)
        if cls.__repr__ is object.__repr__:
            type.__setattr__(cls, "__repr__", _plain_repr)
    seen: set[int] = set()
    # annotations evaluated at module and class level are kept (a dataclass field's `type`
    # can be read back with dataclasses.fields): they must not be anything a method could
    # change
    for holder, where in [(ns, "")] + [(vars(c), f"{c.__name__}.") for c in made]:
        notes = holder.get("__annotations__")
        if isinstance(notes, dict):
            for k, v in notes.items():
                _immutable(v, f"the annotation of {where}{k}", seen, types)
    for name, value in ns.items():
        if not (name.startswith("__") or name.startswith("_") and name.endswith("_")):
            _immutable(value, name, seen, types)


def _immutable(v: Any, path: str, seen: set[int], types: UserTypes) -> None:
    if type(v) is _BUILTIN_METHOD:               # `[].append`: immutable only if its value is
        bound = getattr(v, "__self__", None)
        if bound is not None and not isinstance(bound, (type, ModuleProxy, _types.ModuleType)):
            _immutable(bound, f"{path} (the value its method is bound to)", seen, types)
        return
    if type(v) in _IMMUTABLE_LEAVES or id(v) in seen:
        return
    seen.add(id(v))
    if type(v) in (tuple, frozenset):
        for i, x in enumerate(v):
            _immutable(x, f"{path}[{i}]", seen, types)
        return
    if isinstance(v, type):
        namedtuple = issubclass(v, tuple) and hasattr(v, "_fields")
        if v in types.readable or namedtuple and v.__module__.startswith("gesmas_user_"):
            for k, x in vars(v).items():
                if namedtuple and k == "_field_defaults":
                    continue                     # a copy of __new__'s defaults, checked below
                if not k.startswith("_") or not k.endswith("_") or k in (
                        "__init__", "__post_init__", "__new__"):
                    _immutable(x, f"{path}.{k}", seen, types)
            if _dataclasses.is_dataclass(v):
                for fld in _dataclasses.fields(v):
                    _immutable(fld, f"{path}.{fld.name}", seen, types)
        return              # a class from the dialect or a proxy: read-only for uploaded code
    if isinstance(v, _enum.Enum):
        _immutable(v.value, f"{path}.value", seen, types)
        return
    if isinstance(v, (staticmethod, classmethod)):
        _immutable(v.__func__, path, seen, types)
        return
    if isinstance(v, property):
        for accessor in (v.fget, v.fset, v.fdel):
            if accessor is not None:
                _immutable(accessor, path, seen, types)
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
    if isinstance(v, _types.FunctionType) or callable(v) and type(v).__module__ in (
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
    if isinstance(v, (_typing.TypeVar, _types.GenericAlias, _types.UnionType)) or \
            type(v).__module__ == "typing":
        return
    if isinstance(v, _dataclasses.Field):
        _immutable(v.default, f"{path} (default)", seen, types)
        _immutable(v.default_factory, f"{path} (default_factory)", seen, types)
        _immutable(tuple(v.metadata.values()), f"{path} (metadata)", seen, types)
        return
    if isinstance(v, _dataclasses.InitVar):       # an annotation: InitVar[int]
        _immutable(v.type, f"{path}.type", seen, types)
        return
    if v is _dataclasses.MISSING or v is getattr(_dataclasses, "_HAS_DEFAULT_FACTORY", None):
        return
    raise TypeError(f"{path}: a {type(v).__name__} at module or class level could be changed "
                    "by a method, and such state is not saved in checkpoints; keep state in "
                    "the object (self) and use immutable values (tuple, frozenset, ...) here")

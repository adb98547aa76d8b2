"""What a value may cost uploaded code: sizes, steps, formatting and identity.

`dialect.py` rewrites operators (``*``, ``**``, ``<<``, ``+``, ``%``, ``//``), f-string fields
and a few str/bytes methods into the functions here. Each checks the size of what it is about
to make (integers up to MAX_BITS bits, sequences up to MAX_SIZE items, format widths up to
MAX_WIDTH) and charges the running request steps for big results (`_charge`), so native code
cannot spend more memory or time than the step budget allows. Identity never shows: addresses
are removed from reprs, and objects without a value-based hash refuse `hash()`. The budget and
the size limits themselves are in budget.py; walking values (sizes, set order) in measure.py.
"""
from __future__ import annotations

import re
import string
from typing import Any, Callable

# re-exported: the rest of the kernel imports the sandbox's shared pieces from here
from .budget import (_IDENTITY, _SEQ_ALL, _SIZED_BASES, MAX_BITS, MAX_SIZE, MAX_WIDTH, Budget,
                     ResourceLimit, _bits, _charge, _charge_scan, _cost, _deque, _rlen, _sized)
from .measure import (_ordered_set, _set_args, _set_iter, _stable_hash,
                      _walkable, state_size)

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


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
    if ta is float or tb is float:
        return a * b
    if isinstance(a, int) and isinstance(b, int):
        if _bits(a) + _bits(b) > MAX_BITS:
            raise ResourceLimit(f"a product would have more than {MAX_BITS} bits")
    elif isinstance(b, int) and isinstance(a, _SEQ_ALL):
        if _rlen(a) * int(b) > MAX_SIZE:
            raise ResourceLimit(f"repetition would hold more than {MAX_SIZE} items")
    elif isinstance(a, int) and isinstance(b, _SEQ_ALL):
        if _rlen(b) * int(a) > MAX_SIZE:
            raise ResourceLimit(f"repetition would hold more than {MAX_SIZE} items")
    return _sized(a * b, "a product")


def _add_(a: Any, b: Any) -> Any:
    r = a + b
    t = type(r)
    if t is int or t is float:
        return r
    return _sized(r, "a concatenation")


def _pow_(a: Any, b: Any, mod: Any = None) -> Any:
    if isinstance(a, int) and isinstance(b, int):
        if mod is None:
            if b > 0 and _bits(a) > 1 and _bits(a) * int(b) > MAX_BITS:
                raise ResourceLimit(f"a power would have more than {MAX_BITS} bits")
        elif isinstance(mod, int) and _bits(b) * max(_bits(mod), 1) > MAX_BITS * 64:
            raise ResourceLimit("a modular power with numbers this big is not allowed")
    return _sized(pow(a, b) if mod is None else pow(a, b, mod), "a power")


def _lshift_(a: Any, b: Any) -> Any:
    if isinstance(a, int) and isinstance(b, int) and a and b > MAX_BITS:
        raise ResourceLimit(f"a shift would make more than {MAX_BITS} bits")
    return _sized(a << b, "a shift")


def _divcost(a: Any, b: Any) -> None:
    if isinstance(a, int) and isinstance(b, int):
        n = (_bits(a) * _bits(b)) >> 14
        if n:
            _charge(n)


def _floordiv_(a: Any, b: Any) -> Any:
    _divcost(a, b)
    return a // b


_FORMAT_NUMBER = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?")
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
    _walkable(value, "formatting")
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
    _walkable(obj, "repr()")
    return _sized(_scrub(repr(obj)), "repr()")


def _round_(number: Any, *ndigits: Any) -> Any:
    if ndigits and isinstance(ndigits[0], int) and not -MAX_WIDTH <= ndigits[0] <= MAX_WIDTH:
        raise ResourceLimit(f"round() to {ndigits[0]} digits is out of range")
    return round(number, *ndigits)


def _in_(item: Any, container: Any) -> bool:
    """`item in container`: a scan of a sequence costs steps by its size."""
    t = type(container)
    if t is not dict and t is not set and t is not frozenset:
        _charge_scan(container)
    return item in container


def _slice_(obj: Any, lower: Any, upper: Any, step: Any) -> Any:
    return _sized(obj[lower:upper:step], "a slice")


def _setslice_(obj: Any, lower: Any, upper: Any, step: Any, value: Any) -> None:
    _charge_scan(value)
    obj[lower:upper:step] = value
    _sized(obj, "a sequence")


def _scanning(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A builtin that walks its first argument (sorted, min, max, any, all...)."""
    def call(*args: Any, **kwargs: Any) -> Any:
        if len(args) == 1:
            _charge_scan(args[0])
            if fn is sorted and isinstance(args[0], (set, frozenset)):
                _ordered_set(args[0])          # ties keep the set's order
        return _sized(fn(*args, **kwargs), fn.__name__ + "()")
    call.__name__ = fn.__name__
    return call


def _hash_(obj: Any) -> int:
    t = type(obj)
    if t.__hash__ is object.__hash__ or isinstance(obj, type) or callable(obj) and t in _IDENTITY:
        _no_hash(obj)
    if t is float and obj != obj:
        raise TypeError("NaN has no hash that is the same between replicas")
    _walkable(obj, "hash()")
    return hash(obj)


# -- str/bytes methods whose result can outgrow their input --------------------------------------

def _safe_format(s: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    return _sized(_scrub(_SafeFormatter().vformat(s, args, kwargs)), "a formatted string")


class _SafeFormatter:
    """str.format without attribute fields (`{0.attr}`) and with bounded widths."""

    def vformat(self, s: str, args: tuple[Any, ...], kwargs: Any) -> str:
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
                if isinstance(args[0], (set, frozenset)):
                    _ordered_set(args[0])
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
            if name in ("encode", "decode"):
                codec = str(kwargs.get("encoding", args[0] if args else "utf-8"))
                if codec.lower().replace("-", "_") not in _CODECS:
                    raise ResourceLimit(f"{name}() with {codec!r} is not available (use "
                                        "utf-8, ascii, latin-1, utf-16 or utf-32)")
            if name == "translate" and args and isinstance(args[0], dict):
                longest = max((_rlen(v) for v in args[0].values()
                               if isinstance(v, (str, bytes))), default=1)
                if _rlen(obj) * longest > MAX_SIZE:
                    raise ResourceLimit(f"translate() could make more than {MAX_SIZE} items")
            return _sized(method(*args, **kwargs), f"{name}()")
        return call
    return check


_STR_TYPES = (str, bytes, bytearray)
_CODECS = frozenset("""utf_8 utf8 ascii us_ascii latin_1 latin1 iso_8859_1 utf_16 utf16 utf_32
    utf32 utf_16_le utf_16_be utf_32_le utf_32_be""".split())
#: objects whose GUARDED_NAMES methods are replaced by checked ones
GUARDABLE = _SIZED_BASES + (int,)


def _guarded_method(obj: Any, name: str) -> Any:
    """`obj.name` for a str/bytes/int method that is formatted or can grow its result."""
    if name == "format" and isinstance(obj, str):
        return lambda *a, **k: _safe_format(obj, a, k)
    if name == "format_map" and isinstance(obj, str):
        return lambda m: _safe_format(obj, (), m)
    guard = _GUARDED_METHODS.get(name)
    return guard(obj) if guard is not None else getattr(obj, name)


def _scan_method(name: str) -> Callable[..., Any]:
    """A container method that walks or copies the container (sort, index, copy...)."""
    def check(obj: Any) -> Any:
        method = getattr(obj, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            _charge_scan(obj)
            if name == "sort":
                _charge_scan(obj)
            return _sized(method(*args, **kwargs), f"{name}()")
        return call
    return check


def _from_bytes(data: Any, *args: Any, **kwargs: Any) -> int:
    if isinstance(data, (bytes, bytearray)) and 8 * _rlen(data) > MAX_BITS:
        raise ResourceLimit(f"int.from_bytes() would have more than {MAX_BITS} bits")
    return _sized(int.from_bytes(data, *args, **kwargs), "int.from_bytes()")


def _extending(name: str) -> Callable[[Any], Any]:
    """extend / extendleft: checked against the size the container would reach."""
    def check(obj: Any) -> Any:
        method = getattr(obj, name)

        def extend(items: Any) -> None:
            if isinstance(items, _SIZED_BASES):
                if _rlen(obj) + _rlen(items) > MAX_SIZE:
                    raise ResourceLimit(f"{name}() would hold more than {MAX_SIZE} items")
                _charge_scan(items)
            method(items)
            _sized(obj, f"{name}()")
        return extend
    return check


def _elements(obj: Any) -> Any:
    from .modules import _Counted
    return lambda: _Counted(obj.elements())


_GUARDED_METHODS: dict[str, Callable[[Any], Any]] = {
    **{n: _width_method(n) for n in ("center", "ljust", "rjust", "zfill", "expandtabs")},
    # size checked and charged after the fact: each can at most multiply its input by a
    # small factor (hex 3x, encode to utf-32 4x, upper() of some letters 3x)
    **{n: _growth_method(n) for n in ("join", "replace", "translate", "to_bytes", "encode",
                                      "decode", "hex", "upper", "lower", "title",
                                      "capitalize", "swapcase", "casefold", "strip", "lstrip",
                                      "rstrip", "partition", "rpartition")},
    **{n: _scan_method(n) for n in ("sort", "copy", "index", "count", "find", "rfind",
                                    "split", "rsplit", "splitlines", "most_common", "remove",
                                    "reverse")},
    "pop": lambda obj: _ordered_set(obj).pop if isinstance(obj, (set, frozenset)) else obj.pop,
    "extend": _extending("extend"), "extendleft": _extending("extendleft"),
    "elements": _elements,
    "from_bytes": lambda cls: _from_bytes,
}
#: attribute names dialect.py sends through `_getattr_` even though they are public
GUARDED_NAMES = frozenset(_GUARDED_METHODS) | {"format", "format_map"}
_NAMEDTUPLE_API = frozenset(("_asdict", "_replace", "_fields", "_make"))
_INSPECT = frozenset("""ag_await ag_code ag_frame co_code cr_await cr_code cr_frame cr_origin
    f_back f_builtins f_code f_generator f_globals f_locals f_trace gi_code gi_frame
    gi_yieldfrom tb_frame tb_next mro""".split())


_INPLACE: dict[str, Callable[[Any, Any], Any]] = {
    "+=": _add_, "-=": lambda a, b: a - b, "*=": _mul_, "/=": lambda a, b: a / b,
    "//=": _floordiv_, "%=": _mod_, "**=": _pow_, "<<=": _lshift_,
    ">>=": lambda a, b: a >> b, "|=": lambda a, b: a | b, "&=": lambda a, b: a & b,
    "^=": lambda a, b: a ^ b, "@=": lambda a, b: a @ b,
}


def _inplace(op: str, a: Any, b: Any) -> Any:
    if type(a) is int and type(b) is int and (op == "+=" or op == "-="):
        return a + b if op == "+=" else a - b          # the common counter, cannot blow up
    # `x += y`: mutable containers keep their identity, as in plain Python
    if op == "+=" and type(a) is list:
        a += b
        return _sized(a, "a list")
    if op == "|=" and type(a) in (set, dict):
        a |= b
        return a
    return _INPLACE[op](a, b)

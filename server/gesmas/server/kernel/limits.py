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
from . import charge as _charge_mod
from .hashing import stable_hash
from .measure import (members, _ordered_set, _set_args, _set_iter, _stable_hash,
                      _walkable, state_size)

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_ADDRESS_B = re.compile(rb" at 0x[0-9a-fA-F]+")


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
    if type(a) is not int and type(a) is not float and isinstance(a, dict):
        _operands(a, b)                  # Counter + Counter: a loop over both
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
        elif isinstance(mod, int):
            if _bits(b) * max(_bits(mod), 1) > MAX_BITS * 64:
                raise ResourceLimit("a modular power with numbers this big is not allowed")
            # one squaring and reduction per bit of the exponent, each quadratic in the modulus
            _charge((_bits(b) * _bits(mod) * _bits(mod)) >> 20)
    return _sized(pow(a, b) if mod is None else pow(a, b, mod), "a power")


def _lshift_(a: Any, b: Any) -> Any:
    if isinstance(a, int) and isinstance(b, int) and a and b > MAX_BITS:
        raise ResourceLimit(f"a shift would make more than {MAX_BITS} bits")
    return _sized(a << b, "a shift")


_OPS: dict[str, Callable[[Any, Any], Any]] = {
    "-": lambda a, b: a - b, "|": lambda a, b: a | b, "&": lambda a, b: a & b,
    "^": lambda a, b: a ^ b, ">>": lambda a, b: a >> b, "/": lambda a, b: a / b,
    "@": lambda a, b: a @ b,
}
_CONTAINER_KINDS = frozenset({_charge_mod.SEQ, _charge_mod.MAP, _charge_mod.SET,
                              _charge_mod.KEYS, _charge_mod.ITEMS, _charge_mod.VALUES,
                              _charge_mod.RECORD})


def _operands(a: Any, b: Any) -> None:
    """Charge an operator on two containers (set and dict operators, Counter arithmetic):
    it walks both."""
    for v in (a, b):
        t = type(v)
        if t not in _charge_mod._ATOMS and _charge_mod.kind(t) in _CONTAINER_KINDS:
            _charge_mod.charge_value(v)


def _binop_(a: Any, op: str, b: Any) -> Any:
    """`a op b` for - | & ^ >> / @ of two non-constants."""
    ta, tb = type(a), type(b)
    if not (ta is int or ta is float) or not (tb is int or tb is float):
        _operands(a, b)
        if hasattr(tb, "__next__") and not tb.__module__.startswith("gesmas_user_"):
            b = _charge_mod.keys(b)         # `keys() | iterator`: consumed and hashed
        r = _OPS[op](a, b)
        return members(_sized(r, "a result")) if type(r) is not int else r
    return _OPS[op](a, b)


def _unary_(op: str, a: Any) -> Any:
    """`-a`, `+a`, `~a` of a non-constant (a Counter's unary + and - walk it)."""
    if type(a) is not int and type(a) is not float:
        _operands(a, None)
    return -a if op == "-" else +a if op == "+" else ~a


def _cmpv_(v: Any) -> Any:
    """An operand of a chained comparison, charged for what comparisons of it may walk."""
    t = type(v)
    if t not in _charge_mod._ATOMS and _charge_mod.kind(t) != _charge_mod.ATOM:
        _charge_mod.charge_value(v)
    return v


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
        _walkable(b, "formatting")
        out = a % b
        if type(out) is str:
            out = _scrub(out)
        elif b" at 0x" in out:
            out = _ADDRESS_B.sub(b"", out)
        return _sized(out, "a formatted string")
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
    if ndigits and isinstance(number, int):      # a division by a power of ten: quadratic
        bits = _bits(int(number))
        _charge((bits * bits) >> 16)
    return round(number, *ndigits)


def _in_(item: Any, container: Any) -> bool:
    """`item in container`: a lookup is charged the item's hash, a search the comparisons
    with every item, a native iterator is counted per item it hands out (charge.py)."""
    t = type(container)
    k = _charge_mod.kind(t)
    if k == _charge_mod.MAP or k == _charge_mod.SET or k == _charge_mod.KEYS or \
            k == _charge_mod.ITEMS:
        _charge_mod._key_(item)
    elif k == _charge_mod.SEQ or k == _charge_mod.VALUES:
        n = len(container)
        if n:
            _charge_mod.charge_items(n * _charge_mod.unfold(item))
    elif k == _charge_mod.STR:
        _charge_scan(container)
    elif t is range:
        if type(item) is not int and type(item) is not bool:
            _charge_mod.charge_items(len(container))
    elif hasattr(t, "__next__") and not t.__module__.startswith("gesmas_user_"):
        ux = _charge_mod.unfold(item)
        return item in _charge_mod.Counted(container, lambda _: _charge_mod.charge_items(ux))
    return item in container


def _slice_(obj: Any, lower: Any, upper: Any, step: Any) -> Any:
    return _sized(obj[lower:upper:step], "a slice")


def _setslice_(obj: Any, lower: Any, upper: Any, step: Any, value: Any) -> None:
    _charge_scan(value)
    obj[lower:upper:step] = value
    _sized(obj, "a sequence")


def _hash_(obj: Any) -> int:
    """`hash()` in uploaded code: the dialect's own hash (hashing.py)."""
    return stable_hash(obj)


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
            if args and isinstance(args[0], int) and int(args[0]) > MAX_SIZE:
                raise ResourceLimit(f"{name}() to {int(args[0])} is over {MAX_SIZE}")
            if name == "expandtabs":        # each tab can become `tabsize` spaces
                size = int(args[0]) if args and isinstance(args[0], int) else 8
                if _rlen(obj) * max(size, 1) > MAX_SIZE and obj.count("\t") * size > MAX_SIZE:
                    raise ResourceLimit(f"expandtabs() could make more than {MAX_SIZE} items")
            _charge_scan(obj)
            return _sized(method(*args), f"{name}()")
        return call
    return check


def _growth_method(name: str) -> Callable[..., Any]:
    def check(obj: Any) -> Any:
        method = getattr(obj, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            _charge_scan(obj)                   # the input is read whole, whatever comes out
            if name == "join":
                if isinstance(args[0], (set, frozenset)):
                    _ordered_set(args[0])
                items = list(_charge_mod.consume(args[0]))
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
            if name[0] == "r" and args and isinstance(args[0], (str, bytes, bytearray)):
                # the reverse searches compare the pattern at every position: n * m
                m = _rlen(args[0])
                if m > 64:
                    _charge_mod.charge_items((_rlen(obj) >> 3) * (m >> 6))
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
    return lambda: _charge_mod.Counted(obj.elements(), _charge_mod._cost_of)


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


def _inplace_op(op: str) -> Callable[[Any, Any], Any]:
    plain = _OPS[op]

    def run(a: Any, b: Any) -> Any:
        _operands(a, b)
        return members(plain(a, b))
    return run


_INPLACE: dict[str, Callable[[Any, Any], Any]] = {
    "+=": _add_, "-=": _inplace_op("-"), "*=": _mul_, "/=": _inplace_op("/"),
    "//=": _floordiv_, "%=": _mod_, "**=": _pow_, "<<=": _lshift_,
    ">>=": _inplace_op(">>"), "|=": _inplace_op("|"), "&=": _inplace_op("&"),
    "^=": _inplace_op("^"), "@=": _inplace_op("@"),
}


def _inplace(op: str, a: Any, b: Any) -> Any:
    if type(a) is int and type(b) is int and (op == "+=" or op == "-="):
        return a + b if op == "+=" else a - b          # the common counter, cannot blow up
    # `x += y`: mutable containers keep their identity, as in plain Python
    if op == "+=" and type(a) is list:
        a += _charge_mod.consume(b)
        return _sized(a, "a list")
    if op == "|=" and type(a) in (set, dict):
        _operands(a, b)
        a |= b
        return members(_sized(a, "a union"))
    return _INPLACE[op](a, b)

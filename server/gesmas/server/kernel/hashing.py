"""`hash()` as uploaded code sees it: defined by the dialect, not by the interpreter.

The interpreter's hash of a str or bytes depends on the hash seed and, for the same seed, on
the Python version (3.11 moved from SipHash-2-4 to SipHash-1-3); on Python 3.11 and older,
None's hash is its address. A value stored by uploaded code must not depend on either, so
`stable_hash` defines the hash of every hashable value the dialect admits:

- None: a constant; bool, int, float, complex: Python's numeric hash (specified by the
  language reference, the same on every version and platform of 64 bits); NaN has none;
- str, bytes: the first 8 bytes of BLAKE2b over a tag and the bytes (UTF-8 for str,
  surrogates passed), as a signed 64-bit integer;
- tuple: its items' hashes mixed in order; frozenset: mixed without order;
- an enum member: the hash of its class name and member name;
- a dataclass whose hash the dataclass machinery generated: the hash of its fields' tuple;
- an instance of an uploaded class with its own ``__hash__``: what that method returns (it
  runs in the dialect, so the hashes it uses are these);
- anything whose only hash is an address (functions, classes, plain objects) has none.

The cost of walking the value is charged first (`charge.charge_value`).
"""
from __future__ import annotations

import dataclasses as _dataclasses
import enum as _enum
import hashlib as _hashlib
from typing import Any

from .budget import _IDENTITY
from .charge import charge_value

_M64 = (1 << 64) - 1
_NONE = 0x6E6F6E65          # 'none'
_TUPLE, _FROZEN = 0x345678, 0x1F2E3D4C


def _signed(h: int) -> int:
    h &= _M64
    h = h - (1 << 64) if h >> 63 else h
    return -2 if h == -1 else h        # -1 is the interpreter's error value


def _digest(tag: bytes, data: bytes) -> int:
    return _signed(int.from_bytes(_hashlib.blake2b(tag + data, digest_size=8).digest(),
                                  "little"))


def _no_hash(obj: Any) -> None:
    raise TypeError(f"{type(obj).__name__} objects have no hash that is the same on every "
                    "replica (define __eq__ and __hash__, or key by a value)")


def stable_hash(obj: Any) -> int:
    """The dialect's hash of `obj` (see the module docstring); charges the walk."""
    charge_value(obj)
    return _hash(obj)


def _hash(obj: Any) -> int:
    t = type(obj)
    if obj is None:
        return _NONE
    if t is int or t is bool or t is complex:
        return hash(obj)
    if t is float:
        if obj != obj:
            raise TypeError("NaN has no hash that is the same between replicas")
        return hash(obj)
    if t is str:
        return _digest(b"s", obj.encode("utf-8", "surrogatepass"))
    if t is bytes:
        return _digest(b"b", obj)
    if t is tuple or (isinstance(obj, tuple) and _generated(t)):
        h = _TUPLE
        for x in obj:
            h = ((h ^ _hash(x)) * 0x100000001B3) & _M64
        return _signed(h ^ len(obj))
    if t is frozenset:
        total = _FROZEN
        for x in obj:
            y = _hash(x) & _M64
            total = (total + ((y ^ (y >> 29)) * 0x9E3779B97F4A7C15 & _M64)) & _M64
        return _signed(total ^ len(obj))
    if isinstance(obj, _enum.Enum):
        return _hash((t.__name__, obj.name))
    if isinstance(obj, (int, float, complex, str, bytes, frozenset)):   # a subclass instance
        return _hash(_base(obj))
    if _dataclasses.is_dataclass(obj) and _generated(t):
        return _hash(tuple(getattr(obj, f.name) for f in _dataclasses.fields(obj)))
    if t.__hash__ is object.__hash__ or t.__hash__ is None or isinstance(obj, type) or \
            isinstance(obj, _IDENTITY):
        _no_hash(obj)
    return hash(obj)


def _base(obj: Any) -> Any:
    """A subclass instance of a builtin hashable type as the builtin value."""
    b: Any
    for b in (bool, int, float, complex, str, bytes, frozenset):
        if isinstance(obj, b):
            return b(obj)
    return obj  # pragma: no cover


def _generated(t: type) -> bool:
    """Whether `t.__hash__` is the interpreter's or the dataclass machinery's (not a method
    written in the dialect)."""
    h = t.__hash__
    code = getattr(h, "__code__", None)
    return code is None or code.co_filename == "<string>" or \
        code.co_filename.endswith("collections/__init__.py")

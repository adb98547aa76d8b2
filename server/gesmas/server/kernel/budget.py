"""The step budget and the size limits every guard shares: what a request may still spend,
how much a value costs, and the error for a value that would be too big."""
from __future__ import annotations

import collections as _collections
import types as _types
from typing import Any

from . import sched

MAX_BITS = 1 << 16          # largest integer an operation may produce, in bits
MAX_SIZE = 1 << 22          # longest str/bytes/list/tuple an operation may produce
MAX_WIDTH = 10_000          # largest width or precision in a format specification

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
    """Steps a value costs to make or to scan: one per 64 bytes (8 references) it holds."""
    t = type(v)
    if t is str or t is bytes or t is bytearray:
        return len(v) >> 6
    if t is list or t is tuple or t is dict or t is set or t is frozenset or t is _deque:
        return len(v) >> 3
    if t is int:
        return v.bit_length() >> 9
    for base in _SIZED_BASES:                    # a subclass: its real size, whatever __len__ says
        if isinstance(v, base):
            n: int = base.__len__(v)  # type: ignore[attr-defined]
            return n >> 6 if base in (str, bytes, bytearray) else n >> 3
    return 0


def _rlen(v: Any) -> int:
    """The length of a builtin sequence or container, ignoring an overridden __len__."""
    for base in _SIZED_BASES:
        if isinstance(v, base):
            return base.__len__(v)  # type: ignore[attr-defined]
    return len(v)


def _bits(v: int) -> int:
    return int.bit_length(v)


def _charge_scan(v: Any) -> None:
    n = _cost(v)
    if n:
        _charge(n)


def _sized(v: Any, what: str) -> Any:
    """`v`, after checking its size and charging its cost."""
    t = type(v)
    if t is int:
        if v.bit_length() > MAX_BITS:
            raise ResourceLimit(f"{what} would have more than {MAX_BITS} bits")
    elif isinstance(v, _SIZED_BASES) and _rlen(v) > MAX_SIZE:
        raise ResourceLimit(f"{what} would hold more than {MAX_SIZE} items")
    n = _cost(v)
    if n:
        _charge(n)
    return v


_deque = _collections.deque
# callables whose hash is their identity (an address): refused by hash()
_IDENTITY = (_types.FunctionType, _types.BuiltinFunctionType, _types.MethodType,
             _types.BuiltinMethodType)
_SEQ = (str, bytes, bytearray, list, tuple)
_SEQ_ALL = (str, bytes, bytearray, list, tuple, _deque)
_SIZED_BASES: tuple[type, ...] = (str, bytes, bytearray, list, tuple, dict, set, frozenset,
                                  _deque)

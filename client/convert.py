"""Plain Python values <-> ``gesmas.v1.Value`` messages, client side.

The client's copy of the value rules of the wire contract (the server has its own in
``gesmas.server.wire``; the client must not import the server). Plain values are None,
bool, int (int64), float, str, bytes, list/tuple (sent as a list) and dict with str keys,
nested to any depth; subclasses (an IntEnum, an OrderedDict) are sent as their base type.
Anything else raises ``InvalidArgument`` naming the offending part, e.g.
``args[1]['x']: type set is not a plain value``.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gesmas.client.errors import InvalidArgument
from gesmas.v1 import gesmas_pb2 as pb

__all__ = ["fill_map", "fill_values", "from_value", "from_value_map", "to_value"]

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class _Bad(Exception):
    """A conversion failure while unwinding; ``parts`` holds the path, innermost first."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.parts: list[str] = []

    def error(self, root: str) -> InvalidArgument:
        return InvalidArgument(f"{root}{''.join(reversed(self.parts))}: {self.reason}")


def _fill(v: Any, x: Any) -> None:
    if x is None:
        v.null_value = pb.NULL_VALUE
    elif isinstance(x, bool):
        v.bool_value = x
    elif isinstance(x, int):
        if not INT64_MIN <= x <= INT64_MAX:
            raise _Bad(f"int {x} is outside the int64 range")
        v.int_value = int(x)
    elif isinstance(x, float):
        v.double_value = float(x)
    elif isinstance(x, str):
        try:
            v.string_value = str.__str__(x)
        except UnicodeEncodeError:
            raise _Bad("str is not valid Unicode text (lone surrogate)") from None
    elif isinstance(x, bytes):
        v.bytes_value = bytes(x)
    elif isinstance(x, (list, tuple)):
        _fill_list(v.list_value.values, x)
        v.list_value.SetInParent()  # an empty list is a list, not null
    elif isinstance(x, dict):
        _fill_map(v.map_value.fields, x)
        v.map_value.SetInParent()
    else:
        raise _Bad(f"type {type(x).__name__} is not a plain value")


def _fill_list(out: Any, items: Iterable[Any]) -> None:
    for i, item in enumerate(items):
        try:
            _fill(out.add(), item)
        except _Bad as e:
            e.parts.append(f"[{i}]")
            raise


def _fill_map(out: Any, d: Mapping[Any, Any]) -> None:
    for k, item in d.items():
        if not isinstance(k, str):
            raise _Bad(f"key {k!r} of type {type(k).__name__} is not a str")
        try:
            _fill(out[str.__str__(k)], item)
        except UnicodeEncodeError:
            raise _Bad(f"key {k!r} is not valid Unicode text (lone surrogate)") from None
        except _Bad as e:
            e.parts.append(f"[{k!r}]")
            raise


def to_value(x: Any, path: str = "value") -> pb.Value:
    """``x`` as a Value message; ``path`` names it in the error message."""
    v = pb.Value()
    try:
        _fill(v, x)
    except _Bad as e:
        raise e.error(path) from None
    return v


def fill_values(out: Any, items: Iterable[Any], path: str = "args") -> None:
    """Append ``items`` to a repeated Value field, e.g. ``request.args``."""
    try:
        _fill_list(out, items)
    except _Bad as e:
        raise e.error(path) from None


def fill_map(out: Any, d: Mapping[str, Any], path: str = "kwargs") -> None:
    """Add the entries of ``d`` to a map<string, Value> field, e.g. ``request.kwargs``."""
    try:
        _fill_map(out, d)
    except _Bad as e:
        raise e.error(path) from None


def from_value(v: pb.Value) -> Any:
    """A Value message as a plain Python value; a Value with nothing set is None."""
    kind = v.WhichOneof("kind")
    if kind is None or kind == "null_value":
        return None
    if kind == "list_value":
        return [from_value(item) for item in v.list_value.values]
    if kind == "map_value":
        return from_value_map(v.map_value.fields)
    return getattr(v, kind)  # bool_value, int_value, double_value, string_value, bytes_value


def from_value_map(fields: Mapping[str, pb.Value]) -> dict[str, Any]:
    """A map<string, Value> field as a dict, keys sorted."""
    return {k: from_value(item) for k, item in sorted(fields.items())}

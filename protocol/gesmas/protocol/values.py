"""Plain Python values <-> ``gesmas.v1.Value`` messages: the value rules of the wire contract,
used by the client and the server alike.

Plain values are None, bool, int (int64), float, str, bytes, list/tuple (sent as a list) and
dict with str keys, lists and dicts nested at most ``MAX_DEPTH`` deep in an answer and
``MAX_ARG_DEPTH`` in an argument. Subclasses of these types (an IntEnum, an OrderedDict) are
sent as their base type. Anything else, an int outside int64, a dict key that is not a str or
a value nested too deep raises ``ValueError`` naming the path of the offending part, e.g.
``args[1]['x']: type set is not a plain value`` (the client turns it into InvalidArgument).
These are on the hot path of every Invoke: the common case is a chain of ``type(x) is`` tests
(faster than a dict of converters), paths are only built when an error unwinds, and nested
messages are filled in place rather than built and copied. Map keys come back sorted, so a
dict's order never depends on the protobuf runtime's map order (replicas must agree).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gesmas.v1 import gesmas_pb2 as pb

__all__ = ["INT64_MAX", "INT64_MIN", "MAX_ARG_DEPTH", "MAX_DEPTH", "from_value", "from_value_map",
           "from_values", "to_value", "to_value_map", "to_values"]

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

#: Lists and dicts one value may nest in an answer. protobuf's parser refuses a message
#: nested more than 100 deep; a dict level costs three (Value, MapValue, the map's entry),
#: a list level two, and a result sits three messages down (CallAnswer, InvokeResponse,
#: Value): 32 levels of dicts still parse. Past that, the replica would write an answer no
#: client can read (the client's stream breaks on it, and the call is sent again for ever).
MAX_DEPTH = 30
#: The same in an argument (and in a follow's cursor): fewer, so that an object may answer
#: what it was given inside a few containers of its own. A Map's watch answer holds a value
#: three levels down, a txn's results three, a page of items four.
MAX_ARG_DEPTH = 24

Value = pb.Value


# --- values: Python -> wire -------------------------------------------------------------


class _BadValue(ValueError):
    """A conversion failure while unwinding: ``parts`` collects the path innermost first."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.parts: list[str] = []

    def finish(self, root: str, depth: int = 0) -> ValueError:
        path = root + "".join(reversed(self.parts))
        if len(path) > 100:
            path = f"{path[:60]}...{path[-30:]}"
        reason = self.reason if depth == 0 or self.reason != _TOO_DEEP else \
            f"nested more than {depth} lists and dicts deep"
        return ValueError(f"{path}: {reason}")


_TOO_DEEP = "too deep"     # finish() names the limit


def _int_text(x: int) -> str:
    """An int for an error message: a huge one by its size (str() refuses past 4,300 digits)."""
    return str(x) if x.bit_length() <= 256 else f"of {x.bit_length()} bits"


def _fill(v: Any, x: Any, left: int) -> None:
    """Set the message ``v`` (an empty Value) to represent ``x``, which may nest ``left``
    more lists and dicts."""
    t = type(x)
    if t is str:
        try:
            v.string_value = x
        except UnicodeEncodeError:
            raise _BadValue("str is not valid Unicode text (lone surrogate)") from None
    elif t is int:
        if INT64_MIN <= x <= INT64_MAX:
            v.int_value = x
        else:
            raise _BadValue(f"int {_int_text(x)} is outside the int64 range")
    elif x is None:
        v.null_value = 0
    elif t is bool:
        v.bool_value = x
    elif t is float:
        v.double_value = x
    elif t is bytes:
        v.bytes_value = x
    elif t is list or t is tuple:
        if left <= 0:
            raise _BadValue(_TOO_DEEP)
        _fill_list(v.list_value.values, x, left - 1)
        v.list_value.SetInParent()  # an empty list is still a list, not null
    elif t is dict:
        if left <= 0:
            raise _BadValue(_TOO_DEEP)
        _fill_map(v.map_value.fields, x, left - 1)
        v.map_value.SetInParent()
    else:
        _fill_subclass(v, x, left)


def _fill_list(out: Any, items: Iterable[Any], left: int) -> None:
    i = 0
    try:
        for item in items:
            _fill(out.add(), item, left)
            i += 1
    except _BadValue as e:
        e.parts.append(f"[{i}]")
        raise


def _fill_map(out: Any, d: Mapping[Any, Any], left: int) -> None:
    for k, item in d.items():
        if type(k) is not str:
            if not isinstance(k, str):
                raise _BadValue(f"key {k!r:.60} of type {type(k).__name__} is not a str")
            k = str.__str__(k)
        try:
            target = out[k]
        except UnicodeEncodeError:
            raise _BadValue(f"key {k!r:.60} is not valid Unicode text (lone surrogate)") from None
        try:
            _fill(target, item, left)
        except _BadValue as e:
            e.parts.append(f"[{k!r}]")
            raise


def _fill_subclass(v: Any, x: Any, left: int) -> None:
    """The slow path: subclasses of the plain types, sent as the base type."""
    if isinstance(x, int):  # bool cannot be subclassed: never here
        _fill(v, int(x), left)
    elif isinstance(x, float):
        v.double_value = float(x)
    elif isinstance(x, str):
        _fill(v, str.__str__(x), left)
    elif isinstance(x, bytes):
        v.bytes_value = bytes(x)
    elif isinstance(x, (list, tuple)):
        _fill(v, list(x), left)
    elif isinstance(x, dict):
        _fill(v, dict(x), left)
    else:
        raise _BadValue(f"type {type(x).__name__} is not a plain value")


def to_value(x: Any, path: str = "value", depth: int = MAX_DEPTH) -> pb.Value:
    """Convert a plain Python value to a ``Value`` message; ``path`` names it in errors, and
    ``depth`` is the most lists and dicts it may nest (an answer's, by default)."""
    v = Value()
    try:
        _fill(v, x, depth)
    except _BadValue as e:
        raise e.finish(path, depth) from None
    return v


def to_values(items: Iterable[Any], out: Any = None, path: str = "args",
              depth: int = MAX_ARG_DEPTH) -> Any:
    """Convert a sequence of arguments, each nesting at most ``depth`` lists and dicts. With
    ``out`` (a repeated Value field, e.g. ``request.args``) fill it in place and return it;
    otherwise return a list of Values."""
    target = pb.ListValue().values if out is None else out
    try:
        _fill_list(target, items, depth)
    except _BadValue as e:
        raise e.finish(path, depth) from None
    return list(target) if out is None else out


def to_value_map(d: Mapping[str, Any], out: Any = None, path: str = "kwargs",
                 depth: int = MAX_ARG_DEPTH) -> Any:
    """Convert a str-keyed mapping of arguments, each nesting at most ``depth`` lists and
    dicts. With ``out`` (a map<string, Value> field, e.g. ``request.kwargs``) fill it in
    place and return it; otherwise return a dict of Values."""
    target = pb.MapValue().fields if out is None else out
    try:
        _fill_map(target, d, depth)
    except _BadValue as e:
        raise e.finish(path, depth) from None
    return dict(target) if out is None else out


# --- values: wire -> Python -------------------------------------------------------------


def _read(v: Any, left: int) -> Any:
    kind = v.WhichOneof("kind")
    if kind == "string_value":
        return v.string_value
    if kind == "int_value":
        return v.int_value
    if kind == "null_value" or kind is None:
        return None
    if kind == "bool_value":
        return v.bool_value
    if kind == "double_value":
        return v.double_value
    if kind == "bytes_value":
        return v.bytes_value
    if kind == "list_value" or kind == "map_value":
        if left <= 0:
            raise _BadValue(_TOO_DEEP)
        if kind == "list_value":
            out: list[Any] = []
            try:
                for item in v.list_value.values:
                    out.append(_read(item, left - 1))
            except _BadValue as e:
                e.parts.append(f"[{len(out)}]")
                raise
            return out
        d: dict[str, Any] = {}
        for k, item in sorted(v.map_value.fields.items()):
            try:
                d[k] = _read(item, left - 1)
            except _BadValue as e:
                e.parts.append(f"[{k!r}]")
                raise
        return d
    raise _BadValue(f"unknown Value kind {kind!r}")  # a newer peer; cannot happen in v1


def from_value(v: pb.Value, path: str = "value", depth: int = MAX_DEPTH) -> Any:
    """Convert a ``Value`` message to a plain Python value (lists, dicts, None, ...), nesting
    at most ``depth`` lists and dicts (an answer's, by default). A Value with no member set
    reads as None. Map keys come back sorted, so the dict's order does not depend on the
    protobuf runtime's map order (replicas must agree)."""
    try:
        return _read(v, depth)
    except _BadValue as e:
        raise e.finish(path, depth) from None


def from_values(values: Iterable[pb.Value], path: str = "args",
                depth: int = MAX_ARG_DEPTH) -> list[Any]:
    """Convert a repeated Value field (e.g. ``request.args``) to a list; each item nests at
    most ``depth`` lists and dicts (an argument's, by default)."""
    out = []
    for i, v in enumerate(values):
        try:
            out.append(_read(v, depth))
        except _BadValue as e:
            raise e.finish(f"{path}[{i}]", depth) from None
    return out


def from_value_map(values: Mapping[str, pb.Value], path: str = "kwargs",
                   depth: int = MAX_ARG_DEPTH) -> dict[str, Any]:
    """Convert a map<string, Value> field (e.g. ``request.kwargs``) to a dict, keys sorted;
    each value nests at most ``depth`` lists and dicts (an argument's, by default)."""
    out = {}
    for k, v in sorted(values.items()):
        try:
            out[k] = _read(v, depth)
        except _BadValue as e:
            raise e.finish(f"{path}[{k!r}]", depth) from None
    return out

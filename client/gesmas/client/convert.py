"""Plain Python values <-> ``gesmas.v1.Value`` messages, client side: the shared rules of
``gesmas.protocol.values``, with a value that is not plain raised as ``InvalidArgument``
naming the offending part, e.g. ``args[1]['x']: type set is not a plain value``.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gesmas.client.errors import InvalidArgument
from gesmas.protocol import values
from gesmas.protocol.values import INT64_MAX, INT64_MIN, from_value, from_value_map
from gesmas.v1 import gesmas_pb2 as pb

__all__ = ["INT64_MAX", "INT64_MIN", "fill_map", "fill_values", "from_value", "from_value_map",
           "to_value"]


def to_value(x: Any, path: str = "value") -> pb.Value:
    """``x`` as a Value message; ``path`` names it in the error message."""
    try:
        return values.to_value(x, path)
    except ValueError as e:
        raise InvalidArgument(str(e)) from None


def fill_values(out: Any, items: Iterable[Any], path: str = "args") -> None:
    """Append ``items`` to a repeated Value field, e.g. ``request.args``."""
    try:
        values.to_values(items, out, path)
    except ValueError as e:
        raise InvalidArgument(str(e)) from None


def fill_map(out: Any, d: Mapping[str, Any], path: str = "kwargs") -> None:
    """Add the entries of ``d`` to a map<string, Value> field, e.g. ``request.kwargs``."""
    try:
        values.to_value_map(d, out, path)
    except ValueError as e:
        raise InvalidArgument(str(e)) from None

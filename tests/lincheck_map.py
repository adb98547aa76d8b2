"""A sequential model of the standard Map (objects/kvmap.py) for tests/lincheck.py.

The whole map is one key of the history (its revision orders every change, so its entries
are not independent objects). State: (revision, ((key, value, version, create_revision,
mod_revision), ...) sorted by key). Operations, as the proxies answer them:
  get(key) -> value or None;   put(key, value) -> {"revision", "version"};
  delete(key) -> bool;         cas(key, expect_version, value) -> bool;
  txn(compares, success, failure) -> {"succeeded", "revision", "results"}.
An application error recorded as output ('error', type) is legal only where the model
refuses the operation too (none here: the loads send valid requests), so it is a violation.
"""
from __future__ import annotations

import operator
from typing import Any

try:
    from tests.lincheck import UNKNOWN, Model, _bad_kind, _freeze
except ImportError:  # tests/ is not a package: pytest puts tests/ itself on sys.path
    from lincheck import UNKNOWN, Model, _bad_kind, _freeze

_CMP = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, ">": operator.gt,
        "<=": operator.le, ">=": operator.ge}
_FIELD = {"version": 1, "create_revision": 2, "mod_revision": 3}


class MapModel(Model):
    init = (0, ())
    # may change nothing in one state and something in another
    blind_writes = frozenset({"delete", "cas", "txn"})

    def step(self, state, kind, input, output, client):
        rev, items = state
        data = {k: list(rest) for k, *rest in items}
        unk = output is UNKNOWN
        if kind == "get":
            e = data.get(input[0])
            return (unk or output == (None if e is None else e[0])), state
        if kind == "put":
            rev += 1
            version = _put(data, rev, input[0], input[1])
            want = _freeze({"revision": rev, "version": version})
            return (unk or output == want), _state(rev, data)
        if kind == "delete":
            existed = input[0] in data
            if existed:
                rev += 1
                del data[input[0]]
            return (unk or output is existed), _state(rev, data)
        if kind == "cas":
            key, expect, value = input
            have = data[key][1] if key in data else 0
            if have != expect:
                return (unk or output is False), state
            _put(data, rev + 1, key, value)
            return (unk or output is True), _state(rev + 1, data)
        if kind == "txn":
            compares, success, failure = input
            held = all(_holds(data, c) for c in compares)
            ops = success if held else failure
            results: list[Any] = []
            changed = False                # a revision only if something changes
            for op in ops:
                key = op[1]
                if op[0] == "get":
                    e = data.get(key)
                    results.append(None if e is None else {
                        "value": e[0], "version": e[1], "create_revision": e[2],
                        "mod_revision": e[3], "ephemeral": False})
                    continue
                if op[0] == "delete" and key not in data:
                    results.append({"deleted": False})
                    continue
                if not changed:
                    rev, changed = rev + 1, True
                if op[0] == "put":
                    results.append({"version": _put(data, rev, key, op[2])})
                else:
                    results.append({"deleted": data.pop(key) is not None})
            want = _freeze({"succeeded": held, "revision": rev, "results": results})
            return (unk or output == want), _state(rev, data)
        raise _bad_kind(self, kind)


def _put(data: dict, rev: int, key: str, value: Any) -> int:
    e = data.get(key)
    if e is None:
        data[key] = [value, 1, rev, rev]
        return 1
    e[0], e[1], e[3] = value, e[1] + 1, rev
    return e[1]


def _holds(data: dict, compare: tuple) -> bool:
    key, target, op, operand = compare
    e = data.get(key)
    if target == "exists":
        return _CMP[op](e is not None, operand)
    if target == "value":
        return e is not None and _CMP[op](e[0], operand)
    return _CMP[op](0 if e is None else e[_FIELD[target]], operand)


def _state(rev: int, data: dict) -> tuple:
    return rev, tuple(sorted((k, *v) for k, v in data.items()))

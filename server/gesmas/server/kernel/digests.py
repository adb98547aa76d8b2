"""A hash of a value by its content (the state digest's fallback, checkpoint.py): the same
however equal parts happen to be shared, for parts too big to pickle without a memo, or that
cannot be pickled at all (a lambda, a generator: hashed by kind and name)."""
from __future__ import annotations

import collections
import hashlib
from typing import Any


def described(v: Any) -> str:
    """What the digest hashes of a value it cannot look into: its repr, unless that is the
    default one (an address) or the value is code (a function, a generator, a method), which
    is named by its kind and qualified name: the same on every replica."""
    t = type(v)
    name = getattr(v, "__qualname__", None)
    if isinstance(name, str) and t.__repr__ is not type.__repr__:
        return f"{t.__qualname__}:{name}"
    if t.__repr__ is object.__repr__ or "0x" in (text := repr(v)):
        return f"{t.__module__}.{t.__qualname__}"
    return text


def tree_digest(obj: Any, persistent_id: Any) -> bytes:
    """A hash of `obj` by content, the same however its equal parts happen to be shared
    (pickle's memo is not), computed once per distinct object (so a structure that shares
    sub-values is not walked exponentially); a container met again inside itself hashes as
    a cycle marker. For parts too big to pickle without a memo."""
    done: dict[int, bytes] = {}
    on_path: set[int] = set()
    keep: list[Any] = []                  # holds what `done` refers to by id while walking
    todo: list[tuple[Any, bool]] = [(obj, False)]
    while todo:
        v, expanded = todo.pop()
        key = id(v)
        if key in done:
            continue
        t = type(v)
        if t is str or t is bytes or t is int or t is float or t is bool or v is None:
            raw = v.encode("utf-8", "surrogatepass") if t is str else \
                v if t is bytes else repr(v).encode()
            done[key] = hashlib.sha256(t.__name__.encode() + b":" + raw).digest()
            keep.append(v)
            continue
        if isinstance(v, dict):
            children: list[Any] = [x for kv in dict.items(v) for x in kv]
        elif isinstance(v, (list, tuple, collections.deque)):
            children = list(v)
        elif isinstance(v, (set, frozenset)):
            children = list(v)
        elif hasattr(v, "__getstate__") and t.__module__.startswith("gesmas.server"):
            children = [v.__getstate__()]
        else:
            d = getattr(v, "__dict__", None)
            children = [dict(d)] if type(d) is dict else [described(v)]
        if not expanded:
            on_path.add(key)
            todo.append((v, True))
            todo.extend((c, False) for c in reversed(children)
                         if id(c) not in done and id(c) not in on_path)
            keep.append(children)
            continue
        on_path.discard(key)
        parts = [done.get(id(c), b"cycle") for c in children]
        if isinstance(v, (set, frozenset)):
            parts.sort()
        head = f"{t.__module__}.{t.__qualname__}:{persistent_id(t)}:{len(parts)}:".encode()
        done[key] = hashlib.sha256(head + b"".join(parts)).digest()
        keep.append(v)
    return done[id(obj)]

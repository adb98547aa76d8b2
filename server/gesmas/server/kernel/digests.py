"""The state digest (`state_digest`, for checkpoint.py's `Checkpoints.digest`), and a hash of
a value by its content (its fallback, `tree_digest`): the same
however equal parts happen to be shared, for parts too big to pickle without a memo, or that
cannot be pickled at all (a lambda, a generator: hashed by kind and name)."""
from __future__ import annotations

import collections
import hashlib
import io
import pickle
from typing import Any, Callable

from .measure import state_size
from .records import DIGEST_HOOKED


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


def state_digest(cp: Any, volatile: bool, parts: dict[str, str] | None,
                 pickle_state: Callable[[Any, Any], bytes], every_remembered: bool = False) -> str:
    """`Checkpoints.digest` (checkpoint.py) of the state the Checkpoints `cp` holds, see
    there; `pickle_state` pickles a part with a memo (checkpoint.py's). What sessions
    remember is hashed as what their end would act on (records.DIGEST_HOOKED), or, with
    `every_remembered`, as all of it: the digest before checkpoint command version 9, which
    backups taken by an earlier gesmas carry (backup.load_checked)."""
    hooked = DIGEST_HOOKED.set(None if every_remembered else frozenset(
        n for n, r in cp.state.objects.items() if r.cls.ends_with_sessions()))
    try:
        return _state_digest(cp, volatile, parts, pickle_state)
    finally:
        DIGEST_HOOKED.reset(hooked)


def _state_digest(cp: Any, volatile: bool, parts: dict[str, str] | None,
                  pickle_state: Callable[[Any, Any], bytes]) -> str:
    h = hashlib.sha256()
    registry = pickle.dumps(cp.registry.dump(), protocol=5)
    h.update(registry)
    if parts is not None:
        parts["registry"] = hashlib.sha256(registry).hexdigest()[:12]
    waits = [(r.index, r.session, r.seq, r.tags, r.waiter.deadline if r.waiter else None)
             for r in cp.runner.blocked()]
    state = cp.saved_state()
    del state["format"]     # how a checkpoint encodes the state, not the state
    del state["order"]      # a counter whose absolute value a checkpoint's re-run shifts
    del state["sizes"]      # measured at checkpoints (a cache of what the objects hold)
    state.pop("hooked_touched", None)   # what sessions remember: hashed as DIGEST_HOOKED says
    if not volatile:
        del state["index"], state["now"]
    objects = [(n, r.cls.name, r.cls.version, r.instance)
               for n, r in cp.state.objects.items()]
    limit = 1 << 22        # unfolded bytes past which a part is hashed by content
    named = [(f"state.{k}", v) for k, v in state.items()] if parts is not None else []
    for name, part in [("waits", waits)] + [(f"object {o[0]}", o) for o in objects] + named:
        if parts is not None:
            got = part_bytes(part, limit, cp.registry, pickle_state)
            parts[name] = hashlib.sha256(got).hexdigest()[:12]
    for part in (state, waits, *objects):
        h.update(part_bytes(part, limit, cp.registry, pickle_state))
    return h.hexdigest()


def part_bytes(part: Any, limit: int, registry: Any,
                pickle_state: Callable[[Any, Any], bytes]) -> bytes:
    """What the digest hashes of one part: its memo-less pickle, a pickle with a memo if it
    has a cycle, or a digest of its tree when it unfolds past `limit` bytes."""
    if state_size(part, limit, unfold=True) > limit:
        return tree_digest(part, registry.persistent_id)
    buf = io.BytesIO()
    p = pickle.Pickler(buf, protocol=5)
    p.fast = True
    p.persistent_id = registry.persistent_id  # type: ignore[method-assign]
    try:
        p.dump(part)
    except ValueError:                       # a cycle
        try:
            return pickle_state(registry, part)
        except Exception:
            return tree_digest(part, registry.persistent_id)
    except Exception:                        # a lambda, a generator, too deep a nesting...
        return tree_digest(part, registry.persistent_id)
    return buf.getvalue()

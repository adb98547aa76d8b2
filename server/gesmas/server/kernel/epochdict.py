"""A dict in insertion order whose storage is split into dicts of at most EPOCH keys, for the
kernel's tables of objects (records.ObjectTable, frametable.FrameTable).

Why. A dict grows its table all at once: the insert that fills it to two thirds copies every
entry into a table twice the size, holding the GIL. At 349,525 and 699,050 keys that one
insert took 15-20 ms and 30-40 ms on this host (`python bench/dict_resize_bench.py`), more
with the CPUs busy, and the object table, the frame table and its page index all grew in the
same apply: every replica applies that entry at about the same moment, so the cluster stopped
for it (87-127 ms seen by a produce at 10^6 objects, docs/performance.md). Here no dict holds
more than EPOCH keys, so no insert copies more than that.

How. `parts` are plain dicts, the last one takes new keys; once it holds EPOCH a new one is
started. Iterating goes part after part, each in its own order: every key of a part was
inserted after every key of the parts before it (a part only ever receives keys while it is
the last), so the order is the insertion order a dict would give, which the checkpoint and the
state digest walk (DESIGN §3: the same on every replica, and after a restore, which inserts
the keys again in that order). A key set again stays in its part, one deleted then set again
goes to the end, as in a dict. A part left empty is dropped. Where the parts' boundaries fall
differs between a replica that ran the log and one restored from a checkpoint (deletions empty
parts unevenly); nothing but the cost of a lookup depends on them.

`where` says which part holds a key: SHARDS dicts, a key in the one its hash picks, mapping it
to its part. Looking through the parts instead cost a cache miss a part (31 parts at 10^6
keys): 5.4 us a key that is not there, 17 us a frame made at 10^6 objects (three such
lookups; a capture's `settle` of 4,000 frames: 67 ms here, 41-86 ms on a busy leader,
`python bench/dict_resize_bench.py`, docs/performance.md). Through `where` a key is two
lookups, one if it is absent (~0.5 us). `where` is never iterated
and never pickled (`__reduce__` gives the items), so that the shards, which depend on the
process's hash seed, decide nothing but where a lookup goes; each holds about 1/SHARDS of the
keys, so none grows by more than that at once either.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, MutableMapping
from itertools import chain
from typing import Any, TypeVar

K = TypeVar("K")
V = TypeVar("V")

#: Keys per part: resizing a dict of 2^15 keys copies ~0.5 MB (~1-2 ms here).
EPOCH = 1 << 15

#: Shards of `where` (a power of two): at 10^6 keys each holds ~16,000.
SHARDS = 64
_MASK = SHARDS - 1

_MISSING: Any = object()


class EpochDict(MutableMapping[K, V]):
    """A mutable mapping in insertion order, kept in dicts of at most EPOCH keys (module
    docstring). Not thread-safe, as the kernel's tables need not be."""

    __slots__ = ("parts", "where")

    def __init__(self, items: Iterable[tuple[K, V]] = ()) -> None:
        self.parts: list[dict[K, V]] = [{}]
        self.where: list[dict[K, dict[K, V]]] = [{} for _ in range(SHARDS)]
        self.put_all(items)

    def __getitem__(self, key: K) -> V:
        part = self.where[hash(key) & _MASK].get(key)
        if part is None:
            raise KeyError(key)
        return part[key]

    def get(self, key: K, default: Any = None) -> Any:
        part = self.where[hash(key) & _MASK].get(key)
        return default if part is None else part[key]

    def __contains__(self, key: object) -> bool:
        return key in self.where[hash(key) & _MASK]

    def __setitem__(self, key: K, value: V) -> None:
        self.put(key, value)

    def put(self, key: K, value: V) -> bool:
        """Set `key` to `value`; whether the key is new."""
        shard = self.where[hash(key) & _MASK]
        part = shard.get(key)
        if part is not None:
            part[key] = value
            return False
        part = self.parts[-1]
        if len(part) >= EPOCH:
            part = {}
            self.parts.append(part)
        part[key] = value
        shard[key] = part
        return True

    def __delitem__(self, key: K) -> None:
        part = self.where[hash(key) & _MASK].pop(key, None)
        if part is None:
            raise KeyError(key)
        del part[key]
        if not part:
            self._drop(part)

    def put_all(self, items: Iterable[tuple[K, V]]) -> None:
        """Set each (key, value) of `items` as EpochDict.__setitem__ does (a subclass's own
        __setitem__ is not called: as dict.update(self, ...) on a dict subclass)."""
        where, parts = self.where, self.parts
        last = parts[-1]
        for key, value in items:
            shard = where[hash(key) & _MASK]
            part = shard.get(key)
            if part is None:
                if len(last) >= EPOCH:
                    last = {}
                    parts.append(last)
                part = shard[key] = last
            part[key] = value

    def values_of(self, keys: Iterable[K]) -> list[V]:
        """The values of `keys`, in order; keys inserted one after another are found in the
        part the one before was in, at the cost of one lookup."""
        out = []
        where = self.where
        last = self.parts[-1]
        for key in keys:
            value = last.get(key, _MISSING)
            if value is _MISSING:
                part = where[hash(key) & _MASK].get(key)
                if part is None:
                    raise KeyError(key)
                last = part
                value = part[key]
            out.append(value)
        return out

    def _drop(self, part: dict[K, V]) -> None:
        """Forget the part `part`, left empty (the only part is kept)."""
        if len(self.parts) > 1:
            self.parts = [p for p in self.parts if p is not part]

    def pop(self, key: K, default: Any = _MISSING) -> Any:
        part = self.where[hash(key) & _MASK].pop(key, None)
        if part is None:
            if default is _MISSING:
                raise KeyError(key)
            return default
        value = part.pop(key)
        if not part:
            self._drop(part)
        return value

    def popitem(self) -> tuple[K, V]:
        """The last key inserted and its value, removed (as dict.popitem)."""
        for part in reversed(self.parts):
            if part:
                item = part.popitem()
                del self.where[hash(item[0]) & _MASK][item[0]]
                if not part:
                    self._drop(part)
                return item
        raise KeyError("popitem(): the mapping is empty")

    def clear(self) -> None:
        self.parts = [{}]
        self.where = [{} for _ in range(SHARDS)]

    def __len__(self) -> int:
        return sum(len(part) for part in self.parts)

    def __bool__(self) -> bool:
        return any(self.parts)

    def __iter__(self) -> Iterator[K]:
        return chain.from_iterable(list(self.parts))     # each part at C speed

    def keys(self) -> Any:
        return _Keys(self)

    def values(self) -> Any:
        return _Values(self)

    def items(self) -> Any:
        return _Items(self)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (EpochDict, dict)):
            return len(self) == len(other) and all(
                k in other and other[k] == v for k, v in self.items())
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self) -> Any:
        # the items, not the shards: another process hashes the keys to other shards
        return (type(self), (list(self.items()),))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({list(self.items())!r})"


class _Keys:
    __slots__ = ("_d",)

    def __init__(self, d: EpochDict[Any, Any]) -> None:
        self._d = d

    def __iter__(self) -> Iterator[Any]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def __contains__(self, key: object) -> bool:
        return key in self._d


class _Values:
    __slots__ = ("_d",)

    def __init__(self, d: EpochDict[Any, Any]) -> None:
        self._d = d

    def __iter__(self) -> Iterator[Any]:
        return chain.from_iterable([part.values() for part in self._d.parts])

    def __len__(self) -> int:
        return len(self._d)


class _Items:
    __slots__ = ("_d",)

    def __init__(self, d: EpochDict[Any, Any]) -> None:
        self._d = d

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        return chain.from_iterable([part.items() for part in self._d.parts])

    def __len__(self) -> int:
        return len(self._d)

    def __contains__(self, item: object) -> bool:
        if not isinstance(item, tuple) or len(item) != 2:
            return False
        value = self._d.get(item[0], _MISSING)
        return value is not _MISSING and value == item[1]

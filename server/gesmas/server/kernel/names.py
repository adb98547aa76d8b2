"""The object names in sorted order, kept as objects come and go, for listings by page.

A listing of 10^6 objects must not sort them on every page (sorting 10^6 shuffled names
takes ~2 s here), and a sorted Python list kept with `bisect.insort` costs a memmove of half
the list per create or delete (~0.25 ms at 10^6 names, a quarter of what a create costs).
So the names are held in sorted chunks of at most 2 * LOAD names, with the last name of each
chunk in `maxes` (the layout of sortedcontainers' SortedList): adding or removing a name
bisects `maxes`, then one chunk (O(log n + LOAD)), and a page starts with two bisections and
then walks the chunks in order (O(log n + page)).

The order is a function of the set of names alone (Python compares strings by code point,
which is also the order of their UTF-8 bytes), so replicas that hold the same objects list
them alike however the chunks happen to be cut. It is derived data, neither saved in
checkpoints nor hashed by the state digest: a restore sorts the restored names once
(records.ObjectTable.bulk; on this loaded machine one sort of 10^6 shuffled names took
~2 s, 10^6 inserts ~12 s).

Threading: changed on the apply thread only, read by reads that are serialized with the
applying of entries.
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from typing import Iterator

LOAD = 1000          # a chunk splits in two past 2 * LOAD names


class SortedNames:
    __slots__ = ("_chunks", "_maxes", "_len")

    def __init__(self) -> None:
        self._chunks: list[list[str]] = []
        self._maxes: list[str] = []       # _maxes[i] == _chunks[i][-1]
        self._len = 0

    @classmethod
    def of(cls, names: list[str]) -> SortedNames:
        """The names of the sorted list `names`, without duplicates (one pass)."""
        s = cls()
        s._chunks = [names[i:i + LOAD] for i in range(0, len(names), LOAD)]
        s._maxes = [chunk[-1] for chunk in s._chunks]
        s._len = len(names)
        return s

    def __len__(self) -> int:
        return self._len

    def add(self, name: str) -> None:
        """Add `name`, which must not be held already (the object table checks)."""
        chunks, maxes = self._chunks, self._maxes
        if not chunks:
            chunks.append([name])
            maxes.append(name)
            self._len = 1
            return
        i = bisect_left(maxes, name)
        if i == len(maxes):               # past every name: the last chunk takes it
            i -= 1
            chunks[i].append(name)
            maxes[i] = name
        else:
            insort(chunks[i], name)
        self._len += 1
        chunk = chunks[i]
        if len(chunk) > 2 * LOAD:
            chunks.insert(i + 1, chunk[LOAD:])
            del chunk[LOAD:]
            maxes.insert(i, chunk[-1])

    def discard(self, name: str) -> None:
        """Remove `name` if it is held."""
        maxes = self._maxes
        i = bisect_left(maxes, name)
        if i == len(maxes):
            return
        chunk = self._chunks[i]
        j = bisect_left(chunk, name)
        if chunk[j] != name:
            return
        del chunk[j]
        self._len -= 1
        if not chunk:
            del self._chunks[i]
            del maxes[i]
        elif j == len(chunk):
            maxes[i] = chunk[-1]

    def __contains__(self, name: object) -> bool:
        if type(name) is not str:
            return False
        i = bisect_left(self._maxes, name)
        if i == len(self._maxes):
            return False
        chunk = self._chunks[i]
        return chunk[bisect_left(chunk, name)] == name

    def since(self, start: str, inclusive: bool) -> Iterator[str]:
        """The names >= `start` (`inclusive`) or > `start`, in order. The set of names must
        not change while the iterator is used."""
        find = bisect_left if inclusive else bisect_right
        chunks, maxes = self._chunks, self._maxes
        i = find(maxes, start)
        if i == len(maxes):
            return
        chunk = chunks[i]
        yield from chunk[find(chunk, start):]
        for i in range(i + 1, len(chunks)):
            yield from chunks[i]

    def __iter__(self) -> Iterator[str]:
        for chunk in self._chunks:
            yield from chunk

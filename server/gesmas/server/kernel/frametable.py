"""The kernel's table of checkpoint frames (`State.frames`), kept in pages whose frames a
format-7 capture joined are kept joined, and only joined, until one of them changes.

Theory of operation. A format-7/8 checkpoint's blob holds every object's frame, in the
table's order (listed.py). Joining them costs ~0.2 us a frame even when none changed (each
bytes object is touched): ~0.2-0.6 s of each replica's CPU at 10^6 objects, at every
checkpoint, however few objects changed since the last. So the table, a dict in insertion
order as before, also puts the names in *pages*: PAGE names inserted one after another, so
that the pages one after the other are the table's order (a name removed leaves a hole; a
name inserted again goes to the last page).

A capture joins the table a page at a time (`ListedCapture.join_some`). The bytes it joined
for a page are kept (`joined`), with where each frame ends in them (`ends`) and the page's
names then (`kept`), and the page's frames are then held only there: the dict maps their
names to KEPT, which frees each frame's own bytes object (in-process, 3x10^5 Counters made in
four batches: 858 -> 765 bytes of RSS an object). A page is *fresh* while none of its frames
was set, removed or added since it was joined: the next capture uses its bytes again, at
almost no cost. A change only marks its page not fresh (O(1): the frames it did not touch
stay in the joined bytes), and the next capture joins that page again, cutting those frames
out of the old bytes (~1-2 ms a page). Reading a frame (`__getitem__`, `get`, `values`,
`items`) gives the frame, kept or not. The blob is the same bytes either way: only the work
differs.

A restore fills the table with every page kept (`load`): the blob holds the frames one
after another in the table's order, so a page's bytes are cut from it in one copy and no
frame is held on its own; the first capture after a restore then joins only the pages that
changed since, as on a replica that never stopped (in-process at 10^6 objects, that first
capture's CPU fell from 0.49-0.64 s to 0.18-0.24 s; the restore itself took as long).

When the pages have become mostly holes (objects made and removed: more than twice the
pages the names need, and 16), the names are put in pages again, in the same order
(`repage`). Never pickled: a cache, not state (the blob is the state).
"""
from __future__ import annotations

import itertools
from array import array
from typing import Any, Iterable, Iterator

from .epochdict import EpochDict

#: Names per page: a page joined again costs ~1 ms (4096 frames of ~100 bytes).
PAGE = 4096


class _Kept:
    __slots__ = ()

    def __repr__(self) -> str:
        return "KEPT"


#: What the dict maps a name of a kept page to (its frame is in the page's bytes).
KEPT: Any = _Kept()


class FrameTable(EpochDict[str, Any]):
    """name -> frame (bytes), None until saved, or a capture.Slot (formats 5-6): a dict in
    the table's order, in pages that a format-7 capture keeps joined (module docstring)."""

    __slots__ = ("page_of", "names", "kept", "joined", "ends", "fresh")

    def __init__(self) -> None:
        super().__init__()
        self.page_of: EpochDict[str, int] = EpochDict()   # name -> its page
        self.names: list[list[str]] = []       # each page's names, in the table's order
        # a page joined by a capture: its names then (the same list until one is added or
        # removed), its frames joined, where each ends; None for a page never joined
        self.kept: list[list[str] | None] = []
        self.joined: list[bytes | None] = []
        self.ends: list[Any] = []
        self.fresh: list[bool] = []            # joined, and no frame changed since

    # -- reading: a frame, kept or not -------------------------------------------------------------

    def _cut(self, page: int, i: int) -> bytes:
        """The i-th frame of the page's joined bytes."""
        ends = self.ends[page]
        return self.joined[page][ends[i - 1] if i else 0:ends[i]]   # type: ignore[index]

    def __getitem__(self, name: str) -> Any:
        frame = EpochDict.__getitem__(self, name)
        if frame is KEPT:
            page = self.page_of[name]
            return self._cut(page, self.kept[page].index(name))    # type: ignore[union-attr]
        return frame

    def get(self, name: str, default: Any = None) -> Any:
        return self[name] if name in self else default

    def items(self) -> Iterator[tuple[str, Any]]:    # type: ignore[override]
        for page in self.pages():
            yield from zip(self.names[page], self._frames(page))

    def values(self) -> Iterator[Any]:                # type: ignore[override]
        for page in self.pages():
            yield from self._frames(page)

    def _frames(self, page: int, raw: list[Any] | None = None) -> list[Any]:
        """The page's frames, in its order: those held only in its joined bytes cut out.
        `raw`: what the dict maps the page's names to, in order, if the caller has it."""
        names = self.names[page]
        if raw is None:
            raw = self.values_of(names)
        frames = raw
        kept = self.kept[page]
        if kept is None:
            return frames
        blob, ends = self.joined[page], self.ends[page]
        if kept is names:
            at: Any = None
        else:                                  # names added or removed since: find each
            at = {name: i for i, name in enumerate(kept)}
        for j, frame in enumerate(frames):
            if frame is KEPT:
                i = j if at is None else at[names[j]]
                frames[j] = blob[ends[i - 1] if i else 0:ends[i]]  # type: ignore[index]
        return frames

    # -- changes: a page changed is no longer fresh ----------------------------------------------

    def __setitem__(self, name: str, frame: Any) -> None:
        page = self.page_of.get(name)
        if page is None:
            names = self.names
            if not names or len(names[-1]) >= PAGE:
                self._new_page([])
            page = len(names) - 1
            if names[page] is self.kept[page]:
                names[page] = list(names[page])   # the kept order stays as it was joined
            self.page_of[name] = page
            names[page].append(name)
        self.fresh[page] = False
        EpochDict.__setitem__(self, name, frame)

    def pop(self, name: str, *default: Any) -> Any:
        page = self.page_of.get(name)
        if page is None:
            return EpochDict.pop(self, name, *default)
        frame = self[name]
        names = self.names[page]
        if names is self.kept[page]:
            self.names[page] = [n for n in names if n != name]
        else:
            names.remove(name)
        del self.page_of[name]
        EpochDict.pop(self, name)
        self.fresh[page] = False
        if len(self.names) > 2 * (len(self) // PAGE) + 16:
            self.repage()                      # mostly holes: fewer, fuller pages
        return frame

    def __delitem__(self, name: str) -> None:
        if name not in self:
            raise KeyError(name)
        self.pop(name)

    def update(self, other: Any = (), **kw: Any) -> None:   # type: ignore[override]
        items = other.items() if hasattr(other, "items") else other
        for name, frame in itertools.chain(items, kw.items()):
            self[name] = frame

    def setdefault(self, name: str, default: Any = None) -> Any:
        if name not in self:
            self[name] = default
        return self[name]

    def clear(self) -> None:
        EpochDict.clear(self)
        self.page_of.clear()
        self.names, self.kept, self.joined, self.ends, self.fresh = [], [], [], [], []

    def popitem(self) -> tuple[str, Any]:
        raise NotImplementedError("FrameTable.popitem")

    def copy(self) -> dict[str, Any]:
        return dict(self.items())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, (dict, EpochDict)):
            return NotImplemented
        if isinstance(other, FrameTable):
            other = dict(other.items())
        return dict(self.items()) == other

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    __hash__ = None

    def __reduce__(self) -> Any:
        raise TypeError("the table of frames is a cache, not state: it is not pickled")

    def repage(self) -> None:
        """Put the names in pages again, in the table's order, none of them joined."""
        frames = dict(self.items())
        self.clear()
        self.put_all(frames.items())
        order = list(frames)
        for i in range(0, len(order), PAGE):
            self._new_page(order[i:i + PAGE])

    def load(self, frames: list[tuple[str, Any]], blob: bytes) -> None:
        """Fill an empty table as a restore finds it: `frames` in the blob's order, each a
        frame, None, or where its frame is in `blob` as (start, end). A page of such places
        is kept joined at once, as a capture leaves it: its bytes are cut from the blob (one
        copy a page, no bytes object a frame), and the first capture after the restore joins
        none of it again."""
        if self:
            raise ValueError("FrameTable.load fills an empty table")
        for i in range(0, len(frames), PAGE):
            chunk = frames[i:i + PAGE]
            names = [name for name, _ in chunk]
            page = self._new_page(names)
            places = [where for _, where in chunk]
            if all(type(where) is tuple for where in places):
                start = places[0][0]
                if all(a[1] == b[0] for a, b in zip(places, places[1:])):
                    joined = blob[start:places[-1][1]]       # one after another in the blob
                    ends = array("Q", (end - start for _, end in places))
                else:                                          # an object dropped between
                    parts = [blob[a:b] for a, b in places]
                    joined = b"".join(parts)
                    ends = array("Q", itertools.accumulate(map(len, parts)))
                self._hold(page, joined, ends)
            else:
                self.put_all((name, blob[where[0]:where[1]] if type(where) is tuple
                              else where) for name, where in chunk)

    def _new_page(self, names: list[str]) -> int:
        """A page after the last, of `names` (already in the dict, or about to be), none
        kept; its number."""
        page = len(self.names)
        self.names.append(names)
        self.kept.append(None)
        self.joined.append(None)
        self.ends.append(None)
        self.fresh.append(False)
        self.page_of.put_all((name, page) for name in names)
        return page

    def _hold(self, page: int, joined: bytes, ends: Any) -> None:
        """The page's frames held only in `joined`, each ending at `ends`: kept, fresh."""
        names = self.names[page]
        self.kept[page], self.joined[page], self.ends[page] = names, joined, ends
        self.fresh[page] = True
        self.put_all((name, KEPT) for name in names)

    # -- the pages, for a capture -------------------------------------------------------------

    def raw(self) -> Iterator[Any]:
        """What the dict maps each name to, in the table's order (KEPT for a kept frame)."""
        return itertools.chain.from_iterable([part.values() for part in self.parts])

    def pages(self) -> Iterable[int]:
        """The pages that hold names, in the table's order."""
        return (p for p, names in enumerate(self.names) if names)

    def keep(self, page: int, raw: list[Any] | None = None) -> bytes:
        """The page's frames joined, and the page kept fresh: its frames held only there
        until one changes (module docstring). `raw` as for `_frames` (a capture reads the
        dict's values in order, at C speed). Raises TypeError if a frame is not bytes (an
        object not saved: a caller's bug), and changes nothing then."""
        frames = self._frames(page, raw)
        blob = b"".join(frames)
        self._hold(page, blob, array("Q", itertools.accumulate(map(len, frames))))
        return blob


def skip(it: Iterator[Any], n: int) -> None:
    """Advance `it` by `n` items (at C speed)."""
    next(itertools.islice(it, n, n), None)

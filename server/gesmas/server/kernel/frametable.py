"""The kernel's table of checkpoint frames (`State.frames`), kept in pages whose frames a
format-7 capture joined are kept joined until one of them changes.

Theory of operation. A format-7/8 checkpoint's blob holds every object's frame, in the
table's order (listed.py). Joining them costs ~0.2 us a frame even when none changed (each
bytes object is touched): ~0.2-0.6 s of each replica's CPU at 10^6 objects, at every
checkpoint, however few objects changed since the last. So the table, a dict in insertion
order as before, also knows which *page* each name is in: the names inserted one after
another, PAGE at a time, so that a page is a run of the table's order (a name removed leaves
a hole; a name inserted again goes to the last page). A capture joins the pages one after the
other; the bytes it joined for a page are kept (`joined`), and used again by the next capture
unless a frame of the page was set, removed or added since (every change to the table goes
through `__setitem__`, `pop` and `update`, which forget the page's bytes). The blob is the same
bytes either way: only the work differs.

The price is memory: the joined pages (about the size of the blob: ~105 bytes an object) and
a page number per name (in-process at 5x10^5 Counters, 793 -> 907 bytes of RSS an object).
When the pages have become mostly holes (objects made and removed: more than twice the pages
the names need, and 16), the names are put in pages again, in the same order (`repage`).

Only the listed capture reads the pages (`ListedCapture.join_some`); formats 6 and older copy
the values as before.
"""
from __future__ import annotations

import itertools
from typing import Any, Iterable, Iterator

#: Names per page: a page re-joined costs ~1 ms (4096 frames of ~100 bytes).
PAGE = 4096


def skip(it: Iterator[Any], n: int) -> None:
    """Advance `it` by `n` items (at C speed)."""
    next(itertools.islice(it, n, n), None)


class FrameTable(dict):
    """name -> frame (bytes), None until saved, or a capture.Slot (formats 5-6): a dict in
    the table's order, that knows each name's page and keeps the pages a capture joined."""

    __slots__ = ("page_of", "counts", "joined", "_tail", "_filled")

    def __init__(self) -> None:
        super().__init__()
        self.page_of: dict[str, int] = {}      # name -> its page
        self.counts: list[int] = []            # names in each page
        self.joined: list[bytes | None] = []   # each page's frames joined, or None
        self._tail = -1                        # the page new names go to
        self._filled = PAGE                    # names put in it so far

    # -- changes: each forgets the joined bytes of the page it touches ---------------------------

    def __setitem__(self, name: str, frame: Any) -> None:
        page = self.page_of.get(name)
        if page is None:
            if self._filled >= PAGE:
                self.counts.append(0)
                self.joined.append(None)
                self._tail, self._filled = len(self.counts) - 1, 0
            page = self.page_of[name] = self._tail     # (one int object per page)
            self._filled += 1
            self.counts[page] += 1
        self.joined[page] = None
        dict.__setitem__(self, name, frame)

    def pop(self, name: str, *default: Any) -> Any:
        page = self.page_of.pop(name, None)
        if page is None:
            return dict.pop(self, name, *default)
        self.counts[page] -= 1
        self.joined[page] = None
        frame = dict.pop(self, name)
        if len(self.counts) > 2 * (len(self) // PAGE) + 16:
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
        return dict.__getitem__(self, name)

    def clear(self) -> None:
        dict.clear(self)
        self.page_of.clear()
        self.counts, self.joined = [], []
        self._tail, self._filled = -1, PAGE

    def popitem(self) -> tuple[str, Any]:
        raise NotImplementedError("FrameTable.popitem")

    def __reduce__(self) -> Any:
        raise TypeError("the table of frames is a cache, not state: it is not pickled")

    def repage(self) -> None:
        """Put the names in pages again, in the table's order (every page's bytes
        forgotten)."""
        names = list(self)
        self.page_of.clear()
        n = (len(names) + PAGE - 1) // PAGE
        self.counts = [PAGE] * n
        if n:
            self.counts[-1] = len(names) - PAGE * (n - 1)
        self.joined = [None] * n
        for page in range(n):
            self.page_of.update(dict.fromkeys(names[page * PAGE:(page + 1) * PAGE], page))
        self._tail, self._filled = (n - 1, self.counts[-1]) if n else (-1, PAGE)

    # -- the pages, for a capture -------------------------------------------------------------

    def pages(self) -> Iterable[int]:
        """The pages that hold names, in the table's order."""
        return (p for p, n in enumerate(self.counts) if n)

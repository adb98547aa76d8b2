"""The capture of a format-7 checkpoint (`Checkpoint.listed_after`): the changed objects
found after the entry, the frames joined straight from the kernel's table, and what follows
the frames (capture.py has the theory of operation of a deferred capture; this module the
one thing format 7 does differently, in `ListedCapture`'s docstring).
"""
from __future__ import annotations

import itertools
from typing import Any, Iterator

from .capture import Capture, Slot
from .frametable import FrameTable, skip
from .records import unshared_pickle


#: Names or sizes in one pickled list after a format-7 checkpoint's frames.
TRAILER_CHUNK = 4096

#: Frames a format-7 idle slice joins at most (a page of the table at least: frametable.py),
#: ~0.2-0.3 us each (a page kept joined since the last capture counts a sixteenth): ~1 ms.
LISTED_JOIN_SLICE = 4096

#: The slot `ListedCapture.take` hands out: a saved object's frame goes to the kernel's
#: table, so no slot per object is made (nor freed when the capture ends).
_SCRATCH = Slot()


class ListedCapture(Capture):
    """The capture of a format-7 checkpoint (`Checkpoint.listed_after`). The entry hands it
    the set of objects changed since the last checkpoint as it is (`unsaved`: names of
    standard-class objects, and of objects removed before K, which are skipped), and the
    kernel's table of frames itself; nothing per object, no copy of the table. It finds its
    objects itself:

      * an object is to be saved if its name is in `unsaved` and it exists when it comes to
        be saved: an object of K removed after K was saved before (seal), and a name made
        after K is taken out of the set as it is made (`made`), so what exists then is the
        object of K; its new frame replaces its old one in the table, in place;
      * the table keeps the frames of K, in their order, until the capture ends: an object
        removed after K leaves it only then (`removed`), and one made after K joins it only
        then (`added`), as if each had happened at its moment. So once every object is
        saved, the table's frames are the checkpoint's, and the idle slices join them
        straight from it;
      * the deferred objects' names follow the frames (a restore measures them, as for
        formats 5 and 6), in the table's order, which a restored replica's table has too
        (no sort), gathered as the frames are joined; so do the sizes still to apply at K
        (`take_sizes`), and the sizes this capture measured are applied in that order.
        The parts after the frames are lists pickled one at a time by the idle slices.

    So the entry costs neither a slot per changed object in name order (~3.5 us each at
    40,000) nor a copy of the frames (~0.1 us a frame, every frame touched), nor a list of
    the names to save (the idle slices pop them from the set: ~13 ms at 220,000). And no
    idle slice does work in proportion to the objects: the sizes are put in the table's
    order as the frames are joined (in one slice, ~0.15-0.27 s at 2x10^5 objects), and a
    saved object gets no slot of its own (none to free when the capture ends)."""

    listed = True

    def __init__(self, index: int, head: bytes, frames: FrameTable, unsaved: set[str],
                 keep: set[str], calls: list[Any]) -> None:
        super().__init__(index, head, [], {}, keep, calls)   # (no slots, no todo list)
        self.frames = frames          # the kernel's table (State.frames), as at K until closed
        self.count = len(frames)
        # the objects still to save; the idle slices take them from the set itself, in its
        # order (`next_todo`: the bytes do not depend on it), so the entry copies nothing
        self.unsaved: set[str] = unsaved
        self._popped: str | None = None   # the name next_todo took out of `unsaved`
        self.deferred: list[str] = []  # the saved names in the table's order (the join)
        self.removed: list[str] = []   # objects of K removed since, to leave the table
        self.added: dict[str, None] = {}   # objects made since, to join the table
        self._pages: Any = None        # the table's pages not joined yet (an iterator)
        self._raw: Any = None          # ... and what the table maps their names to
        self._after: Iterator[bytes] = iter(())   # the parts after the frames, to pickle
        self._listed = False           # `deferred` and `sizes` in the table's order
        # the sizes of the saved objects, in the table's order, made as the frames are
        # joined (`sizes` then becomes it): no slice makes it all at once
        self._ordered: dict[str, tuple[Any, int] | None] = {}
        # the sizes of the capture before, still to apply at K (Deferred.applying: not
        # changed after K): name -> (record, size) or None
        self.pending: dict[str, tuple[Any, int] | None] = {}

    def take(self, name: str, objects: dict[str, Any]) -> Slot | None:
        if name == self._popped:
            self._popped = None
        elif name in self.unsaved:
            self.unsaved.discard(name)
        else:
            return None
        if name not in objects:       # removed before K (seal saves one removed after K)
            return None
        return _SCRATCH               # (the frame goes to the table; `sizes` says saved)

    def is_unsaved(self, name: str) -> bool:
        return name in self.unsaved

    def any_unsaved(self) -> bool:
        return bool(self.unsaved)

    def next_todo(self) -> str | None:
        """A name taken out of `unsaved` (set.pop: no copy of the set at the entry), which
        `take` then accepts; the caller saves it at once."""
        if not self.unsaved:
            return None
        self._popped = self.unsaved.pop()
        return self._popped

    def all_unsaved(self) -> list[str]:
        return list(self.unsaved)

    def forget_size(self, name: str) -> None:
        super().forget_size(name)
        if name in self._ordered:     # (during the join)
            self._ordered[name] = None

    def made(self, name: str) -> None:
        self.unsaved.discard(name)
        self.added[name] = None

    def gone(self, name: str) -> None:
        if name in self.added:        # made after K
            del self.added[name]
        elif name in self.frames:
            self.removed.append(name)

    def close(self) -> None:
        # the sizes in the order of the table (as `deferred`): made by the join, or here if
        # the blob is not made (an object could not be saved)
        if self.failed and not self._listed:
            sizes = self.sizes
            self.deferred = [name for name in self.frames if name in sizes]
            self.sizes = {name: sizes.get(name) for name in self.deferred}
            self._listed = True

    def join_some(self, n: int) -> bool:
        """As Capture's, and with the frames the saved objects' names in the table's order
        (`deferred`: a restored replica has the same table, in the same order), then the
        parts after the frames: the deferred names, and the sizes still to apply at K, in
        lists of TRAILER_CHUNK, each list pickled on its own, an empty one after each."""
        calls, c = self.calls, self.pickled
        if c < len(calls):
            return super().join_some(n)
        if self.joined < self.count:
            self._join_pages(min(n, LISTED_JOIN_SLICE))
            return True
        if not self._listed:          # every frame joined (or none at K)
            self.sizes, self._ordered = self._ordered, {}
            self._listed = True
            self._after = self._parts_after()
        part = next(self._after, None)
        if part is None:
            return False
        self.chunks.append(part)
        return True

    def _join_pages(self, budget: int) -> None:
        """Join the table's next pages into chunks, until about `budget` frames' worth of
        work is done: a page fresh since a capture joined it (frametable.py) is that
        capture's bytes again, at a sixteenth of the cost; the others are joined and kept,
        their saved objects' names put in `deferred` in the table's order."""
        table = self.frames
        if self._pages is None:
            assert len(table) == self.count, "the table of frames changed size"
            self._pages = iter(table.pages())
            self._raw = table.raw()
        names_of, fresh, joined = table.names, table.fresh, table.joined
        sizes, deferred, ordered, chunks = self.sizes, self.deferred, self._ordered, self.chunks
        raw = self._raw
        done = 0
        while done < budget and self.joined < self.count:
            page = next(self._pages)
            names = names_of[page]
            if fresh[page]:
                chunk = joined[page]
                skip(raw, len(names))
                done += 1 + (len(names) >> 4)
            else:
                try:
                    chunk = table.keep(page, list(itertools.islice(raw, len(names))))
                except TypeError:     # a frame left None (an object of K not saved: a bug)
                    raise AssertionError(f"checkpoint {self.index}: an object of page {page} "
                                         "has no frame") from None
                for name in filter(sizes.__contains__, names):    # saved by this capture
                    deferred.append(name)
                    ordered[name] = sizes.get(name)
                done += len(names)
            chunks.append(chunk)
            self.joined += len(names)

    def _parts_after(self) -> Iterator[bytes]:
        deferred = self.deferred
        for i in range(0, len(deferred), TRAILER_CHUNK):
            yield unshared_pickle(deferred[i:i + TRAILER_CHUNK])
        yield unshared_pickle([])
        pending = iter(self.pending.items())
        while True:
            chunk = list(itertools.islice(pending, TRAILER_CHUNK))
            if not chunk:
                break
            part = [(name, got[1]) for name, got in chunk if got is not None]
            if part:
                yield unshared_pickle(part)
        yield unshared_pickle([])

    def assemble(self) -> list[bytes] | None:
        assert not self.unsaved, "a checkpoint's blob assembled with objects unsaved"
        if self.failed:
            return None
        while self.join_some(1 << 40):
            pass
        return [self.head, *self.chunks]

    def settle(self) -> None:
        """The capture ended: the objects removed and made since K leave and join the
        table, in the order they would have at their moment."""
        frames = self.frames
        for name in self.removed:
            frames.pop(name, None)
        frames.update(self.added)
        self.removed, self.added = [], {}

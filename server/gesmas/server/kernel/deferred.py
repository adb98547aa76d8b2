"""The deferred captures of a kernel's checkpoints: `Deferred` holds the open capture
(capture.py has the theory of operation, `Capture` and `save_one`), saves its objects in idle
slices or before code runs on them, ends it, and applies the sizes captures measured: at the
next checkpoint (formats 6 and older) or a few per entry after it (format 7 on).
"""
from __future__ import annotations

import logging
from typing import Any, Callable

from . import stack
from .capture import Capture, save_one


log = logging.getLogger(__name__)


#: Frames an idle slice joins once every object is saved (~2-4 ms: ~0.2 us a frame).
JOIN_SLICE = 16_384


class Deferred:
    """The deferred captures of a kernel's checkpoints (module docstring): the open one, and
    the sizes the last one measured, which the next checkpoint applies."""

    def __init__(self, state: Any, runner: Any, lifecycle: Any,
                 save: Callable[[Any], tuple[bytes, Any]], measure: Callable[[Any], int],
                 captured: Callable[[Capture, list[Any] | None], None]) -> None:
        self.state, self.runner, self.lifecycle = state, runner, lifecycle
        self._save, self._measure, self._captured = save, measure, captured
        self.capture: Capture | None = None
        # sizes measured by the last capture, for the next checkpoint: name -> (its record
        # then, size), in name order (the table's order for a format-7 capture); and the
        # index they were measured at
        self.sizes_next: dict[str, tuple[Any, int] | None] = {}
        self.sizes_at = 0
        # after a format-7 checkpoint: the sizes it took from the capture before, applied
        # a few per log entry after it (`apply_some`), the rest at the next checkpoint;
        # never changed once taken (a capture writes it); those measured again or removed
        # since are `cancelled`
        self.applying: dict[str, tuple[Any, int] | None] = {}
        self.cancelled: set[str] = set()
        self._next: Any = None        # applying's items still to apply (an iterator)

    @property
    def applying_sizes(self) -> bool:
        """Whether sizes taken by a format-7 checkpoint are still to apply (`apply_some`)."""
        return self._next is not None

    def seal(self, name: str, running: bool = False) -> None:
        """Save `name` for the open capture now, if it is still to be saved: code is about to
        run on it, or it is about to be removed. `running`: a waiter on it runs again, which
        only a kept object's can (any other was saved before its waiter blocked)."""
        cap = self.capture
        if cap is None or not cap.is_unsaved(name):
            return
        assert not running or name in cap.keep, f"{name!r} runs again before it was saved"
        with stack.relative():
            self._save_one(cap, name)
        # the blob is joined by the idle slices (capture_some) or by finish, not here: a
        # call's path never pays for joining every frame

    def made(self, name: str) -> None:
        """An object named `name` was just made (Lifecycle.create): it has no frame until
        the next checkpoint saves it."""
        cap = self.capture
        if cap is not None and cap.listed:
            cap.made(name)                # joins the table when the capture ends
        else:
            self.state.frames[name] = None

    def removed(self, name: str) -> None:
        """The object `name` was removed (Lifecycle.forget), after `seal`."""
        cap = self.capture
        if cap is not None and cap.listed:
            cap.gone(name)                # leaves the table when the capture ends
        else:
            self.state.frames.pop(name, None)
        self.measured(name, True)

    def measured(self, name: str, removed: bool = False) -> None:
        """The object `name` was measured again (Lifecycle.set_size) or `removed`: a size
        measured before for it is not to be applied. These are the checks `apply_sizes`
        makes (by the record, and by `measured_at` after the index the size was measured
        at), made as it happens, so that the sizes a format-7 checkpoint takes are exact
        when it takes them: a replica restored from it knows neither the records nor
        `measured_at`."""
        index = self.state.index
        if removed or index > self.sizes_at:
            self.sizes_next.pop(name, None)
        cap = self.capture
        if cap is not None and (removed or index > cap.index):
            cap.forget_size(name)
        if name in self.applying:
            self.cancelled.add(name)

    def capture_some(self, limit: int) -> bool:
        """Save up to `limit` objects of the open capture (the apply thread's idle slices);
        whether some are left."""
        cap = self.capture
        if cap is None:
            return False
        with stack.relative():
            while limit > 0:
                name = cap.next_todo()
                if name is None:
                    break
                self._save_one(cap, name)
                limit -= 1
        if cap.any_unsaved():
            return True
        if not cap.failed:
            if limit <= 0:
                return True              # the join starts at the next slice
            if cap.join_some(JOIN_SLICE):
                return True
        self._close()
        return False

    def finish(self) -> None:
        """Save every object the open capture has left, and hand its blob's parts over."""
        cap = self.capture
        if cap is not None:
            with stack.relative():
                for name in cap.all_unsaved():
                    self._save_one(cap, name)
            self._close()

    def _save_one(self, cap: Capture, name: str) -> None:
        st = self.state
        if not save_one(cap, name, st.objects, st.frames, self._save, self._measure):
            log.error("checkpoint %d: object %r cannot be saved (%s); the checkpoint has no "
                      "blob, the next one tries again", cap.index, name, cap.failed[name])
            self.runner.changed.add(name)

    def _close(self) -> None:
        cap, self.capture = self.capture, None
        assert cap is not None
        cap.close()
        try:
            parts = cap.assemble()
        finally:
            cap.settle()
        self.sizes_next, self.sizes_at = cap.sizes, cap.index
        self._captured(cap, parts)

    def apply_sizes(self) -> None:
        """Apply the sizes the last capture measured, in name order: to the objects that were
        not removed and not measured again since. An object whose size changes is saved again
        by this checkpoint (its frame holds its size). At the entry of a checkpoint of format
        6 or older; a format-7 one applies them after its entry (`take_sizes`)."""
        sizes, at = self.sizes_next, self.sizes_at
        self.sizes_next = {}
        objects, set_size = self.state.objects, self.lifecycle.set_size
        for name, got in sizes.items():          # in name order (no sort: a dict made so)
            if got is None:
                continue                         # could not be saved
            rec, size = got
            if objects.get(name) is not rec or rec.measured_at > at or size == rec.size:
                continue
            set_size(rec, size, again=False)
            self.runner.changed.add(name)

    # -- sizes applied after a format-7 checkpoint ------------------------------------------

    def take_sizes(self) -> dict[str, tuple[Any, int] | None]:
        """At a format-7 checkpoint: what is left of the sizes being applied is applied now,
        and the sizes the last capture measured are applied after this entry, SIZES_PER_ENTRY
        at the start of each entry (`apply_some`). Their order and the entries they are
        applied at are the same on every replica, and on one restored from this checkpoint
        (its blob lists them: `restore_sizes`). Returns them (the capture writes them)."""
        self.apply_some(None)
        self.applying, self.sizes_next = self.sizes_next, {}
        self.cancelled = set()
        self._next = iter(self.applying.items()) if self.applying else None
        return self.applying

    def restore_sizes(self, pending: list[tuple[str, int]]) -> None:
        """The sizes a format-7 checkpoint was still to apply (`take_sizes`)."""
        objects = self.state.objects
        self.applying = {name: (objects[name], size) for name, size in pending
                         if name in objects}
        self.cancelled = set()
        self._next = iter(self.applying.items()) if self.applying else None

    def apply_some(self, limit: int | None) -> None:
        """Apply up to `limit` of the sizes taken by the last format-7 checkpoint (all that
        are left if None), in their order: as `Lifecycle.set_size`, and marked for the next
        checkpoint to save again (its frame holds its size)."""
        it = self._next
        if it is None:
            return
        set_size, seal, changed = self.lifecycle.set_size, self.seal, self.runner.changed
        cancelled = self.cancelled
        n = 0
        for name, got in it:
            if got is not None and name not in cancelled:
                rec, size = got
                if size != rec.size:
                    seal(name)                # an open capture saves it with its size at K
                    set_size(rec, size, again=False)
                    changed.add(name)
            n += 1
            if limit is not None and n >= limit:
                return
        self._next = None
        self.applying, self.cancelled = {}, set()


#: Sizes applied at the start of each log entry after a format-7 checkpoint (~2.5 us each:
#: the ~20,000 first sizes a checkpoint takes at creation churn are applied over ~20 entries
#: of ~2.5 ms instead of ~50 ms at the checkpoint's entry).
SIZES_PER_ENTRY = 1000

"""Deferred capture: a checkpoint's standard-class objects saved after its index, not at it.

Theory of operation. A checkpoint at index K must write every object as it was at K. Saving
an object (pickling it, loading the copy back, measuring it) costs ~26 us; a checkpoint with
20,000 objects changed since the last one held the apply thread for half a second, and every
call with it. Objects of the standard classes are therefore not saved at K: the checkpoint
gives each a `Slot` in its list of frames, and the object is saved later, in name order,
  * by `capture_some` while the apply thread has nothing else to do (idle slices), or
  * at once, by `seal(name)`, before anything can change it: before a call or a session hook
    runs on it, before a waiter on it runs again, before it is removed; and for all of them
    before the next checkpoint, and when the blob is asked for (`finish`).
Since nothing changes an object between K and the moment it is saved, what is saved is its
state at K, whenever that moment comes: the blob of K is the same bytes on every replica, and
the same as if every object had been saved at K.

What saving an object does besides writing its frame is the same whenever it is done:
  * its instance is replaced by the copy loaded from its frame (as at K before, and as a
    replica restored from K holds it), unless waiters hold the live instance (`keep`); the
    replacement happens before any code runs on the object again, so no code can tell when;
  * its size is measured, but the measure is not applied at once: `take` applies the sizes
    measured by the previous capture at the next checkpoint (`sizes_next`). Applying them
    whenever a replica happens to save the object would let quotas differ between replicas.
    A replica restored from K measures the same objects (the checkpoint lists them) on load.
    So the size of a standard-class object lags by one checkpoint; uploaded classes are
    still saved and measured at K (their state may not be savable at all, and dropping an
    object must happen at the same index everywhere). After a format-7 checkpoint the sizes
    are not applied at its entry but SIZES_PER_ENTRY at the start of each entry after it
    (`take_sizes`, `apply_some`; at creation churn ~20,000 first sizes cost ~50 ms in one
    entry), and its blob lists them for a restored replica to apply at the same entries.
Only classes with reserved names (the standard ones, which only the replicas register) are
deferred: their state holds plain values only, so saving it does not fail. Should it fail all
the same (memory), nothing may be dropped, since each replica would drop at another moment:
the object stays as it is, marked changed for the next checkpoint to try again, and this
checkpoint has no blob (`PendingBlob.error`): no snapshot is taken from it. The replicas'
states stay the same; only the log is not compacted until a checkpoint succeeds.

Interface: `Deferred(state, runner, lifecycle, save, measure, captured)`, owned by
`Checkpoints`, which opens a `Capture(index, head, parts, slots, keep)` at each checkpoint with
deferred objects (at a format-7 one a `ListedCapture`, listed.py); `Deferred` saves its
objects (`seal`, `capture_some`, `finish`), calls `captured(capture, blob or None)` when it
ends, applies the sizes it measured at the next checkpoint (`apply_sizes`) or after it
(`take_sizes`), and keeps the table of frames as objects are made and removed (`made`,
`removed`: the runner's hooks).
"""
from __future__ import annotations

import logging
import pickle
from typing import Any, Callable

from . import stack

from .sched import SAVING


log = logging.getLogger(__name__)


class Slot:
    """A deferred object's frame in a checkpoint's list of frames: filled when it is saved."""

    __slots__ = ("frame",)

    def __init__(self) -> None:
        self.frame: bytes | None = None


class PendingBlob:
    """A checkpoint's blob that may not be assembled yet (`Kernel.checkpoint_result`):
    `done` once it is; `result()` assembles it first if need be (on the kernel's thread)."""

    __slots__ = ("index", "_finish", "blob", "error")

    def __init__(self, index: int, finish: Callable[[], None]) -> None:
        self.index = index
        self._finish = finish
        self.blob: bytes | None = None
        self.error = ""               # why it has no blob (an object could not be saved)

    @property
    def done(self) -> bool:
        return self.blob is not None

    def result(self) -> bytes:
        if self.blob is None and not self.error:
            self._finish()
        if self.blob is None:
            raise CheckpointUnavailable(self.error or f"checkpoint {self.index} not assembled")
        return self.blob


class CheckpointUnavailable(RuntimeError):
    """A checkpoint whose objects could not all be saved has no blob (module docstring)."""


class Capture:
    """The objects of the checkpoint at `index` still to save."""

    def __init__(self, index: int, head: bytes, parts: list[Any], slots: dict[str, Slot],
                 keep: set[str], calls: list[Any] | None = None) -> None:
        self.index = index
        self.head = head              # registry and state (format 5: and the calls), at K
        # format 6: the waiting calls at K, written after the head, one pickle each: a
        # PendingCall.saved() tuple (pickled when joined) or its pickle (made at K)
        self.calls: list[Any] = calls or []
        self.parts = parts            # the frames at K: bytes, or a Slot of a deferred object
        self.slots = slots            # name -> Slot, of the objects not saved yet (name order)
        self.todo = list(slots)       # the idle slices' order (reversed: pop()), done ones too
        self.todo.reverse()
        self.keep = keep              # objects whose live instance waiters hold
        # name -> (its record, its size at K), in name order (None until it is saved)
        self.sizes: dict[str, tuple[Any, int] | None] = dict.fromkeys(slots)
        self.failed: dict[str, str] = {}  # name -> why it could not be saved
        self.chunks: list[bytes] = []     # calls[:pickled], then parts[:joined], a slice at a time
        self.pickled = 0
        self.joined = 0

    listed = False                        # format 7 (listed.ListedCapture)

    def take(self, name: str, objects: dict[str, Any]) -> Slot | None:
        """The slot `name` is saved into, and no longer to be saved; None if it is not."""
        return self.slots.pop(name, None)

    def is_unsaved(self, name: str) -> bool:
        """Whether `name` is one of the objects still to save."""
        return name in self.slots

    def any_unsaved(self) -> bool:
        return bool(self.slots)

    def next_todo(self) -> str | None:
        """The next object an idle slice saves (any order: the bytes do not depend on it);
        None once every object is saved."""
        todo, slots = self.todo, self.slots
        while todo:
            name = todo.pop()
            if name in slots:
                return name
        return None

    def all_unsaved(self) -> list[str]:
        return list(self.slots)

    def forget_size(self, name: str) -> None:
        """The size measured for `name` is not to be applied (measured again, or removed)."""
        if name in self.sizes:
            self.sizes[name] = None

    def made(self, name: str) -> None:
        """An object `name` was made after K: not one of this capture's (none can be: an
        object of K removed since was saved first)."""

    def gone(self, name: str) -> None:
        """An object named `name` was removed."""

    def close(self) -> None:
        """Every object is saved (or failed): what is left to do before `assemble`."""

    def settle(self) -> None:
        """The capture ended (listed.ListedCapture)."""

    def join_some(self, n: int) -> bool:
        """Pickle up to n / CALL_WEIGHT more waiting calls, or else join up to `n` more frames
        (every slot filled), into a chunk of the blob; whether some are left. One bytes.join
        of a million small frames holds the GIL for ~0.25 s, and a pickle of 10^5 waiting
        calls ~0.35 s; chunks of a few MB are joined at the end at the speed of a memory
        copy."""
        calls, c = self.calls, self.pickled
        if c < len(calls):
            d = min(len(calls), c + max(1, n // CALL_WEIGHT))
            self.chunks.append(b"".join([_call_bytes(x) for x in calls[c:d]]))
            self.pickled = d
            return True
        parts, i = self.parts, self.joined
        j = min(len(parts), i + n)
        frames: list[Any] = [p.frame if type(p) is Slot else p for p in parts[i:j]]
        self.chunks.append(b"".join(frames))
        self.joined = j
        return j < len(parts)

    def assemble(self) -> bytes | None:
        """The blob, once every slot is filled; None if an object could not be saved."""
        assert not self.slots, "a checkpoint's blob assembled with objects unsaved"
        if self.failed:
            return None
        calls = [_call_bytes(x) for x in self.calls[self.pickled:]]
        rest: list[Any] = [p.frame if type(p) is Slot else p
                           for p in self.parts[self.joined:]]
        return b"".join([self.head, *self.chunks, *calls, *rest])   # None (unsaved) fails here


#: What pickling a waiting call costs, in frames joined (~3 us against ~0.2 us).
CALL_WEIGHT = 16


def _call_bytes(call: Any) -> bytes:
    """A waiting call as format 6 writes it: the pickle of its PendingCall.saved() tuple,
    whose parts never change (ints, floats, strings, the command's log bytes), so that it is
    the same bytes whenever it is made; a call whose command has no log bytes was pickled at
    the checkpoint's index (Checkpoints._dump)."""
    return call if type(call) is bytes else pickle.dumps(call, protocol=5)


def save_one(cap: Capture, name: str, objects: dict[str, Any], frames: dict[str, Any],
             save: Callable[[Any], tuple[bytes, Any]], measure: Callable[[Any], int]) -> bool:
    """Save object `name` for `cap` (see the module docstring), if it is still to be saved.
    `save(instance)` pickles it (as a checkpoint does) and loads the copy back; `measure`
    measures a state without applying anything. Returns False if it could not be saved
    (`cap.failed` says why; the caller marks it for the next checkpoint)."""
    slot = cap.take(name, objects)
    if slot is None:
        return True
    rec = objects[name]
    rec.steps = 0                        # as at K: no code ran on it since (seal)
    # whether its frame goes to the table: its slot is there (formats 5-6), or the table
    # holds K's names (listed: format 7)
    in_table = cap.listed or frames.get(name) is slot
    saving = SAVING.set(True)            # semaphores and sessions as a checkpoint writes them
    try:
        data, copy = save(rec.instance)  # (under stack.relative(), which the caller enters)
    except BaseException as e:           # memory, a bug: nothing is dropped (module docstring)
        cap.failed[name] = f"{type(e).__name__}: {e}"[:300]
        if in_table:
            frames[name] = None          # not saved: the next checkpoint saves it
        return False
    finally:
        SAVING.reset(saving)
    if name not in cap.keep:
        rec.instance = copy
    cap.sizes[name] = (rec, measure(rec.instance))
    frame = pickle.dumps((name, rec.cls.name, rec.cls.version, data, rec.owner, rec.size),
                         protocol=5)
    slot.frame = frame
    if in_table:
        frames[name] = frame
    return True


#: Frames an idle slice joins once every object is saved (~2-4 ms: ~0.2 us a frame).
JOIN_SLICE = 16_384


class Deferred:
    """The deferred captures of a kernel's checkpoints (module docstring): the open one, and
    the sizes the last one measured, which the next checkpoint applies."""

    def __init__(self, state: Any, runner: Any, lifecycle: Any,
                 save: Callable[[Any], tuple[bytes, Any]], measure: Callable[[Any], int],
                 captured: Callable[[Capture, bytes | None], None]) -> None:
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
        """Save every object the open capture has left, and assemble its blob."""
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
            blob = cap.assemble()
        finally:
            cap.settle()
        self.sizes_next, self.sizes_at = cap.sizes, cap.index
        self._captured(cap, blob)

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

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
    So the size of a standard-class object lags by one checkpoint (an object made by a
    command with `measured`, as the gateway proposes them, is measured as it is made, so a
    capture that only made it does not change its size again); uploaded classes are
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
deferred objects (at a format-7 one a `ListedCapture`, listed.py); `Deferred` (deferred.py)
saves its objects (`seal`, `capture_some`, `finish`), calls `captured(capture, parts or None)`
when it ends (`PendingBlob.take` joins the parts, or leaves large ones to its host's thread), applies the sizes it measured at the next checkpoint (`apply_sizes`) or after it
(`take_sizes`), and keeps the table of frames as objects are made and removed (`made`,
`removed`: the runner's hooks).
"""
from __future__ import annotations

import logging
import pickle
from typing import Any, Callable

from .sched import SAVING
from .untracked import untrack

log = logging.getLogger(__name__)


class Slot:
    """A deferred object's frame in a checkpoint's list of frames: filled when it is saved."""

    __slots__ = ("frame",)

    def __init__(self) -> None:
        self.frame: bytes | None = None


#: A blob of at least this many bytes is not joined by the capture (`PendingBlob.take`): its
#: host joins it on a thread of its own (replication's `Gen.join_apart`). At 10^6 objects the
#: blob is ~105 MB, and copying it into one bytes object took 120-190 ms here, which every
#: call waited for when the apply thread did it; bytes.join of exact bytes over 1 MiB
#: releases the GIL while it copies, so the apply thread goes on meanwhile.
JOIN_APART_FROM = 8 << 20


def join(parts: list[bytes]) -> bytes:
    """A blob's parts joined (a seam: the tests make it fail)."""
    return b"".join(parts)


class PendingBlob:
    """A checkpoint's blob that may not be assembled yet (`Kernel.checkpoint_result`):
    `done` once it is; `result()` assembles it first if need be (on the kernel's thread).
    A large blob's parts wait for `join_parts` (`joinable`), which its host calls on a
    thread of its own, or `result()` at the latest."""

    __slots__ = ("index", "_finish", "blob", "error", "parts")

    def __init__(self, index: int, finish: Callable[[], None]) -> None:
        self.index = index
        self._finish = finish
        self.blob: bytes | None = None
        self.error = ""               # why it has no blob (an object could not be saved)
        self.parts: list[bytes] | None = None    # handed over by `take`, not joined yet

    @property
    def done(self) -> bool:
        return self.blob is not None

    @property
    def joinable(self) -> bool:
        """Whether the capture ended and handed its parts over to be joined (`join_parts`)."""
        return self.parts is not None and self.blob is None and not self.error

    def take(self, parts: list[Any] | None, error: str = "") -> None:
        """The capture ended: the blob's parts in order, or None and why it has none. A blob
        under JOIN_APART_FROM is joined at once; a larger one waits for `join_parts` (`done`
        is False until then: no snapshot is taken from it). The bytes are the same."""
        if parts is None:
            self.error = error
            return
        if not all(type(p) is bytes for p in parts) or sum(map(len, parts)) < JOIN_APART_FROM:
            self.blob = join(parts)   # a part left None (an object unsaved: a bug) fails here
            return
        self.parts = parts

    def join_parts(self) -> None:
        """Join the parts `take` handed over (any thread: it only reads them; two joins at
        once give the same bytes). A join that fails (memory) leaves this checkpoint without
        a blob, as an object that could not be saved does."""
        parts = self.parts
        if parts is None or self.blob is not None:
            return
        try:
            blob = join(parts)
        except BaseException as e:
            if self.blob is None:
                self.error = (f"checkpoint {self.index} has no blob: joining its parts failed "
                              f"({e!r})")
                log.error("%s", self.error)
            self.parts = None
            return
        self.blob = blob
        self.parts = None

    def result(self) -> bytes:
        if self.blob is None and not self.error:
            if self.parts is None:
                self._finish()
            self.join_parts()
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

    def assemble(self) -> list[Any] | None:
        """The blob's parts in order (PendingBlob.take joins them), once every slot is filled;
        None if an object could not be saved."""
        assert not self.slots, "a checkpoint's blob assembled with objects unsaved"
        if self.failed:
            return None
        calls = [_call_bytes(x) for x in self.calls[self.pickled:]]
        rest: list[Any] = [p.frame if type(p) is Slot else p
                           for p in self.parts[self.joined:]]
        return [self.head, *self.chunks, *calls, *rest]     # None (unsaved) fails in take


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
        untrack(copy)                    # long-lived: no collector pass need walk it
    cap.sizes[name] = entry = (rec, measure(rec.instance))
    untrack(entry)
    frame = pickle.dumps((name, rec.cls.name, rec.cls.version, data, rec.owner, rec.size),
                         protocol=5)
    slot.frame = frame
    if in_table:
        frames[name] = frame
    return True

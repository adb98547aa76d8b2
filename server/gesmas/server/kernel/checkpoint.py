"""Checkpoints: the kernel's state as bytes, and back (DESIGN §5); and the state digest.

Taking one (`Checkpoints.take`): interrupt the waiters that cannot be left in place so that
they unwind, pickle the state with every waiter written as a pending call, re-run the
interrupted calls (DESIGN §5). Waiters of the standard classes stay where they are
(`Waiters.kept_objects`): unwinding and re-running 10^4 of them held the apply thread for ~0.5 s; a
restored replica re-runs them, which puts it in the same state. The result is the state that
unwinding and re-running every waiter in block order gives (what gesmas did before, and what
a replica of that version still does), block numbers included.
A checkpoint is the registry's sources (classes are re-made from their source, never
pickled), a header with the state, the waiting calls, and one *frame* per object (its state
pickled on its own, so that one object that cannot be saved is dropped without failing the
others); blob.py has the layout of each format and reads them back. Format 6 (the leader's
checkpoints, `Checkpoint.calls_apart`) writes each waiting call after the header as a pickle
of its own, made by the capture (capture.py): a waiting call never changes, so it is the same
bytes whenever it is made, and the entry pays for a list of the calls, not for their pickle.
Format 7 (`Checkpoint.listed_after`, the leader's since) also hands the capture the set of
changed objects as it is, and the table of frames itself (listed.ListedCapture): the entry
saves only the uploaded classes' changed objects, which may have to be dropped at K, and does
nothing per standard-class object; the deferred objects are listed after the frames.
Format 8 (`Checkpoint.touched_in_parts`, the leader's since) writes each session's objects
(`Session.touched`) as parts of TOUCHED_CHUNK names, each full part pickled once and kept, so
the header costs the sessions' new objects, not all they ever called.
The pickled state is a plain dict (`saved_state`), never a part of the kernel.

Incremental. A checkpoint pickles only the objects run on, made or removed since the last
checkpoint taken or loaded (`Runner.changed`); every other object's frame is the one the
last checkpoint wrote or loaded (`State.frames`), and its instance is the copy loaded back from
it then. So a checkpoint costs the objects that changed, plus joining the frames (one copy in
C), not a pickle, a load and a measure of every object (2.3 s at 10^5 Counters before). The
bytes are those a checkpoint of everything would write: an unchanged object's instance is
exactly what loading its frame gives, on a live replica and on one restored from that frame
alike. (Pickling such a copy again could give other bytes: a set rebuilt by loading can
iterate in another order.) The changed objects saved at the entry are saved in name order,
so objects dropped or measured over the limit on the way are recorded in the same order
everywhere (`Runner.changed_uploaded` names those of uploaded classes).

Interface: `Checkpoints(state, config, registry, budget, runner, lifecycle, restart)`; the
kernel hands it `Checkpoint` commands (`take`), a fresh kernel's `load(blob)` restores one,
and `digest` hashes the state. It keeps the last checkpoint (`index`, `blob`). `restart(p,
session)` starts a pending call again (Kernel._start, with the call's saved deadlines), for
its `waiters` part (waiters.py: which waiters stay in place, unwinding the others, re-running
calls); the runner runs them, and `lifecycle` drops and measures objects.
"""
from __future__ import annotations

import io
import pickle
from typing import Any, Callable

from . import codec, stack
from .auth import AuthState
from .blob import FORMAT, pickle_state, read, unpickle_state
from .budget import Budget
from .digests import part_bytes, state_digest
from .capture import Capture, PendingBlob, Slot
from .deferred import Deferred
from .lifecycle import Lifecycle
from .listed import ListedCapture
from .measure import state_size
from .records import (TOUCHED_IN_PARTS, Config, ObjectRecord, PendingCall, Session, State,
                      unshared_pickle)
from .registry import Registry, safe_str, type_name
from .runner import Runner
from .sched import SAVING
from .waiters import Waiters

class Checkpoints:
    def __init__(self, state: State, config: Config, registry: Registry, budget: Budget,
                 runner: Runner, lifecycle: Lifecycle,
                 restart: Callable[[PendingCall, Session], None]) -> None:
        self.state = state
        self.config = config
        self.registry = registry
        self.budget = budget
        self.runner = runner
        self.lifecycle = lifecycle
        self.index: int | None = None     # the log index of the last checkpoint taken or loaded
        self.result: bytes | PendingBlob | None = None   # ... and its bytes (`blob`)
        self.format: int | None = None    # ... and the format they are in (4, 5 or 6 written)
        self.defer = True                 # defer (capture.py) when the Checkpoint asks to
        self.deferred = Deferred(state, runner, lifecycle, self._save_copy, self._measure,
                                 self._captured)
        self.waiters = Waiters(state, config, runner, restart)
        runner.seal = self.deferred.seal
        runner.made, runner.removed = self.deferred.made, self.deferred.removed
        runner.measured = self.deferred.measured

    @property
    def blob(self) -> bytes | None:
        """The last checkpoint's bytes, assembled first if its capture is still open."""
        r = self.result
        return r.result() if isinstance(r, PendingBlob) else r

    @blob.setter
    def blob(self, blob: bytes | None) -> None:
        self.finish()
        self.result = blob

    # -- deferred capture (capture.py) -----------------------------------------------------------

    @property
    def capture(self) -> Capture | None:
        return self.deferred.capture

    def capture_some(self, limit: int) -> bool:
        return self.deferred.capture_some(limit)

    def finish(self) -> None:
        self.deferred.finish()

    def _save_copy(self, instance: Any) -> tuple[bytes, Any]:
        """An object's state pickled as a checkpoint writes it, and the copy loaded back."""
        self.budget.steps = 0
        data = pickle_state(self.registry, instance)
        self.budget.steps = 0
        return data, unpickle_state(self.registry, data)

    def _measure(self, instance: Any) -> int:
        self.budget.steps = 0
        return state_size(instance, self.config.max_object_bytes)

    def _captured(self, cap: Capture, parts: list[Any] | None) -> None:
        """A capture ended: its checkpoint's blob in parts (None if an object could not be
        saved), joined by the PendingBlob."""
        r = self.result
        if isinstance(r, PendingBlob) and r.index == cap.index:
            r.take(parts, "" if parts is not None else (
                f"checkpoint {cap.index} has no blob: objects could not be saved "
                f"({'; '.join(f'{n!r}: {w}' for n, w in sorted(cap.failed.items()))})"))

    # -- the saved form ------------------------------------------------------------------------

    def saved_state(self, per_object: bool = True) -> dict[str, Any]:
        """The state but the objects. `per_object`: with each object's owner and size (a
        checkpoint writes those in the objects' frames instead)."""
        st = self.state
        state = {"format": FORMAT, "index": st.index, "now": st.now,
                 "order": self.runner.order, "sessions": st.sessions, "dropped": st.dropped,
                 "over_limit": st.over_limit, "auth": st.auth.dump()}
        if st.hooked_touched:        # (absent before: the same bytes as an older replica's)
            state["hooked_touched"] = True
        if per_object:
            state["owners"] = {n: r.owner for n, r in st.objects.items() if r.owner}
            state["sizes"] = {n: r.size for n, r in st.objects.items() if r.size}
        return state

    def _save_objects(self, keep: set[str], defer: bool,
                      listed: bool = False) -> dict[str, Slot] | set[str]:
        """Save each object changed since the last checkpoint (module docstring): its state
        pickled on its own and loaded back once, as a restore would, its frame kept in
        `State.frames`. An object whose state cannot be saved or loaded (a generator, a
        lambda, a failing __hash__...) is dropped, the same on every replica: the checkpoint
        always succeeds and the log stays bounded. Objects over max_object_bytes are marked
        (see _start). Objects of the standard classes are left to the capture (capture.py):
        returns their slots.

        The loaded copy replaces the live instance, except for objects whose waiters stay in
        place (`keep`: standard classes, whose frames hold the live one). A replica restored
        from this checkpoint holds exactly that copy, and a copy is not always the same as
        the original: a set rebuilt by unpickling has a fresh table, so after discards its
        iteration order can differ from the live set's ([2, 9] live, [9, 2] restored), and
        values equal but apart in one become one shared value in the other. From here on
        every replica iterates the copy.

        `listed` (format 7): only the objects of uploaded classes are saved here, in name
        order; the set of changed objects, less those, is returned as it is for the capture
        to find its objects in (listed.ListedCapture), and nothing is done per object of
        a standard class."""
        with stack.relative():
            return self._save_objects_here(keep, defer, listed)

    def _save_objects_here(self, keep: set[str], defer: bool,
                           listed: bool) -> dict[str, Slot] | set[str]:
        runner = self.runner
        st, frames, changed = self.state, self.state.frames, runner.changed
        deferred: dict[str, Slot] = {}
        reserved = self.config.reserved_classes if defer else frozenset()
        for name in sorted(runner.changed_uploaded if listed else changed):
            rec = st.objects.get(name)
            if rec is None:
                continue
            if rec.cls.name in reserved:
                if listed:
                    continue                     # left to the capture
                rec.steps = 0
                deferred[name] = frames[name] = Slot()
                continue
            if listed:
                changed.discard(name)
            self.budget.steps = 0
            try:
                data = pickle_state(self.registry, rec.instance)
                self.budget.steps = 0
                copy = unpickle_state(self.registry, data)
            except BaseException as e:
                self.lifecycle.drop(name, f"its state cannot be saved in a checkpoint "
                                          f"({type_name(e)}: {safe_str(e, 200)})")
                continue
            if name not in keep:
                rec.instance = copy
            rec.steps = 0
            self.lifecycle.measure(rec)
            frames[name] = pickle.dumps((name, rec.cls.name, rec.cls.version, data, rec.owner,
                                         rec.size), protocol=5)
        runner.changed_uploaded = set()
        if listed:
            runner.changed = set()
            return changed
        changed.clear()
        return deferred

    def _dump(self, pending: list[tuple[Any, ...]], deferred: dict[str, Slot] | set[str],
              keep: set[str], defer: bool, apart: bool, touched_in_parts: bool = False) -> None:
        """Write the checkpoint of this index: at once, or through a capture if objects are
        deferred or the calls written apart. `pending`: PendingCall.saved() tuples, in the
        order a restore re-runs them."""
        buf = io.BytesIO()
        pickle.dump(self.registry.dump(), buf, protocol=5)
        frames = self.state.frames
        state = self.saved_state(per_object=False)
        if keep:        # whose waiters stayed in place: a restore re-runs them uncharged
            state["kept"] = sorted(keep)
        calls: list[Any] = []           # (`deferred` is in name order: _save_objects made it so)
        listed = type(deferred) is set
        if listed:      # format 7: as 6, and the deferred objects listed after the frames
            # (format 8: and the sessions' objects in parts, Session.touched_parts)
            # without a memo: whether two equal strings of the sessions' results are one
            # object depends on the replica's history (an error type made live, or loaded)
            token = TOUCHED_IN_PARTS.set(touched_in_parts)
            try:
                state["format"] = 8 if touched_in_parts else 7
                buf.write(unshared_pickle((state, len(pending), len(frames))))
            finally:
                TOUCHED_IN_PARTS.reset(token)
        elif apart:     # format 6: the calls pickled by the capture, after this header
            state["format"] = 6
            pickle.dump((state, len(pending), len(frames), list(deferred)), buf, protocol=5)
        if apart:
            # a saved tuple is pickled whenever the capture comes to it: the same bytes,
            # unless its command is a decoded one (no log bytes: a test's, an old format's),
            # whose lists a method could change in the meantime
            calls = [p if type(p[1]) is bytes else pickle.dumps(p, protocol=5)
                     for p in pending]
        elif deferred or defer:               # format 5: the deferred objects listed
            state["format"] = 5
            pickle.dump((state, pending, len(frames), list(deferred)), buf, protocol=5)
        else:                                 # as format 4 wrote it, byte for byte
            state["format"] = 4
            pickle.dump((state, pending, len(frames)), buf, protocol=5)
        self.format = state["format"]
        if not deferred and not defer and not apart:   # as format 4 did: joined at the entry
            parts: list[Any] = [buf.getvalue(), *frames.values()]
            self.result = b"".join(parts)        # None (an object left unsaved) fails here
            return
        # deferred (even with no object to save): the frames are joined by the idle slices
        index = self.state.index
        if listed:
            assert isinstance(deferred, set)
            cap = ListedCapture(index, buf.getvalue(), frames, deferred, keep, calls)
            cap.pending = self.deferred.applying     # not changed after this entry
            self.deferred.capture = cap
        else:
            assert isinstance(deferred, dict)
            self.deferred.capture = Capture(index, buf.getvalue(), list(frames.values()),
                                            dict(deferred), keep, calls)
        pending_blob = PendingBlob(index, self._blob_of_capture)
        self.result = pending_blob

    def _blob_of_capture(self) -> None:
        self.finish()

    # -- restoring -----------------------------------------------------------------------------

    def load(self, blob: bytes) -> None:
        """Put the state of a fresh kernel in the state right after the checkpoint that made
        `blob` (Kernel.restore)."""
        st, registry = self.state, self.registry
        Budget.current = self.budget
        got = read(blob, registry)
        state = got.state
        st.index, st.now, self.runner.order = state["index"], state["now"], state["order"]
        st.sessions = state["sessions"]
        st.dropped, st.over_limit = state.get("dropped", {}), state.get("over_limit", {})
        st.hooked_touched = state.get("hooked_touched", False)
        st.auth = AuthState.load(state.get("auth"))
        if "auth" not in state:             # before auth: every source was anonymous
            st.auth.source_used = {"": sum(map(len, registry.sources))} if registry.sources \
                else {}
        for s in st.sessions.values():
            st.usage.add(s.user, "sessions", 1)
        with stack.relative():          # the same height above the pickles as _save_objects
            self._load_objects(got.objects, got.owners, got.sizes, blob)
        self.index, self.result, self.format = st.index, blob, state["format"]
        # the sizes a live replica measured when it saved these objects (capture.py): the
        # same measure of the same states, applied by the next checkpoint likewise
        limit = self.config.max_object_bytes
        for name in got.deferred:                                     # in name order
            rec = st.objects.get(name)
            if rec is not None:
                self.budget.steps = 0
                self.deferred.sizes_next[name] = (rec, state_size(rec.instance, limit))
        self.deferred.sizes_at = st.index
        self.deferred.restore_sizes(got.pending_sizes)
        self.runner.out = []
        self.waiters.rerun(got.pending, frozenset(state.get("kept", ())))

    def _load_objects(self, objects: list[tuple[Any, ...]], owners: dict[str, str],
                      sizes: dict[str, int], blob: bytes) -> None:
        """`objects`: (name, class, version, state pickle[, where its frame is in `blob`]).
        Format 3 has no frames: each is made as format 4 would have written it (the same
        bytes). Format 1 pickled instances, not bytes: those objects are saved by the next
        checkpoint. The table of frames is made at the end, its pages kept joined
        (FrameTable.load)."""
        st, registry = self.state, self.registry
        frames: list[tuple[str, Any]] = []
        for name, cname, version, data, *frame in objects:
            cv = registry.get(cname, version)
            self.budget.steps = 0
            try:
                if cv is None:
                    raise LookupError(f"class {cname} version {version} did not load")
                instance = unpickle_state(registry, data) if type(data) is bytes else data
                owner, size = owners.get(name, ""), sizes.get(name, 0)
                rec = st.objects[name] = ObjectRecord(name, cv, instance, owner)
                if not frame and type(data) is bytes:    # format 3: the frame 4 would have
                    frame = [pickle.dumps((name, cname, version, data, owner, size),
                                          protocol=5)]
                frames.append((name, frame[0] if frame else None))
                if not frame:                            # format 1: saved at the next one
                    self.runner.changed.add(name)
                    self.runner.changed_uploaded.add(name)
                rec.size = size
                st.usage.add(owner, "objects", 1)
                st.usage.add(owner, "state_bytes", size)
            except BaseException as e:   # loaded at the checkpoint, so only after an upgrade
                self.lifecycle.drop(name, f"its state cannot be restored ({type_name(e)}: "
                                          f"{safe_str(e, 200)})")
        st.frames.load([f for f in frames if f[0] in st.objects], blob)

    # -- the state digest ----------------------------------------------------------------------

    def digest(self, volatile: bool = True, parts: dict[str, str] | None = None,
               every_remembered: bool = False) -> str:
        """A hash of the whole state, waiters included: equal on replicas that applied the
        same log (without `volatile`, the log index and kernel time are left out). Pickled
        without a memo where it can be, so that which objects happen to be shared (an
        interned string, say) does not change the bytes; an object with reference cycles is
        pickled with a memo instead. `parts`: filled with a short hash of each part.
        A part that cannot be pickled (a lambda or a generator an object holds until the next
        checkpoint drops it) is hashed by its content, the unpicklable values by their kind.
        `every_remembered`: the sessions' remembered objects hashed as the digest of an
        earlier gesmas did (digests.state_digest)."""
        with stack.relative():
            return state_digest(self, volatile, parts, pickle_state, every_remembered)

    def _part_bytes(self, part: Any, limit: int) -> bytes:
        """What the digest hashes of one part (digests.part_bytes)."""
        return part_bytes(part, limit, self.registry, pickle_state)

    # -- taking a checkpoint -------------------------------------------------------------------

    def take(self, cmd: codec.Checkpoint) -> None:
        st, runner = self.state, self.runner
        self.finish()                        # the last checkpoint's capture, if still open
        if cmd.hooked_touched and not st.hooked_touched:
            st.hooked_touched = True         # once: sessions keep only hooked objects
            for s in st.sessions.values():
                s.forget_unhooked(st.objects, bool(cmd.keep_gone))
        listed = bool(cmd.defer and cmd.calls_apart and cmd.listed_after) and self.defer
        if listed:
            self.deferred.take_sizes()       # what it measured: applied after this entry
        else:
            self.deferred.apply_some(None)   # (after a format-7 checkpoint)
            self.deferred.apply_sizes()      # what it measured (capture.py)
        blocked = runner.blocked()
        keep = self.waiters.kept_objects()
        unwind = [] if len(keep) == len(runner.blocked_methods) else \
            [r for r in blocked if r.obj not in keep]
        for req in unwind:                   # detach first: no handler can wake another waiter
            runner.detach(req)
        runner.pending = []
        for req in unwind:
            self.waiters.interrupt(req)
        if unwind:
            runner.prune_deadlines()
        assert not runner.ready and runner.waiting == len(blocked) - len(unwind)
        interrupted = {p.index: p for p in runner.pending}
        runner.pending = []
        # Every waiting call in block order, as PendingCall.saved() writes it: a restore
        # re-runs them in this order, and so does the loop below for the interrupted ones.
        pending = [r.saved_form() for r in blocked] if not unwind else \
            [r.saved_form() if r.obj in keep else interrupted[r.index].saved()
             for r in blocked if r.obj in keep or r.index in interrupted]
        saving = SAVING.set(True)
        try:
            # drops what cannot be saved: never fails
            defer = self.defer and bool(cmd.defer)
            deferred = self._save_objects(keep, defer, listed)
            self._dump(pending, deferred, keep, bool(cmd.defer), bool(cmd.calls_apart),
                       listed and bool(cmd.touched_in_parts))
            self.index = st.index
        finally:
            SAVING.reset(saving)
        # A kept waiter is left as it is, but counted as re-run: a restore re-runs it, and
        # its wait takes the next block number there (`Waiters.rerun`). With calls re-run here, it
        # is renumbered, so that it stays behind them in the same order as there.
        renumber = bool(interrupted)
        if not renumber and all(name in st.objects for name in keep):
            runner.order += len(blocked) - len(unwind)     # nothing else to do for a waiter
            runner.complete(cmd.tag, st.index)
            return
        for req in blocked:
            if req.obj in keep:
                if req.obj not in st.objects:    # dropped just now: as its re-run would fail
                    self.waiters.abandon(req)
                elif renumber:                   # as if re-run: it would wait again at once
                    runner.renumber(req)
                else:
                    runner.order += 1
            elif req.index in interrupted:
                self.waiters.rerun([interrupted[req.index]])
        if renumber and keep:
            runner.reorder_deadlines()       # the kept waiters' numbers changed
        runner.complete(cmd.tag, st.index)

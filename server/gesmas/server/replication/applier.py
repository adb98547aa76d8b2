"""The apply side of a Replica: the state machine, its checkpoints and the commands applied
since them, and the entries held back behind one that ran away (the second half of the
runaway defence; watchdog.py is the first).

Theory of operation
-------------------
Everything here runs on the Replica's apply thread (replica.py; pysyncobj's tick thread only
queues the committed entries for it), ``load`` included. ``apply(index, data)`` gets every
committed gesmas entry, in log order.

Generations. The applier keeps the state machine's two newest checkpoints (``Gen``: index
K, blob, and the entries applied after K up to the next checkpoint), so that it can rebuild
its state without an entry applied since the older one. A snapshot holds the newest only.

Holding. The applier holds entry X back (applies neither X nor any later entry, keeps them
in memory and returns at once, so that Raft goes on voting and beating) when
  * the runaway record names X (the watchdog killed this replica while it applied X), or
  * a committed Abort(X) follows in the log (a replica replaying its log after the cluster
    aborted X: it must not run X again).
A replica that holds X because of its record proposes Abort(X) (``due_proposal``: at once,
then every PROPOSE_EVERY seconds until the hold ends), through the leader like any command.

Abort(X, crc, limit) is a log entry of its own (first byte 0xFF, which no kernel command
has; the state machine never sees it). Applied at index A, on every replica alike:
  1. no-op if X was aborted already, if X is not an entry of this layer before A, or if the
     CRC is not that of entry X (a stale record);
  2. X stands (no-op) if two checkpoints or more were made from X on before A (X itself may
     be one): a replica that applied X may no longer be able to undo it. A replica that holds X then applies it, without the
     runaway limit (the others applied it: this replica is merely slower than they are);
  3. otherwise X is aborted: its caller gets RESOURCE_EXHAUSTED (``sm.abort``). A replica
     holding X takes X as aborted and applies what it held after X; a replica that applied X
     rolls back: it restores its newest checkpoint before X, re-applies the entries since
     (X as aborted; the completions go to whoever still waits for them) and goes on. One
     without such a checkpoint (it loaded a snapshot taken after X) stops with a fatal error,
     and its operator re-seeds it (README "A call that runs away").
Rule 2 counts what every replica knows: the checkpoints the state machine made (the last
two; a snapshot carries them) and the Checkpoint commands among the entries held (a
Checkpoint command always makes a checkpoint, unless the kernel fails, a bug). With at most
one checkpoint from X on, a replica that applied X kept the generation before X, unless it
loaded a snapshot since.

A snapshot is never taken while entries are held (overrides.py skips log compaction then),
so it never claims them. Its commands keep an aborted entry and list it as aborted: loading
the snapshot takes that entry as aborted again (the state records the caller's error).
"""
from __future__ import annotations

import logging
import struct
import threading
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from .watchdog import Record

log = logging.getLogger(__name__)

ABORT_PREFIX = b"\xffgesmas-abort\x00"
_ABORT = struct.Struct("<QId")          # index, CRC-32 of its bytes, runaway limit (s)
PROPOSE_EVERY = 0.5                     # seconds between two proposals of one Abort
MAX_ABORTED = 1000                      # aborted indices remembered (duplicates are no-ops)

Entry = Tuple[int, bytes]


def encode_abort(index: int, crc: int, limit: float) -> bytes:
    return ABORT_PREFIX + _ABORT.pack(index, crc, limit)


def decode_abort(data: bytes) -> Optional[Tuple[int, int, float]]:
    if len(data) != len(ABORT_PREFIX) + _ABORT.size or not data.startswith(ABORT_PREFIX):
        return None
    index, crc, limit = _ABORT.unpack_from(data, len(ABORT_PREFIX))
    return index, crc, limit


def abort_message(index: int, limit: float) -> str:
    return (f"log entry {index} ran native code past the runaway limit ({limit:g} s of CPU) "
            "and was aborted by the cluster")


class ApplyFailed(Exception):
    """This replica cannot go on applying the log; the Replica stops (fail-stop)."""

    def __init__(self, what: str, cause: BaseException) -> None:
        super().__init__(what)
        self.what, self.cause = what, cause


@dataclass
class Gen:
    """A checkpoint (index 0 and no blob: the empty state) and the entries applied after it.
    `blob` is bytes, or, while the state machine still captures it (or a thread joins its
    parts), a handle with `done` and `result()` (kernel/capture.py's PendingBlob; `result()`
    only on the apply thread)."""
    index: int
    blob: Any
    entries: List[Entry] = field(default_factory=list)
    joiner: Optional[threading.Thread] = None   # joins a large blob's parts (`join_apart`)

    def blob_bytes(self) -> Optional[bytes]:
        b = self.blob
        if b is None or isinstance(b, bytes):
            return b
        if self.joiner is not None:
            self.joiner.join()
        return b.result()

    def join_apart(self) -> None:
        """Join the blob's parts on a thread of its own once its capture handed them over
        (kernel/capture.py, JOIN_APART_FROM): bytes.join releases the GIL while it copies
        ~100 MB at 10^6 objects, so the apply thread goes on meanwhile."""
        b = self.blob
        if self.joiner is None and getattr(b, "joinable", False):
            self.joiner = threading.Thread(target=b.join_parts, daemon=True,
                                           name=f"gesmas-blob-{self.index}")
            self.joiner.start()

    def capturing(self) -> bool:
        b = self.blob
        return b is not None and not isinstance(b, bytes) and not b.done


CAPTURE_SLICE = 64          # objects a background slice saves (~2 ms: kernel/capture.py)


class Applier:
    """See the module docstring. ``sm`` has ``apply(index, data)``, ``abort(index, data,
    message)`` (both return completions), ``is_checkpoint(data)``, ``checkpoint_index`` and
    ``checkpoint_blob``."""

    def __init__(self, fresh: Callable[[], Any], restore: Callable[[bytes], Any],
                 deliver: Callable[[list], None], *, monitor: Any = None,
                 record: Optional[Record] = None,
                 forget_record: Callable[[], None] = lambda: None,
                 pending_abort: Callable[[int], bool] = lambda index: False) -> None:
        self._fresh, self._restore, self._deliver = fresh, restore, deliver
        self.monitor = monitor                  # watchdog.ApplyMonitor, or None
        self.record = record                    # the runaway record of this replica
        self._forget_record = forget_record     # removes its file
        self._pending_abort = pending_abort     # a committed Abort(index) is in the log
        self.sm = fresh()
        self.applied = 0                        # last entry applied or aborted, not held
        self.gens: List[Gen] = [Gen(0, None)]   # the older (if any) and the current one
        self.marks: List[int] = []              # indices of the last two checkpoints made
        self.aborted: Dict[int, float] = {}     # aborted entry -> limit (for its message)
        self.stands: Set[int] = set()           # entries an Abort found too old to undo
        self.held: List[Entry] = []
        self.hold_reason = ""                   # "record" or "abort", while held
        self.aborts = 0                         # effective aborts applied by this process
        self._next_proposal = 0.0

    # ------------------------------------------------------------------- the apply path
    def apply(self, index: int, data: bytes) -> None:
        """Apply (or hold back) one committed entry. Raises ApplyFailed."""
        if data[:1] == b"\xff":
            self._on_abort(index, data)
        elif self.held:
            self.held.append((index, data))
        elif (self.record is not None or self._pending_abort(index)) and \
                self._must_hold(index, data):
            self._hold(index, data)
        else:
            self._apply_one(index, data)

    def _apply_one(self, index: int, data: bytes, guarded: bool = True) -> None:
        monitor = self.monitor
        if monitor is not None:
            monitor.begin(index, data, guarded)
        try:
            out = self.sm.apply(index, data)
        except BaseException as exc:    # the state machine may be half-updated: fail-stop
            raise ApplyFailed(f"state machine failed applying index {index}", exc) from exc
        finally:
            if monitor is not None:
                monitor.end()
        cur = self.gens[-1]
        cur.entries.append((index, data))
        self.applied = index
        ckpt = self.sm.checkpoint_index
        if ckpt is not None and ckpt != cur.index:
            self._rotate(ckpt)
        if out:
            self._deliver(out)

    def _rotate(self, ckpt: int) -> None:
        """A new checkpoint: it starts the current generation; the last one becomes the older
        one, and the one before is dropped."""
        cur = self.gens[-1]
        later = [e for e in cur.entries if e[0] > ckpt]
        if later:
            cur.entries = [e for e in cur.entries if e[0] <= ckpt]
        sm = self.sm
        blob = getattr(sm, "checkpoint_result", None) if hasattr(sm, "capture_some") else None
        self.gens = [cur, Gen(ckpt, blob if blob is not None else sm.checkpoint_blob, later)]
        self.marks = (self.marks + [ckpt])[-2:]

    def _abort_one(self, index: int, data: bytes, limit: float) -> None:
        try:
            out = self.sm.abort(index, data, abort_message(index, limit))
        except BaseException as exc:
            raise ApplyFailed(f"state machine failed aborting index {index}", exc) from exc
        self.gens[-1].entries.append((index, data))
        self.applied = index
        if out:
            self._deliver(out)

    # ---------------------------------------------------------------------- holding
    def _must_hold(self, index: int, data: bytes) -> bool:
        r = self.record
        if r is not None and r.index <= index:
            if r.index == index and r.crc == zlib.crc32(data):
                self.hold_reason = "record"
                return True
            log.warning("runaway record for log entry %d does not match the log: removed",
                        r.index)
            self._drop_record()
        if index not in self.stands and index not in self.aborted and \
                self._pending_abort(index):
            self.hold_reason = "abort"
            return True
        return False

    def _hold(self, index: int, data: bytes) -> None:
        self.held = [(index, data)]
        self._next_proposal = 0.0
        if self.hold_reason == "record":
            log.error("holding log entry %d back: it ran away when this replica applied it "
                      "(runaway record); proposing its abort to the cluster; entries after it "
                      "wait in memory", index)
        else:
            log.warning("holding log entry %d back: the log holds a committed abort of it",
                        index)

    def due_proposal(self, now: float) -> Optional[bytes]:
        """The Abort command to propose now, if this replica holds an entry by its record."""
        r = self.record
        if not self.held or self.hold_reason != "record" or r is None or \
                now < self._next_proposal:
            return None
        self._next_proposal = now + PROPOSE_EVERY
        return encode_abort(r.index, r.crc, r.limit)

    def _release(self, unguarded_head: bool = False) -> None:
        held, self.held = self.held, []
        self.hold_reason = ""
        for n, (index, data) in enumerate(held):
            if self.held:                       # a later entry is held back again
                self.held.append((index, data))
            elif index in self.aborted:
                self._abort_one(index, data, self.aborted[index])
            elif n > 0 and (self.record is not None or self._pending_abort(index)) and \
                    self._must_hold(index, data):
                self._hold(index, data)
            else:
                self._apply_one(index, data, guarded=not (n == 0 and unguarded_head))

    def _drop_record(self) -> None:
        if self.record is not None:
            self.record = None
            self._forget_record()

    # ----------------------------------------------------------------------- aborts
    def _on_abort(self, at: int, data: bytes) -> None:
        parsed = decode_abort(data)
        if parsed is None:
            log.error("log entry %d: malformed abort command (ignored)", at)
            return
        index, crc, limit = parsed
        if index in self.aborted or not 0 < index < at:
            return
        pos = next((n for n, (i, _) in enumerate(self.held) if i == index), None)
        if pos is not None:
            entry: Optional[bytes] = self.held[pos][1]
        elif self.held and index > self.held[0][0]:
            return                              # not an entry of this layer
        else:
            entry = self._applied_entry(index)
            if entry is None and (index > self.gens[0].index or self.gens[0].blob is None):
                return                          # within what it applied, not of this layer
        if entry is not None and zlib.crc32(entry) != crc:
            log.warning("log entry %d: abort of entry %d ignored (its CRC does not match)",
                        at, index)
            return
        if self.record is not None and self.record.index == index:
            self._drop_record()                 # resolved, one way or the other
        if self._stands(index):
            self.stands.add(index)
            log.warning("log entry %d: entry %d stands: two checkpoints came after it before "
                        "its abort (it ran away on some replica only)", at, index)
            if pos == 0:
                self._release(unguarded_head=True)
            return
        if entry is None:
            raise ApplyFailed(
                f"cannot abort log entry {index}: this replica applied it and has no "
                "checkpoint before it (it loaded a snapshot taken after it); re-seed it (README "
                "'A call that runs away')", RuntimeError("no checkpoint before the entry"))
        self.aborted[index] = limit
        while len(self.aborted) > MAX_ABORTED:
            del self.aborted[next(iter(self.aborted))]
        self.aborts += 1
        log.error("log entry %d aborted by the cluster (abort at %d): %s", index, at,
                  abort_message(index, limit))
        if pos is None:
            self._rollback(index)
        elif pos == 0:
            self._release()

    def _applied_entry(self, index: int) -> Optional[bytes]:
        for g in self.gens:
            if g.entries and g.entries[0][0] <= index <= g.entries[-1][0]:
                for i, d in g.entries:
                    if i == index:
                        return d
        return None

    def _stands(self, index: int) -> bool:
        later = sum(1 for k in self.marks if k >= index)
        later += sum(1 for i, d in self.held if i >= index and self.sm.is_checkpoint(d))
        return later >= 2

    def _rollback(self, index: int) -> None:
        """Rebuild the state without entry `index` (applied here): restore the newest
        checkpoint before it and re-apply what came after, `index` as aborted."""
        at = max((n for n, g in enumerate(self.gens) if g.index < index), default=None)
        if at is None:
            raise ApplyFailed(f"cannot abort log entry {index}: no checkpoint before it here",
                              RuntimeError("no checkpoint before the entry"))
        base = self.gens[at]
        replay = [e for g in self.gens[at:] for e in g.entries]
        log.warning("rolling back to the checkpoint at %d to take out log entry %d "
                    "(%d entries re-applied)", base.index, index, len(replay) - 1)
        try:
            blob = base.blob_bytes()
            self._replace(self._restore(blob) if blob is not None else self._fresh())
        except BaseException as exc:
            raise ApplyFailed(f"cannot restore the checkpoint at {base.index}", exc) from exc
        self.gens = self.gens[:at] + [Gen(base.index, base.blob)]
        self.marks = [k for k in self.marks if k <= base.index]
        self.applied = base.index
        for i, d in replay:
            if i in self.aborted:
                self._abort_one(i, d, self.aborted[i])
            else:
                self._apply_one(i, d)

    # ------------------------------------------------------------ deferred capture
    def background(self) -> bool:
        """One slice of the state machine's open checkpoint capture (apply thread, nothing
        queued); whether more is left."""
        fn = getattr(self.sm, "capture_some", None)
        if fn is not None and not self.held and fn(CAPTURE_SLICE):
            return True
        for g in self.gens:          # a capture that ended (here, or at an entry) has left
            g.join_apart()           # its parts to join
        return False

    def capturing(self) -> bool:
        """Whether the newest checkpoint is still being captured, or could not be (any
        thread: reads a flag)."""
        return self.gens[-1].capturing()

    # -------------------------------------------------------------------- snapshots
    def snapshot(self, last_index: int) -> Tuple[Dict[str, Any], bool]:
        """What a snapshot at `last_index` holds, and whether its commands hold an aborted
        entry (an older gesmas must not read it: it would apply that entry)."""
        if self.held:
            raise RuntimeError("no snapshot while entries are held back")
        cur = self.gens[-1]
        commands = [(i, d) for i, d in cur.entries if i <= last_index]
        if cur.capturing():
            raise RuntimeError("no snapshot while the checkpoint is being captured")
        blob = cur.blob_bytes()
        return ({"checkpoint_index": cur.index if blob is not None else None,
                 "checkpoint_blob": blob, "commands": commands,
                 "aborted": dict(self.aborted), "checkpoint_marks": list(self.marks)},
                any(i in self.aborted for i, _ in commands))

    def _replace(self, sm: Any) -> None:
        """Apply to `sm` from now on; the state machine it replaces is closed (a kernel
        holds greenlets that only an explicit close lets go: Runner.close)."""
        old, self.sm = self.sm, sm
        close = getattr(old, "close", None)
        if close is not None and old is not sm:
            try:
                close()
            except Exception:             # its memory stays; the replica goes on
                log.exception("closing the replaced state machine failed")

    def load(self, payload: Dict[str, Any], last_index: int) -> None:
        """Replace the state by a snapshot's (completions are not delivered: nobody waits
        for them)."""
        blob = payload["checkpoint_blob"]
        ckpt = payload["checkpoint_index"]
        aborted = {int(i): float(v) for i, v in (payload.get("aborted") or {}).items()}
        sm = self._restore(blob) if blob is not None else self._fresh()
        commands = list(payload["commands"])
        for index, data in commands:
            if index in aborted:
                sm.abort(index, data, abort_message(index, aborted[index]))
                continue
            if self.monitor is not None:
                self.monitor.begin(index, data)
            try:
                sm.apply(index, data)
            finally:
                if self.monitor is not None:
                    self.monitor.end()
        self._replace(sm)
        self.gens = [Gen(ckpt if blob is not None else 0, blob, commands)]
        self.marks = list(payload.get("checkpoint_marks") or ([ckpt] if ckpt else []))
        self.aborted, self.stands = aborted, set()
        self.held, self.hold_reason = [], ""
        self.applied = last_index
        if self.record is not None and self.record.index <= last_index:
            log.warning("runaway record for log entry %d: the snapshot covers it: removed",
                        self.record.index)
            self._drop_record()

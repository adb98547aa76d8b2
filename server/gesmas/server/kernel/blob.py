"""A checkpoint's bytes: how an object's state is pickled, and how a blob of any format
gesmas has written is read back (checkpoint.py writes them and restores what this reads).

Layout (format 4 on): the registry's sources, pickled; a header (state, waiting calls,
number of objects[, deferred objects]); one frame per object, (name, class, version, state
pickle, owner, size). Format 6 writes the number of waiting calls in the header and each
call after it as a pickle of its own (capture.py); format 7 lists the deferred objects after
the frames instead of in the header, so that its header holds nothing per object. Formats 1 to 3 are read for backups and
data dirs of older gesmas.
The state in the header names the objects whose waiters the checkpoint kept in place
(`kept`, any format, written only when there are some): a restore re-runs their calls
uncharged, as the live replicas did not run them. A header without it (an earlier gesmas
wrote it, or no waiter was kept) is restored as before: every re-run charged.
"""
from __future__ import annotations

import io
import pickle
from dataclasses import dataclass
from typing import Any

from .records import PendingCall
from .registry import Registry

FORMAT = 8            # 3: pending calls as PendingCall.saved() tuples; 4: objects as frames;
#                       5: the deferred objects listed (capture.py), their sizes one late;
#                       6: the pending calls after the header, one pickle each (capture.py);
#                       7: the deferred objects listed after the frames (ListedCapture),
#                          with the sizes still to apply after it;
#                       8: as 7, each session's objects (Session.touched) in parts


def pickle_state(registry: Registry, obj: Any) -> bytes:
    """An object's state as a checkpoint writes it: classes by reference to the registry."""
    buf = io.BytesIO()
    p = pickle.Pickler(buf, protocol=5)
    p.persistent_id = registry.persistent_id  # type: ignore[method-assign]
    p.dump(obj)
    return buf.getvalue()


def unpickle_state(registry: Registry, data: bytes) -> Any:
    up = pickle.Unpickler(io.BytesIO(data))
    up.persistent_load = registry.persistent_load  # type: ignore[method-assign]
    return up.load()


@dataclass
class Read:
    """A blob, read: the saved state (a dict: checkpoint.saved_state), the waiting calls in
    the order a restore re-runs them, the objects as (name, class, version, state pickle or
    (format 1) instance[, where its frame is in the blob: (start, end), format 4 on]), their
    owners and sizes, and the objects whose size a restore measures (format 5 on:
    capture.py), in name order."""

    state: dict[str, Any]
    pending: list[PendingCall]
    objects: list[tuple[Any, ...]]
    owners: dict[str, str]
    sizes: dict[str, int]
    deferred: list[str]
    pending_sizes: list[tuple[str, int]]   # format 7: sizes applied after it (capture.py)


def read(blob: bytes, registry: Registry) -> Read:
    """Read `blob`, loading its class sources into `registry` first (the objects' pickles
    name their classes through it). ValueError for a format this gesmas does not read."""
    buf = io.BytesIO(blob)
    registry.load(pickle.load(buf))
    up = pickle.Unpickler(buf)          # format 1 pickled instances with references
    up.persistent_load = registry.persistent_load  # type: ignore[method-assign]
    loaded = up.load()
    state = loaded[0]
    owners, sizes = state.get("owners", {}), state.get("sizes", {})   # format 4: frames
    objects: list[tuple[Any, ...]]
    fmt = state["format"]
    if fmt == 1:                        # before per-object pickles (gesmas <= d805759)
        pending = loaded[1]
        objects = [(n, c, v, inst) for n, c, v, inst in state["objects"]]
    elif fmt == 2:                      # pending calls pickled as PendingCall (<= cd0176a)
        _, pending, objects = loaded
    elif fmt == 3:                      # objects in one list (<= 0141fe9)
        pending = [PendingCall.load(p) for p in loaded[1]]
        objects = loaded[2]
    elif fmt in (4, 5, 6, 7, 8):        # 5: the deferred objects listed too; 6: calls apart
        pending = [PendingCall.load(p) for p in loaded[1]] if fmt < 6 else \
            [PendingCall.load(pickle.load(buf)) for _ in range(loaded[1])]
        objects = []
        for _ in range(loaded[2]):
            start = buf.tell()
            name, cname, version, data, owners[name], sizes[name] = pickle.load(buf)
            objects.append((name, cname, version, data, (start, buf.tell())))
    else:
        raise ValueError(f"checkpoint format {fmt} is not supported")
    pending_sizes: list[tuple[str, int]] = []
    if fmt >= 7:                        # lists until an empty one: names, then sizes
        deferred = []
        while part := pickle.load(buf):
            deferred.extend(part)
        while part := pickle.load(buf):
            pending_sizes.extend(tuple(x) for x in part)
    else:
        deferred = loaded[3] if fmt >= 5 else []
    return Read(state, pending, objects, owners, sizes, deferred, pending_sizes)

"""Objects a capture makes, taken out of the garbage collector's lists at once.

Why. A replica freezes whatever survives a middle pass of the collector (`gesmas.server.main.
tune_gc`): no later pass walks it, and a cycle of frozen objects is never collected. Until
that pass, though, every young and middle pass walks it. A checkpoint's capture replaces each
object it saves by the copy loaded from its frame, and keeps the object's measured size in a
tuple until the next checkpoint (kernel/capture.py): two long-lived objects per saved object,
made ~20,000 at a time. In-process at 3x10^5 Counters with Counters made beside the capture
(as during creation), the middle passes that ran during a capture took 36-97 ms, against
3-6 ms while only creating; with the copies and tuples untracked as they are made, 3-23 ms,
and the young passes 10-20 ms -> 1-3 ms; at 10^6 the middle passes' medians went from
58-91 ms to 3-9 ms (docs/performance.md, "The collector's passes during a capture"). A
middle pass holds its replica's GIL to the end, so each was a stall for every call on that
replica.

What `untrack(obj)` does is what freezing does to it later, only sooner: the collector no
longer sees it, and it is freed by reference counting as any object is. A cycle through it
would never be collected, as for a frozen one; a saved object's copy is loaded from plain
values (standard classes only: kernel/capture.py) and its size tuple holds its record and an
int, so neither is in a cycle. Only the collector's bookkeeping changes, never what any code
computes: replicas stay the same (tests/test_gc.py).

Enabled by `tune_gc` together with the freezing (GESMAS_GC_FREEZE=0 turns both off,
GESMAS_GC_UNTRACK=0 this alone); off in a process that did not ask for it (in-process kernels
in tests, tools). CPython only: where the C API is not reachable (`ctypes.pythonapi`), it
stays off.
"""
from __future__ import annotations

import gc
from typing import Any, Callable, Optional

_untrack: Optional[Callable[[Any], None]] = None


def enable(on: bool) -> bool:
    """Turn untracking on or off for this process; returns whether it is on."""
    global _untrack
    if not on:
        _untrack = None
        return False
    try:
        import ctypes
        fn = ctypes.pythonapi.PyObject_GC_UnTrack
    except (ImportError, AttributeError):   # not CPython: the collector walks them, as before
        _untrack = None
        return False
    fn.argtypes = [ctypes.py_object]
    fn.restype = None
    _untrack = fn
    return True


def enabled() -> bool:
    return _untrack is not None


def untrack(obj: Any) -> None:
    """Take `obj` out of the collector's lists, if untracking is on and it is in them."""
    fn = _untrack
    if fn is not None and gc.is_tracked(obj):
        fn(obj)

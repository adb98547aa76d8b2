"""How deep uploaded code may call: the same number of frames on every replica.

Python raises RecursionError when a thread's call depth reaches the interpreter's recursion
limit, and the depth counts every frame below the running code: the kernel's own, and those
of whoever applies the entry (Raft's thread applying a committed entry, a replica replaying
its journal after a restart, a checkpoint re-running a call, a test). Those differ from
replica to replica, so with one fixed limit a method that recurses (or a deep value pickled,
or a deeply nested class source compiled) would stop at a different depth on each replica,
and a class that catches RecursionError would compute a different state.

So uploaded code always runs with the limit set `HEADROOM` frames above the depth at which
its entry point started: a request's greenlet (the depth it starts at is measured once, and
set again each time the runner switches back into it), a class source being compiled and
run, an object being pickled or loaded by a checkpoint, the state digest. What is below that
point is the kernel's business and changes nothing the dialect can see.

Interface: `depth()`, `limit_for(depth)`, `use(limit)`, and `relative()` (a context manager
for code on the kernel's own greenlet).
"""
from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Iterator

HEADROOM = 700     # frames above the entry point; the default limit is 1000 in all


def depth() -> int:
    """The calling thread's call depth, as the interpreter counts it for RecursionError.
    Python has no getter for it, but a limit refused as too low names the depth."""
    try:
        sys.setrecursionlimit(1)
    except RecursionError as e:
        text = str(e)
        try:
            return int(text.split("recursion depth ", 1)[1].split(":", 1)[0]) - 1
        except (IndexError, ValueError):
            raise RuntimeError(f"cannot read the call depth from {text!r}") from None
    raise RuntimeError("the recursion limit could be set to 1")   # pragma: no cover


def limit_for(base: int) -> int:
    return base + HEADROOM


def use(limit: int) -> None:
    """Make `limit` the interpreter's recursion limit (it is one for all threads; the other
    threads of a replica never run deeper than a few dozen frames)."""
    if sys.getrecursionlimit() != limit:
        sys.setrecursionlimit(limit)


@contextmanager
def relative() -> Iterator[None]:
    """Run the block with the limit HEADROOM frames above the caller's depth."""
    before = sys.getrecursionlimit()
    use(limit_for(depth()))
    try:
        yield
    finally:
        use(before)


assert depth() >= 1, "the call depth cannot be read on this Python"

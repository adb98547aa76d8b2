"""Threads that are ending when the program exits are let finish first (a bounded wait).

At the interpreter's exit a daemon thread that needs the GIL again is stopped where it
stands, holding whatever locks it holds. grpc's request thread of a stream takes the RPC's
condition once more after its request iterator ends (to send the half-close), and a
stream's reader takes it to read the stream's end; a thread stopped inside that leaves the
condition held for ever, and a grpc ``_Rendezvous`` collected later in the exit
(``__del__`` takes that condition) then waits for good: ``gesmas lock -- CMD`` hung once at
its exit that way, its client closed a moment before.

So what ends a stream (the request iterators when they return, ``CallStream.finish`` and
``cancel`` for their reader threads) names the threads that are ending (``ending``), and an
``atexit`` handler, which runs before daemon threads are stopped, joins those still alive,
for at most ``EXIT_WAIT`` seconds in all. A thread that waits for something else (a request
iterator still open, a reader of a stream nobody ended) is not named: it holds no grpc lock
while it waits, and is stopped at exit as before.
"""
from __future__ import annotations

import atexit
import threading
import time
import weakref

#: The longest the program's exit waits for the threads that are ending, in all.
EXIT_WAIT = 2.0

_ending: weakref.WeakSet[threading.Thread] = weakref.WeakSet()
_lock = threading.Lock()


def ending(thread: threading.Thread | None = None) -> None:
    """`thread` (the calling one by default) is ending: the program's exit waits for it."""
    with _lock:
        _ending.add(thread if thread is not None else threading.current_thread())


def let_finish(limit: float = EXIT_WAIT) -> list[threading.Thread]:
    """Join the threads named by ``ending`` that are still alive, for at most ``limit``
    seconds in all; the ones still alive after it (the exit handler)."""
    with _lock:
        threads = [t for t in _ending if t.is_alive() and t is not threading.current_thread()]
    deadline = time.monotonic() + limit
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    return [t for t in threads if t.is_alive()]


atexit.register(let_finish)

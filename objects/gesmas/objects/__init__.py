"""The standard gesmas synchronization classes.

Each module here is class *source* in the upload dialect, not a module to import: the server
registers these files through the log with the same RegisterClass command a user's upload
goes through, and they are compiled by the same dialect compiler. `Semaphore` and `context`
are provided by the dialect; the `TYPE_CHECKING` imports only help editors and type checkers.

`_restartable` in a class lists the methods whose wait a checkpoint may leave in place
instead of interrupting and re-running it (server kernel, Checkpoints._kept_objects). A method
may be listed only if it changes nothing before its first wait and, while it waits, running it
again from its start would end in the same wait: a replica restored from the checkpoint does
exactly that. tests/test_objects.py checks each class's waits against a restored replica.
Only the reserved class names below are trusted with it.

`_parked` lists the methods whose wait holds no greenlet (server kernel, runner.py, parked
calls): the call unwinds when it blocks, and runs again from its start when its wait is
granted, its first acquire of that semaphore taking the permit handed to it. A method may be
listed only if, in addition, the code before that acquire reads nothing a grant changes (so
the re-run reaches the same acquire), and no handler surrounds the wait (a timed-out or
aborted wait ends the call without running it again). tests/test_parked.py runs each such
method with and without parking and compares answers, state and steps.

`_constructor_args` lists the constructor parameters an object keeps, each in the attribute
of its name or as a (parameter, attribute) pair: a get-or-create of an existing object that
names one of them with another value is refused (ALREADY_EXISTS, type ConstructorMismatch;
server kernel, Lifecycle.check_args). Any class may say so, uploaded ones too.
"""
from __future__ import annotations

from importlib import resources

MODULES = ("queue", "lock", "semaphore", "barrier", "latch", "rwlock", "election", "counter",
           "group", "kvmap")

#: The class names the standard modules define. They are reserved: only the replicas register
#: them (an upload that defines one is refused, so nobody can replace the standard Queue).
#: Future standard classes take the names listed here first (tests/test_objects.py checks
#: that the list covers every class of MODULES).
RESERVED_CLASSES = frozenset({
    "Queue", "Lock", "Semaphore", "Barrier", "DoubleBarrier", "CountDownLatch",
    "ReadWriteLock", "LeaderElection", "Counter",
    # names a future standard class may take (issue: Python-like objects, tooz groups)
    "BoundedSemaphore", "Condition", "Event", "Group", "Election",
    "SharedLock", "Map"})


def standard_sources() -> list[tuple[str, str]]:
    """(module name, source) of every standard class module, in registration order."""
    pkg = resources.files(__name__)
    return [(m, (pkg / f"{m}.py").read_text(encoding="utf-8")) for m in MODULES]

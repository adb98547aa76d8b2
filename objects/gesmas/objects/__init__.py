"""The standard gesmas synchronization classes.

Each module here is class *source* in the upload dialect, not a module to import: the server
registers these files through the log with the same RegisterClass command a user's upload
goes through, and they are compiled by the same dialect compiler. `Semaphore` and `context`
are provided by the dialect; the `TYPE_CHECKING` imports only help editors and type checkers.
"""
from __future__ import annotations

from importlib import resources

MODULES = ("queue", "lock", "semaphore", "barrier", "latch", "rwlock", "election", "counter")


def standard_sources() -> list[tuple[str, str]]:
    """(module name, source) of every standard class module, in registration order."""
    pkg = resources.files(__name__)
    return [(m, (pkg / f"{m}.py").read_text(encoding="utf-8")) for m in MODULES]

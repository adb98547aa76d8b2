"""Test-only failpoints (as etcd's gofail): builtins that uploaded code gets only when a
replica runs with ``GESMAS_FAILPOINT_NATIVE_STALL=1`` (server config -> kernel ``Config``).
Never set it in production, and set it on every replica or none: a class that calls a
failpoint fails with NameError where it is off.

``native_stall(n)`` stands for the native work the charging of the dialect may miss: one C
call (``sum(range(n))``) that holds the GIL and checks no signal until it returns, about
n / 5e7 seconds of CPU. The step budget cannot stop it, and no other thread of the replica
runs meanwhile: only the runaway watchdog (replication/watchdog.py) can end it.
"""
from __future__ import annotations

from typing import Any, Callable


def native_stall(n: int) -> int:
    """Sum 0..n-1 in one C call; returns the sum."""
    return sum(range(int(n)))


BUILTINS: dict[str, Callable[..., Any]] = {"native_stall": native_stall}

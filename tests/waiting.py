"""Bounded polling for tests: state another thread or the cluster changes without telling."""
from __future__ import annotations

import time
from typing import Callable

WAIT = 60.0


def until(cond: Callable[[], object], what: str, timeout: float = WAIT) -> None:
    """Poll ``cond`` until it is true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"not {what} within {timeout:g} s"
        time.sleep(0.02)

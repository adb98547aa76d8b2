"""Shared fixtures. `cluster` is a real 3-process gesmas cluster on 127.0.0.1 with ephemeral
ports, shared by a test module and stopped by pid even when a test fails."""
from __future__ import annotations

import signal

import pytest

from gesmas.server.cluster import LocalCluster


@pytest.fixture(scope="module")
def cluster():
    c = LocalCluster(nodes=3, fsync=True)
    try:
        c.start(timeout=90)
        yield c
    finally:
        c.stop()


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


# A SIGTERM to pytest (a CI timeout, `kill`) runs the fixtures' teardown like Ctrl-C does,
# so the clusters they started are stopped by pid instead of left running.
signal.signal(signal.SIGTERM, _interrupt)

"""Client processes started by the cluster tests (run as a script)."""
from __future__ import annotations

import json
import sys
import time

from gesmas.client import Client


def lock_loop(addr: str, rounds: int) -> None:
    """Acquire/release a shared lock; inside, check nobody else is inside via a counter."""
    out = []
    with Client(addr, session_ttl=5.0) as c:
        lock, inside = c.lock("mutex"), c.counter("mutex-inside")
        for _ in range(rounds):
            fence = lock.acquire(timeout=60)
            n = inside.add(1)
            out.append({"fence": fence, "inside": n})
            inside.add(-1)
            lock.release()
    print(json.dumps(out), flush=True)


def hold_lock(addr: str) -> None:
    """Take the lock, say so, then wait to be killed."""
    c = Client(addr, session_ttl=2.0)
    fence = c.lock("doomed").acquire(timeout=30)
    print(json.dumps({"fence": fence}), flush=True)
    time.sleep(600)


def hold_ephemeral(addr: str, name: str, key: str) -> None:
    """Register `key` in Map `name` as an ephemeral entry, say so, then wait to be killed."""
    c = Client(addr, session_ttl=2.0)
    put = c.map(name).put(key, {"pid": 1}, ephemeral=True)
    print(json.dumps(put), flush=True)
    time.sleep(600)


if __name__ == "__main__":
    {"lock_loop": lambda: lock_loop(sys.argv[2], int(sys.argv[3])),
     "hold_lock": lambda: hold_lock(sys.argv[2]),
     "hold_ephemeral": lambda: hold_ephemeral(*sys.argv[2:5])}[sys.argv[1]]()

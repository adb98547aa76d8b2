"""Sessions a lock holder can trust, on a real 3-process cluster.

- A client whose keep-alives cannot get through (as a paused client's) hears ``lost`` and
  its lock says it is not held *before* the server expires the session and grants the lock
  to the next waiter.
- The leader SIGSTOPped for longer than the TTL: idle clients (sync and asyncio) and a lock
  holder keep their sessions, because a new leader is elected within half the TTL and their
  keep-alives move to it (issue 23: they used to spend their retries on the hung leader).

Waits are on events or bounded polls; the only sleep is the length of the fault itself.
"""
from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from typing import Any

import pytest

from gesmas.aio import Client as AioClient
from gesmas.client import Client, SessionExpired, Unavailable, core

WAIT = 30.0      # bound of every wait for an event: a failure, never a delay


def test_a_client_that_cannot_keep_alive_knows_before_the_lock_goes_to_another(cluster):
    holder = Client(cluster.addresses, session_ttl=3.0)
    waiter = Client(cluster.addresses, session_ttl=10.0)
    try:
        lock = holder.lock("sess-pause")
        fence = lock.acquire()
        assert lock.held and fence.held
        granted: dict[str, Any] = {}
        got = threading.Event()

        def wait_for_the_lock() -> None:
            granted["fence"] = waiter.lock("sess-pause").acquire(timeout=WAIT)
            got.set()

        seen: dict[str, Any] = {}
        lost = threading.Event()

        def listener(state: core.SessionState) -> None:
            if state == "lost":
                # what the holder knows at the moment it hears it
                seen["lock_held"], seen["fence_held"] = lock.held, fence.held
                seen["other_granted"] = got.is_set()
                lost.set()

        holder.add_listener(listener)
        thread = threading.Thread(target=wait_for_the_lock, daemon=True)
        thread.start()
        assert _poll(lambda: holder.lock("sess-pause").waiters() == 1)

        real = holder._attempt

        def attempt(address: str, method: str, *args: Any, **kw: Any) -> Any:
            if method == "KeepAlive":               # the holder's keep-alives stop arriving
                raise core.Failure(Unavailable(f"{address}: paused (test)"))
            return real(address, method, *args, **kw)

        holder._attempt = attempt  # type: ignore[method-assign]
        assert lost.wait(WAIT)
        assert seen == {"lock_held": False, "fence_held": False, "other_granted": False}
        with pytest.raises(SessionExpired):
            holder.counter("sess-c").add(1)            # at once: the client knows
        assert got.wait(WAIT), "the lock never went to the waiter"
        assert granted["fence"] > fence                # a newer grant: fencing still holds
    finally:
        holder.close()
        waiter.close()


def test_sessions_survive_a_leader_stopped_longer_than_their_ttl(cluster):
    ttl, stopped_for = 6.0, 7.0
    clients = [Client(cluster.addresses, session_ttl=ttl) for _ in range(3)]
    holder = Client(cluster.addresses, session_ttl=ttl)
    states: dict[int, list[str]] = {i: [] for i in range(len(clients) + 1)}
    for i, c in enumerate([*clients, holder]):
        c.add_listener(lambda s, i=i: states[i].append(str(s)))
    aio_ready, aio_done, aio_out = threading.Event(), threading.Event(), {}
    aio = threading.Thread(target=_aio_idle, args=(cluster.addresses, ttl, aio_ready,
                                                   aio_done, aio_out), daemon=True)
    aio.start()
    leader = None
    try:
        assert aio_ready.wait(WAIT)
        lock = holder.lock("sess-hang")
        fence = lock.acquire()
        leader = cluster.find_leader()
        t = time.monotonic()
        os.kill(leader.proc.pid, signal.SIGSTOP)
        try:
            others = [m for m in cluster.members if m is not leader]
            cluster.find_leader(timeout=20, among=others)
            elected = time.monotonic() - t
            time.sleep(max(0.0, stopped_for - (time.monotonic() - t)))   # the fault
        finally:
            os.kill(leader.proc.pid, signal.SIGCONT)
        if elected >= ttl / 2:
            pytest.skip(f"no new leader within half the TTL ({elected:.1f} s): the promise "
                        f"does not apply")
        for i, c in enumerate([*clients, holder]):
            assert c.state != "lost" and not c.expired, (i, states[i])
            c.counter("sess-hang-c").add(1)            # the server agrees: still open
        assert lock.held and fence.held and lock.is_owner()
        aio_done.set()
        aio.join(WAIT)
        assert aio_out.get("state") not in (None, "lost"), aio_out
        assert aio_out.get("added") == 1, aio_out
    finally:
        aio_done.set()
        if leader is not None:
            os.kill(leader.proc.pid, signal.SIGCONT)
        for c in [*clients, holder]:
            c.close()


def _aio_idle(addresses: str, ttl: float, ready: threading.Event, done: threading.Event,
              out: dict[str, Any]) -> None:
    async def main() -> None:
        async with AioClient(addresses, session_ttl=ttl) as c:
            heard: list[str] = []
            c.add_listener(lambda s: heard.append(str(s)))
            ready.set()
            await asyncio.get_running_loop().run_in_executor(None, done.wait, 120)
            out["state"], out["heard"] = str(c.state), heard
            out["added"] = 0
            await c.counter("sess-aio").add(1)
            out["added"] = 1
    try:
        asyncio.run(main())
    except BaseException as e:                          # reported by the test's asserts
        out["error"] = repr(e)


def _poll(pred: Any, timeout: float = WAIT) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False

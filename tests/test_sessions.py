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
from gesmas.client import Client, GesmasError, SessionExpired, Timeout, Unavailable, core
from gesmas.client import session as session_

WAIT = 30.0      # bound of every wait for an event: a failure, never a delay


def test_a_client_that_cannot_keep_alive_knows_before_the_lock_goes_to_another(cluster):
    holder = Client(cluster.addresses, session_ttl=3.0)
    waiter = Client(cluster.addresses, session_ttl=10.0)
    try:
        lock = holder.lock("sess-pause")
        fence = lock.acquire()
        election = holder.election("sess-pause-el")
        election.campaign("holder")
        assert lock.held and fence.held and election.leading
        granted: dict[str, Any] = {}
        got = threading.Event()

        def wait_for_the_lock() -> None:
            granted["fence"] = waiter.lock("sess-pause").acquire(timeout=WAIT)
            got.set()

        seen: dict[str, Any] = {}
        lost = threading.Event()

        def listener(state: session_.SessionState) -> None:
            if state == "lost":
                # what the holder knows at the moment it hears it
                seen["lock_held"], seen["fence_held"] = lock.held, fence.held
                seen["leading"] = election.leading
                seen["other_granted"] = got.is_set()
                lost.set()

        holder.add_listener(listener)
        thread = threading.Thread(target=wait_for_the_lock, daemon=True)
        thread.start()
        assert _poll(lambda: holder.lock("sess-pause").waiters() == 1)

        def attempt(address: str, *args: Any, **kw: Any) -> Any:
            # the holder's keep-alives stop arriving
            raise core.Failure(Unavailable(f"{address}: paused (test)"))

        holder._keepalive_attempt = attempt  # type: ignore[method-assign]
        assert lost.wait(WAIT)
        assert seen == {"lock_held": False, "fence_held": False, "leading": False,
                        "other_granted": False}
        with pytest.raises(SessionExpired):
            holder.counter("sess-c").add(1)            # at once: the client knows
        assert got.wait(WAIT), "the lock never went to the waiter"
        assert granted["fence"] > fence                # a newer grant: fencing still holds
    finally:
        holder.close()
        waiter.close()


def test_sessions_survive_a_leader_stopped_longer_than_their_ttl(cluster):
    ttl, stopped_for = 4.0, 6.0       # 1.5 x TTL: the client of issue 23 lost them all
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


class FencedStore:
    """A resource that checks fencing tokens: a write with a fence older than the newest
    it has seen is refused (the protection a user without ``lock.held`` relies on)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.top = 0
        self.accepted: list[tuple[str, int]] = []
        self.refused: list[tuple[str, int]] = []

    def write(self, who: str, fence: int) -> bool:
        with self._lock:
            if fence < self.top:
                self.refused.append((who, fence))
                return False
            self.top = fence
            self.accepted.append((who, fence))
            return True


def _pause_keepalives(c: Client) -> None:
    """From now on ``c``'s keep-alives do not get through (a client cut off or paused)."""
    def attempt(address: str, *args: Any, **kw: Any) -> Any:
        raise core.Failure(Unavailable(f"{address}: paused (test)"))

    c._keepalive_attempt = attempt  # type: ignore[method-assign]


def _holder(c: Client, who: str, lock_name: str, store: FencedStore, honour: bool,
            stop: threading.Event, steps: int, out: dict[str, Any]) -> None:
    """Take the lock in turns and write to the store while holding it; with ``honour``,
    check ``fence.held`` before each write and stop when the hold is in doubt."""
    lock = c.lock(lock_name)
    try:
        while not stop.is_set():
            try:
                fence = lock.acquire(timeout=2.0)
            except Timeout:
                continue
            try:
                for _ in range(steps):
                    if stop.is_set() or (honour and not fence.held):
                        break
                    store.write(who, fence)
                    stop.wait(0.05)                       # the work of one step
            finally:
                lock.release()
    except GesmasError as e:     # its session was lost: its wait aborted, or the next call
        out[who] = "expired" if c.expired else repr(e)
    except BaseException as e:                                # the test reports it
        out[who] = repr(e)
    else:
        out[who] = "ok"


def test_holders_that_honour_held_never_write_stale_and_the_store_refuses_those_that_do(
        cluster):
    # 1. three holders honouring fence.held; one is cut off while the leader is stopped
    store, stop, out = FencedStore(), threading.Event(), {}
    clients = {f"h{i}": Client(cluster.addresses, session_ttl=4.0) for i in range(3)}
    threads = [threading.Thread(target=_holder, args=(c, who, "sess-fenced", store, True,
                                                      stop, 4, out), daemon=True)
               for who, c in clients.items()]
    leader = None
    try:
        for t in threads:
            t.start()
        assert _poll(lambda: len(store.accepted) >= 3)
        leader = cluster.find_leader()
        _pause_keepalives(clients["h0"])
        os.kill(leader.proc.pid, signal.SIGSTOP)
        try:
            time.sleep(4.0)                                   # the fault
        finally:
            os.kill(leader.proc.pid, signal.SIGCONT)
        n = len(store.accepted)
        assert _poll(lambda: len(store.accepted) >= n + 6)  # the others go on in turns
        stop.set()
        for t in threads:
            t.join(WAIT)
        assert store.refused == [], "a holder honouring fence.held wrote with a stale fence"
        fences = [f for _, f in store.accepted]
        assert fences == sorted(fences)
        assert out["h0"] == "expired" and clients["h0"].state == "lost"
        assert out["h1"] == out["h2"] == "ok", out
    finally:
        stop.set()
        if leader is not None:
            os.kill(leader.proc.pid, signal.SIGCONT)
        for c in clients.values():
            c.close()

    # 2. a holder that ignores fence.held, cut off while it holds: the store refuses it
    store, stop, out = FencedStore(), threading.Event(), {}
    rogue = Client(cluster.addresses, session_ttl=3.0)
    other = Client(cluster.addresses, session_ttl=10.0)
    try:
        fence = rogue.lock("sess-rogue").acquire()
        _pause_keepalives(rogue)
        thread = threading.Thread(target=_holder, args=(other, "other", "sess-rogue", store,
                                                        True, stop, 4, out), daemon=True)
        thread.start()
        overlap = 0
        deadline = time.monotonic() + WAIT
        while not store.refused and time.monotonic() < deadline:
            if store.accepted and not fence.held:
                overlap += 1                  # it writes on although its hold is in doubt
            store.write("rogue", fence)
            time.sleep(0.05)
        stop.set()
        thread.join(WAIT)
        assert store.refused and store.refused[0] == ("rogue", fence)
        assert overlap >= 1 and out["other"] == "ok", out
    finally:
        stop.set()
        rogue.close()
        other.close()


class _Schedule:
    def __init__(self) -> None:
        self.failures: list[tuple[Any, bool]] = []

    def failed(self, error: Any, started: float, now: float, unresponsive: bool = False) -> None:
        self.failures.append((error, unresponsive))


class _Lease:
    session = 7

    def __init__(self) -> None:
        self.lost: list[tuple[str, bool]] = []

    def lose(self, reason: str, by_server: bool = False) -> None:
        self.lost.append((reason, by_server))


def test_a_failed_keep_alive_is_handled_alike_by_both_clients():
    """session.keepalive_failed (both clients' loops): a replica that gave no answer in time
    is made a suspect and the round goes on; the server saying the session is gone loses
    the lease; a closed client ends the loop; any other refusal is tried again later."""
    from gesmas.client import core, session as session_
    from gesmas.client.errors import NotFound, PermissionDenied, SessionExpired, Unavailable

    def run(e: Any) -> tuple[bool, _Schedule, _Lease, list[str]]:
        schedule, lease, suspects = _Schedule(), _Lease(), []
        stop = session_.keepalive_failed(e, lease, schedule, "r1:1", 0.0,  # type: ignore[arg-type]
                                         suspects.append)
        return stop, schedule, lease, suspects

    hung = Unavailable("no answer in 1 s")
    stop, schedule, lease, suspects = run(core.Failure(hung, unresponsive=True))
    assert (stop, schedule.failures, lease.lost, suspects) == (False, [(hung, True)], [],
                                                               ["r1:1"])
    refused = Unavailable("not the leader")
    stop, schedule, lease, suspects = run(core.Failure(refused))
    assert (stop, schedule.failures, lease.lost, suspects) == (False, [(refused, False)], [], [])
    for gone in (NotFound("no session 7"), SessionExpired("session 7 expired")):
        stop, schedule, lease, suspects = run(gone)
        assert (stop, schedule.failures, lease.lost) == (False, [], [(gone.message, True)])
    stop, schedule, lease, _ = run(session_.ClientClosed())
    assert (stop, schedule.failures, lease.lost) == (True, [], [])
    denied = PermissionDenied("not this caller's session")
    stop, schedule, lease, _ = run(denied)
    assert (stop, schedule.failures, lease.lost) == (False, [(denied, False)], [])

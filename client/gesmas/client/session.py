"""A session as both clients see it, without I/O: the keep-alive schedule (``KeepAlives``),
how long the session is surely valid (``Lease``, ``lease_margin``), its state
(``SessionState``: connected, suspended, lost), the listeners told of changes
(``Listeners``) and what a client exposes of all that (``SessionView``). The rules are in the
module docstring of ``gesmas.client.client`` ("Sessions and leases").
"""
from __future__ import annotations

import enum
import logging
import math
import threading
import time
from typing import Any, Callable

from gesmas.client import core
from gesmas.client.core import Attempts, Routing
from gesmas.client.errors import GesmasError, NotFound, SessionExpired, Unavailable

log = logging.getLogger(__name__)

__all__ = ["KeepAlives", "Lease", "Listeners", "SessionState", "SessionView", "given_up",
           "keepalive_deadline", "late", "lease_margin"]


#: The client's lease margin: a keep-alive acknowledged by a leader that had heard from a
#: majority within ``LEADER_LEASE`` seconds (the server refuses it otherwise,
#: gesmas.server.node) cannot predate a new leader's fresh grant by more than that...
LEADER_LEASE = 1.0
#: ... and clocks (the client's and the replicas' monotonic clocks) are assumed to run at
#: rates within this fraction of each other (real ones: 1e-4 or better).
DRIFT_RATE = 0.01


def lease_margin(ttl: float) -> float:
    """How much earlier than ``sent + ttl`` the client stops trusting its session:
    ``LEADER_LEASE + DRIFT_RATE * ttl``, at most a quarter of the TTL."""
    return min(LEADER_LEASE + DRIFT_RATE * ttl, ttl / 4.0)


def keepalive_deadline(ttl: float, replicas: int) -> float:
    """The deadline of one keep-alive attempt: ttl / (3 * replicas) as ZooKeeper's read
    timeout, within [0.5 s, 1 s] (a keep-alive is answered from the leader's memory; less
    than 0.5 s mistakes a busy leader for a hung one)."""
    return min(1.0, max(0.5, ttl / (3.0 * max(1, replicas))))


def given_up(address: str, deadline: float) -> core.Failure:
    """What a keep-alive attempt with no answer within its deadline raises (the round
    moves on at once, away from a replica that may hang); its RPC goes on (``late``)."""
    return core.Failure(Unavailable(f"{address}: no keep-alive answer within "
                                    f"{deadline:g} s"), unresponsive=True)


def late(lease: Lease, sent: float, ttl: float, interval: float, deadline: float) -> None:
    """A keep-alive attempt given up at its deadline was answered after all (``ttl``):
    the answer renews the lease from ``sent``, the attempt's send time, as an answer in
    time does. Safe however late it comes: the leader that answered had heard from a
    majority within LEADER_LEASE of answering, after ``sent``."""
    lease.acknowledged(sent, ttl, interval, deadline, time.monotonic())
    log.debug("gesmas: a late keep-alive answer renewed session %d", lease.session)


class KeepAlives:
    """When a session's next keep-alive attempt goes and how long it may take.

    Every ttl/4 seconds after the last answer, one attempt at a time with a deadline of
    ``keepalive_deadline``; a failed attempt moves on at once (away from a replica that did
    not answer, following a fresh hint) or after a backoff of at most ``deadline / 2``
    (``Attempts`` with no budget: a keep-alive round ends only with an answer, the server
    saying the session is gone, or the lease running out)."""

    def __init__(self, ttl: float, routing: Routing, now: float) -> None:
        self.routing = routing
        self.ttl = ttl
        self.interval = max(ttl / 4.0, 0.05)
        self.deadline = keepalive_deadline(ttl, len(routing.addresses))
        self.due = now + self.interval
        self._round: Attempts | None = None

    def address(self, now: float) -> str:
        """Where the attempt that goes now is sent."""
        if self._round is None:
            self._round = Attempts(self.routing, math.inf, None, keepalive=True, now=now,
                                   max_pause=self.deadline / 2)
        return self._round.address

    def answered(self, ttl: float, now: float) -> None:
        if self._round is not None:
            self._round.succeeded()
            self._round = None
        if ttl > 0:
            self.ttl = ttl
            self.interval = max(ttl / 4.0, 0.05)
            self.deadline = keepalive_deadline(ttl, len(self.routing.addresses))
        self.due = now + self.interval

    def failed(self, error: GesmasError, started: float, now: float,
               unresponsive: bool = False) -> None:
        assert self._round is not None
        self.due = now + self._round.failed(error, started, now, unresponsive)


class SessionState(str, enum.Enum):
    """What a client knows of its session (kazoo's and Curator's connection states).

    ``connected``: a keep-alive was acknowledged recently. ``suspended``: the keep-alive
    that was due has not been acknowledged in time (the session may still be valid: it
    surely is until ``Lease.valid_until``). ``lost``: past ``valid_until``, or the server
    said the session is gone; final for this session."""
    CONNECTED = "connected"
    SUSPENDED = "suspended"
    LOST = "lost"

    def __str__(self) -> str:
        return self.value


class Lease:
    """The session's lease as the client knows it, without a clock of its own.

    ``valid_until`` (monotonic seconds) is the send time of the last acknowledged
    keep-alive (or of the OpenSession) plus the granted TTL minus ``lease_margin``: the
    server cannot have expired the session before then (the leader that answered counts
    the TTL from when it received the keep-alive, and a new leader grants a fresh TTL from
    its election). Suspended after ``interval + deadline`` without an acknowledgement
    (the keep-alive that was due is late); lost from ``valid_until``, or when the server
    says so, and then for good: a later answer does not revive it."""

    def __init__(self, session: int, ttl: float, sent: float, interval: float,
                 deadline: float) -> None:
        self.session = session
        self.ttl = ttl
        self.acked = sent                 # send time of the last acknowledged keep-alive
        self.interval = interval
        self.deadline = deadline
        self.reason: str | None = None    # why it is lost, once it is
        self.by_server = False            # lost because the server said so

    @property
    def valid_until(self) -> float:
        return self.acked + self.ttl - lease_margin(self.ttl)

    @property
    def suspended_at(self) -> float:
        return min(self.acked + self.interval + self.deadline, self.valid_until)

    def acknowledged(self, sent: float, ttl: float, interval: float, deadline: float,
                     now: float) -> None:
        if self.state(now) is SessionState.LOST:
            return
        if sent > self.acked:
            self.acked = sent
        if ttl > 0:
            self.ttl = ttl
        self.interval, self.deadline = interval, deadline

    def lose(self, reason: str, by_server: bool = False) -> None:
        if self.reason is None:
            self.reason = reason
            self.by_server = by_server

    def state(self, now: float) -> SessionState:
        if self.reason is not None:
            return SessionState.LOST
        if now >= self.valid_until:
            self.reason = "no keep-alive acknowledged within the session's TTL"
            return SessionState.LOST
        if now >= self.suspended_at:
            return SessionState.SUSPENDED
        return SessionState.CONNECTED

    def next_change(self, now: float) -> float:
        """When the state changes next if no answer comes (inf once lost)."""
        if self.state(now) is SessionState.LOST:
            return math.inf
        return self.suspended_at if now < self.suspended_at else self.valid_until


class Listeners:
    """The functions to call when the session's state changes (``add_listener``), and the
    state they last heard. Thread-safe; the caller calls what ``changed`` returns."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fns: list[Any] = []
        self.last: SessionState | None = None

    def add(self, fn: Any) -> None:
        with self._lock:
            self._fns.append(fn)

    def remove(self, fn: Any) -> None:
        with self._lock:
            if fn in self._fns:
                self._fns.remove(fn)

    def changed(self, state: SessionState) -> list[Any]:
        """The listeners to tell of ``state``: all of them if it is news, else none."""
        with self._lock:
            if state is self.last:
                return []
            self.last = state
            return list(self._fns)


class SessionView:
    """What both clients tell of their session, from its ``Lease``: ``lease``, ``state``,
    ``valid_until``, ``expired``, and the listeners (``add_listener``). The client sets
    ``_lease``, ``_listeners`` and ``_expired``, and calls ``_mark_expired`` when the server
    says the session is gone and ``_publish`` when the state may have changed."""

    _lease: Lease | None
    _listeners: Listeners
    _expired: Any
    _session: int
    _on_expiry: str

    @property
    def expired(self) -> bool:
        return self._expired is not None

    @property
    def lease(self) -> Lease | None:
        """The current session's lease (``valid_until``, ``state(now)``), None before the
        session is opened."""
        return self._lease

    @property
    def state(self) -> SessionState | None:
        """``connected``, ``suspended`` or ``lost`` (None before a session is opened)."""
        lease = self._lease
        return None if lease is None else lease.state(time.monotonic())

    @property
    def valid_until(self) -> float | None:
        """Until when (``time.monotonic()``) the session is surely valid; None before a
        session is opened. A lost session's is in the past."""
        lease = self._lease
        return None if lease is None else lease.valid_until

    def add_listener(self, fn: Callable[[SessionState], object]) -> None:
        """Call ``fn(state)`` on every change of the session's state (the sync client calls
        it on its keep-alive thread, the asyncio client in the event loop: return quickly).
        kazoo's ``add_listener``."""
        self._listeners.add(fn)

    def remove_listener(self, fn: Callable[[SessionState], object]) -> None:
        self._listeners.remove(fn)

    def _lose_session(self, lease: Lease) -> None:
        """``lease`` is lost: fail or forget the session, then tell the listeners (once; the
        sync client holds its session lock around it)."""
        if lease is not self._lease or self._session != lease.session:
            return                                   # handled already
        log.warning("gesmas: session %d is lost: %s", lease.session, lease.reason)
        if self._on_expiry == "reopen":
            self._session = 0                        # the next call opens another
        elif self._expired is None:
            self._expired = SessionExpired(
                f"session {lease.session} expired: {lease.reason}", "SessionExpired")
        self._publish(lease)       # listeners hear it when calls already know

    def _publish(self, lease: Lease, state: SessionState | None = None) -> SessionState:
        """Tell the listeners the state of ``lease`` if it is the current one and news."""
        if state is None:
            state = lease.state(time.monotonic())
        if lease is self._lease:
            for fn in self._listeners.changed(state):
                try:
                    fn(state)
                except Exception:                  # a listener's bug is not the client's
                    log.exception("gesmas: session listener %r failed", fn)
        return state

    def _mark_expired(self, error: GesmasError, session: int | None = None) -> None:
        """The server said ``session`` (the current one by default) is gone."""
        lease = self._lease
        if lease is None or (session is not None and lease.session != session):
            return
        lease.lose(error.message, by_server=True)
        self._session_lost(lease)

    def _session_lost(self, lease: Lease) -> None:
        raise NotImplementedError


class ClientClosed(SessionExpired):
    """The client was closed (and with it its session); make a new Client."""

    def __init__(self, message: str = "the client is closed", type: str = "SessionExpired",
                 leader_hint: str = "") -> None:
        super().__init__(message, type, leader_hint)


def keepalive_failed(e: core.Failure | GesmasError, lease: Lease, schedule: KeepAlives,
                     address: str, started: float,
                     unresponsive: Callable[[str], None]) -> bool:
    """What both clients' keep-alive loops do with an attempt that failed with ``e``; True
    if the loop ends (the client is closed). A replica that gave no answer in time is made
    a suspect (``unresponsive``) and the round goes on elsewhere; the server saying the
    session is gone loses the lease; any other refusal is tried again later."""
    if isinstance(e, core.Failure):
        log.debug("gesmas: keep-alive of session %d at %s failed: %s",
                  lease.session, address, e.error)
        if e.unresponsive:
            unresponsive(address)
        schedule.failed(e.error, started, time.monotonic(), e.unresponsive)
    elif isinstance(e, ClientClosed):
        return True
    elif isinstance(e, (NotFound, SessionExpired)):
        lease.lose(e.message, by_server=True)
    else:                              # refused for another reason: try again later
        log.warning("gesmas: keep-alive of session %d refused: %s", lease.session, e)
        schedule.failed(e, started, time.monotonic())
    return False

"""The leader's time-based work, as a step function with no I/O and no clock of its own.

The leader never changes state directly: each duty is a command it proposes through the log.
`LeaderDuties.step(now, wall, leader)` returns those commands; the node proposes them every
`duty_period` seconds. Callers pass the time (`now` monotonic, `wall` for command timestamps),
so tests drive it with a fake clock (tests/test_duties.py).

- Tick when the earliest wait deadline is due (at most one per 50 ms);
- ExpireSession when a session's TTL passes without keep-alive. Keep-alives go to the leader,
  which keeps them here, in memory (not in the log); a replica that becomes the leader grants
  every session a fresh TTL, as etcd does. An expiry is proposed again after 2 s if it did not
  take effect;
- Checkpoint every `checkpoint_every` applied commands (at most one proposal per 5 s);
- RegisterClass of the standard classes while the cluster lacks one of this gesmas's
  standard sources (a new cluster, or an upgrade that changed them; at most every 5 s);
- with --root-password-file, the bootstrap of auth (user root, auth enabled) while the
  cluster has no user (at most every 5 s).

Threads: `applied` and `reset` run on the apply thread, `step` and `keep_alive` on the event
loop; one lock guards what both sides touch.
"""
from __future__ import annotations

import logging
import threading
from typing import Callable

import hmac

from .kernel import Kernel, codec
from .kernel.auth import SYSTEM

log = logging.getLogger(__name__)

TICK_GAP = 0.05            # seconds between two Tick proposals
EXPIRE_RETRY = 2.0         # seconds before an expiry is proposed again
PROPOSE_RETRY = 5.0        # seconds between two checkpoint / standard-class proposals


class LeaderDuties:
    def __init__(self, checkpoint_every: int, default_ttl: float,
                 standard_sources: Callable[[], list[tuple[str, str]]],
                 root_hash: str | None = None) -> None:
        self.checkpoint_every = checkpoint_every
        self._root_hash = root_hash           # bootstrap auth with this root password hash
        self._has_users = False
        self._bootstrap_proposed = 0.0
        self.default_ttl = default_ttl
        self._standard_sources = standard_sources
        self._sources: list[str] | None = None
        self._lock = threading.Lock()
        # what the replica applied (apply thread)
        self._sessions: dict[int, tuple[float, str]] = {}     # session id -> (ttl, secret)
        self.applied_index = 0
        self._checkpoint_index = 0
        self._next_deadline: float | None = None
        self._has_standard = False
        # the leader's own bookkeeping (event loop)
        self._last_seen: dict[int, float] = {}
        self._expiring: dict[int, float] = {}
        self._was_leader = False
        self._last_tick = 0.0
        self._checkpoint_proposed = 0.0
        self._standard_proposed = 0.0

    # -- apply thread ---------------------------------------------------------------------------

    def reset(self, kernel: Kernel, now: float) -> None:
        """Start over from `kernel` (a fresh or restored state machine)."""
        with self._lock:
            self._sessions = {s.id: (s.ttl, s.secret) for s in kernel.sessions.values()}
            self._last_seen = {sid: now for sid in self._sessions}
            self._expiring.clear()
        self._has_standard = self._standard_registered(kernel)
        self._has_users = bool(kernel.auth.users)
        self._checkpoint_index = kernel.checkpoint_index or 0
        self._next_deadline = kernel.next_deadline()

    def applied(self, index: int, kernel: Kernel, now: float) -> None:
        """`kernel` applied the command at `index`; read what the duties depend on."""
        changes = kernel.session_changes
        if changes:
            with self._lock:
                for sid, ttl, secret in changes:
                    if ttl is None:
                        self._sessions.pop(sid, None)
                        self._last_seen.pop(sid, None)
                        self._expiring.pop(sid, None)
                    else:
                        self._sessions[sid] = (ttl, secret)
                        self._last_seen[sid] = now
        if not self._has_standard:
            self._has_standard = self._standard_registered(kernel)
        if not self._has_users:
            self._has_users = bool(kernel.auth.users)
        self._checkpoint_index = kernel.checkpoint_index or 0
        self.applied_index = index
        self._next_deadline = kernel.next_deadline()

    def _standard_registered(self, kernel: Kernel) -> bool:
        """Every standard source of this gesmas is registered. When one is not (a new
        cluster, one made by a gesmas without a newer module, or an upgrade that changed a
        source) all are proposed: those registered before change nothing, a changed one
        becomes its classes' new version (existing objects keep theirs)."""
        if self._sources is None:
            self._sources = [source for _, source in self._standard_sources()]
        return all(kernel.registry.has(source) for source in self._sources)

    # -- event loop -----------------------------------------------------------------------------

    def keep_alive(self, session: int, secret: str, now: float) -> float | None:
        """Record a keep-alive; the session's TTL, or None if it is not open or `secret` is
        not its secret. A session id just beyond what this replica applied may be one opened
        but not applied here yet: answered with the default TTL and not remembered (the
        session gets a fresh TTL when it is applied), so made-up ids cost no memory."""
        with self._lock:
            known = self._sessions.get(session)
            if known is None:
                if session <= self.applied_index or session > self.applied_index + 10_000:
                    return None
                return self.default_ttl
            ttl, expected = known
            if not hmac.compare_digest(expected, secret):
                return None
            self._last_seen[session] = now
        return ttl

    def silent_for(self, session: int, now: float) -> float | None:
        """Seconds since this leader last heard from `session` (a keep-alive; its opening, or
        the fresh TTL every session gets from a new leader, count as heard), by the monotonic
        clock `now`; None when this replica is not leading (keep-alives go to the leader only)
        or does not know the session. The session expires once this exceeds its TTL."""
        if not self._was_leader:
            return None
        with self._lock:
            seen = self._last_seen.get(session)
        return None if seen is None else max(0.0, now - seen)

    def step(self, now: float, wall: float, leader: bool) -> list[codec.Command]:
        """The commands the leader should propose now (none on a follower)."""
        if leader and not self._was_leader:          # new leader: fresh TTL for everyone
            with self._lock:
                self._last_seen = {sid: now for sid in self._sessions}
                self._expiring.clear()
            log.info("this replica is the leader")
        self._was_leader = leader
        if not leader:
            return []
        out: list[codec.Command] = []
        d = self._next_deadline
        if d is not None and d <= wall and now - self._last_tick > TICK_GAP:
            self._last_tick = now
            out.append(codec.Tick(ts=wall))
        with self._lock:
            due = [sid for sid, (ttl, _) in self._sessions.items()
                   if now - self._last_seen.get(sid, now) > ttl
                   and now - self._expiring.get(sid, 0.0) > EXPIRE_RETRY]
            for sid in due:
                self._expiring[sid] = now
        for sid in due:
            log.info("session %d expired", sid)
            out.append(codec.ExpireSession(ts=wall, session=sid))
        if (self.applied_index - self._checkpoint_index >= self.checkpoint_every
                and now - self._checkpoint_proposed > PROPOSE_RETRY):
            self._checkpoint_proposed = now
            # objects and waiting calls saved after the entry, the changed objects found
            # by the capture (kernel/capture.py), the sessions' objects in parts, and only
            # those with a session-end hook (the names of objects gone kept)
            out.append(codec.Checkpoint(ts=wall, defer=True, calls_apart=True,
                                        listed_after=True, touched_in_parts=True,
                                        hooked_touched=True, keep_gone=True))
        if not self._has_standard and now - self._standard_proposed > PROPOSE_RETRY:
            self._standard_proposed = now
            out.extend(codec.RegisterClass(ts=wall, source=source, user=SYSTEM)
                       for _, source in self._standard_sources())
        if (self._root_hash and not self._has_users
                and now - self._bootstrap_proposed > PROPOSE_RETRY):
            self._bootstrap_proposed = now
            out.append(codec.Auth(ts=wall, op="bootstrap", args={"hash": self._root_hash},
                                  user=SYSTEM))
        return out



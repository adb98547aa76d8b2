"""The sync client's keep-alive thread (``Client``'s part of "Sessions" in client.py's
module doc): it renews the session's lease every ttl/4, moves on from a replica that does
not answer in time, renews from a late answer, and loses the lease (closing the session on
the server if it can) when it runs out or the server says the session is gone."""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from gesmas.client import core
from gesmas.client import session as session_
from gesmas.client.errors import GesmasError
from gesmas.client.security import Login
from gesmas.client.session import ClientClosed, Lease, SessionState
from gesmas.v1 import gesmas_pb2 as pb

log = logging.getLogger(__name__)


def _late_keepalive(call: Any, lease: Lease, sent: float, interval: float,
                    deadline: float) -> None:
    """A keep-alive given up at its deadline ended (grpc's callback thread): an answer
    renews the lease (session.late); a failure is ignored (the round went on)."""
    try:
        resp = call.result(timeout=0)
    except (grpc.RpcError, grpc.FutureCancelledError, grpc.FutureTimeoutError):
        return
    session_.late(lease, sent, resp.ttl, interval, deadline)


class KeepAliveThread(session_.SessionView):
    """The keep-alive loop of ``Client`` (a mixin: the client owns the state named below and
    starts ``_keepalive_loop`` on a thread of its own when it opens a session)."""

    _closed: threading.Event
    _session_lock: threading.RLock
    _session: int
    _session_secret: str
    _on_expiry: str
    _retry_timeout: float
    _seen: core.Seen
    _login: Login
    _call: Callable[..., Any]
    _stub: Callable[[str], Any]
    _metadata: Callable[[str], tuple[tuple[str, str], ...]]
    _unresponsive: Callable[[str], None]

    def _session_lost(self, lease: Lease) -> None:
        """``lease`` is lost: tell the listeners, then fail or forget the session (once)."""
        with self._session_lock:
            self._lose_session(lease)

    def _keepalive_loop(self, lease: Lease, schedule: session_.KeepAlives) -> None:
        request = pb.KeepAliveRequest(session=lease.session,
                                      session_secret=self._session_secret)
        while not self._closed.is_set():
            now = time.monotonic()
            state = lease.state(now)
            if state is SessionState.LOST:
                self._session_lost(lease)
                if not lease.by_server and not self._closed.is_set():
                    self._close_lost(lease)
                return
            self._publish(lease, state)
            wake = min(schedule.due, lease.next_change(now))
            if self._closed.wait(max(0.0, wake - now)):
                return
            started = time.monotonic()
            if started < schedule.due:
                continue
            address = schedule.address(started)
            try:
                resp = self._keepalive_attempt(address, request, schedule, lease, started)
            except (core.Failure, GesmasError) as e:
                if session_.keepalive_failed(e, lease, schedule, address, started,
                                             self._unresponsive):
                    return
                continue
            except ValueError:               # the channel was closed under it
                if self._closed.is_set():
                    return
                raise
            lease.acknowledged(started, resp.ttl, schedule.interval, schedule.deadline,
                               time.monotonic())
            schedule.answered(resp.ttl, time.monotonic())

    def _keepalive_attempt(self, address: str, request: Any, schedule: session_.KeepAlives,
                           lease: Lease, started: float) -> Any:
        """One keep-alive attempt at ``address``: its answer within ``schedule.deadline``,
        else core.Failure (unresponsive: the round moves on to another replica at once, as
        from a hung leader). The RPC itself is left to run for as long as its answer could
        still renew the lease (the TTL less the lease margin): a busy leader that answers
        late renews it from when the attempt was sent (``_late_keepalive``), so that a
        leader slow for a while (thousands of waits withdrawn at once) costs no session
        while the round goes on elsewhere."""
        metadata = self._metadata(address)
        interval, deadline = schedule.interval, schedule.deadline
        useful = lease.ttl - session_.lease_margin(lease.ttl)    # an answer renews that long
        try:
            call = self._stub(address).KeepAlive.future(
                request, timeout=max(deadline, useful), metadata=metadata)
        except ValueError as e:          # "Cannot invoke RPC on closed channel!"
            if self._closed.is_set():
                raise ClientClosed() from e
            raise
        try:
            resp = call.result(timeout=deadline)
        except grpc.FutureTimeoutError:
            call.add_done_callback(lambda done: _late_keepalive(
                done, lease, started, interval, deadline))
            raise session_.given_up(address, deadline) from None
        except grpc.RpcError as e:
            raise core.classify(e, address, self._login, metadata) from e
        self._seen.note(resp)
        return resp

    def _close_lost(self, lease: Lease) -> None:
        """Close a session the client gave up (best effort: it may expire on the server a
        little later), so that its locks go to their next waiters now."""
        try:
            self._call("CloseSession", pb.CloseSessionRequest(
                session=lease.session, session_secret=self._session_secret),
                retry_timeout=min(self._retry_timeout, lease.ttl))
        except GesmasError as e:
            log.info("gesmas: could not close the lost session %d: %s", lease.session, e)

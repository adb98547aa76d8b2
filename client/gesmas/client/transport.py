"""The sync client's transport (``Client``'s part of "Routing" and "Retries" in client.py's
module doc): a channel per replica, the Calls streams a call travels on (the client's shared
ones, a thread's own: thread_streams; followed calls on the process's merged streams or
RPCs of their own: merged_follow, own_follow), one attempt at a replica (``_attempt``), and
the retries of a call until a replica serves it (``_send``). A mixin: ``Client`` sets up its
state with ``_init_transport`` and ends it with ``_close_transport``."""
from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from gesmas.client import core
from gesmas.client.merged_follow import HUBS, MergedFollowing
from gesmas.client.own_follow import SLOTS, Deadlines, OwnFollowing, follow_stream_setting
from gesmas.client.security import TLS, Login
from gesmas.client.session import ClientClosed
from gesmas.client.streams import (STARTING, CallStream, FollowStopped, Unsupported,
                                   pick_stream, starting)
from gesmas.client.thread_streams import ThreadStreams, thread_stream_setting
from gesmas.v1 import gesmas_pb2 as pb
from gesmas.v1 import gesmas_pb2_grpc as pb_grpc

__all__ = ["CHANNEL_OPTIONS", "DEADLINE_MARGIN", "DEFAULT_CLUSTER", "MAX_MESSAGE",
           "MAX_RPC_DEADLINE", "Transport", "check_address", "parse_cluster", "rpc_deadline"]

log = logging.getLogger(__name__)

#: The cluster used when neither an argument nor GESMAS_CLUSTER names one.
DEFAULT_CLUSTER = "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103"

#: Extra seconds the gRPC deadline of a call with a timeout allows beyond it.
DEADLINE_MARGIN = 10.0
#: Timeouts longer than this (threading.TIMEOUT_MAX, float("inf"), ...) put no gRPC deadline
#: on the call: a deadline that far away overflows grpc's clock and fails at once. The server
#: still times the wait out after `timeout` (or never, past ~31,000 years).
MAX_RPC_DEADLINE = 365 * 24 * 3600.0


def rpc_deadline(timeout: float | None) -> float | None:
    """The gRPC deadline (seconds from now) of a call that may wait `timeout` seconds."""
    return core.rpc_deadline(timeout, DEADLINE_MARGIN, MAX_RPC_DEADLINE)


MAX_MESSAGE = 16 * 1024 * 1024
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE),
    ("grpc.max_receive_message_length", MAX_MESSAGE),
    # Reconnect to a restarted replica quickly (the default backoff grows to 120 s).
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
    # Detect a dead or hung replica while a call waits on it.
    ("grpc.keepalive_time_ms", 2000),
    ("grpc.keepalive_timeout_ms", 2000),
    ("grpc.http2.ping_timeout_ms", 2000),
    ("grpc.http2.max_pings_without_data", 0),
]


def parse_cluster(cluster: str | list[str] | tuple[str, ...] | None) -> list[str]:
    """The addresses of ``cluster`` ("h:p,h:p" or a list); None reads GESMAS_CLUSTER,
    falling back to ``DEFAULT_CLUSTER``."""
    if cluster is None:
        cluster = os.environ.get("GESMAS_CLUSTER") or DEFAULT_CLUSTER
    parts = cluster.split(",") if isinstance(cluster, str) else list(cluster)
    addresses = [check_address(a.strip()) for a in parts if a.strip()]
    if not addresses:
        raise ValueError(f"no address in cluster {cluster!r}")
    return list(dict.fromkeys(addresses))  # drop duplicates, keep order


def check_address(address: str) -> str:
    """``address`` if it is ``host:port`` (an IPv6 host in brackets) or a gRPC ``unix:``
    path; ValueError saying what is wrong otherwise (gRPC would take a missing port for
    443)."""
    if address.startswith(("unix:", "unix-abstract:")):
        return address
    if "://" in address or "/" in address:
        raise ValueError(f"address {address!r}: write host:port, without a scheme or path")
    host, colon, port = address.rpartition(":")
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        raise ValueError(f"address {address!r}: an IPv6 host goes in brackets, with the "
                         f"port: [::1]:7101")
    if not colon:
        raise ValueError(f"address {address!r} has no port: write host:port, e.g. "
                         f"{address}:7101")
    if not host:
        raise ValueError(f"address {address!r} has no host: write host:port, e.g. "
                         f"127.0.0.1{address}")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"address {address!r}: the port must be a number from 1 to 65535, "
                         f"not {port!r}")
    return address


class Transport:
    """The channels, streams and retries of ``Client`` (a mixin: see the module doc)."""

    _routing: core.Routing
    _seen: core.Seen
    _login: Login
    _retry_timeout: float
    _closed: threading.Event

    def _init_transport(self, tls: TLS | None, call_stream: bool | None) -> None:
        self._tls = tls
        self._credentials = tls.credentials() if tls is not None else None
        self._lock = threading.Lock()  # channels, streams (and the client's proxies)
        self._stubs: dict[str, tuple[grpc.Channel, pb_grpc.GesmasStub]] = {}
        self._call_stream = core.call_stream_setting(call_stream)
        self._streams: dict[str, list[CallStream]] = {}
        # followed calls on RPCs of their own (own_follow) or on the process's merged streams
        # (merged_follow), by replica; and their deadlines
        self._follow_stream = follow_stream_setting()
        self._followings: dict[str, set[OwnFollowing | MergedFollowing]] = {}
        self._deadlines = Deadlines()
        # a thread's calls on a Calls RPC of its own (thread_streams), read by that thread
        self._threads = (ThreadStreams(self._login, MAX_MESSAGE, self._deadlines)
                         if thread_stream_setting() else None)
        self._unary_only: set[str] = set()     # replicas without the Calls stream
        self._channels_closed = False

    def _close_transport(self) -> None:
        """Finish the streams (their calls in flight are answered), end the followed calls
        and close the channels; no stream or channel is opened after."""
        with self._lock:
            stubs, self._stubs, self._channels_closed = self._stubs, {}, True
            streams, self._streams = self._streams, {}
            followings, self._followings = self._followings, {}
        for pool in streams.values():
            for stream in pool:
                stream.finish()
        for own in followings.values():
            for following in own:
                following.cancel()
        if self._threads is not None:
            self._threads.end()
        self._deadlines.close()
        for channel, _ in stubs.values():
            channel.close()

    def _unresponsive(self, address: str) -> None:
        """``address`` gave no answer in time: it is a suspect (``core.Routing``), and the
        call streams to it are cancelled, so that the calls waiting there (and the followed
        calls) are resent elsewhere (same session and seq) now."""
        self._routing.suspect(address, time.monotonic())
        with self._lock:
            pool = self._streams.pop(address, [])
            own = self._followings.pop(address, set())
        for stream in pool:
            stream.cancel()
        for following in own:
            following.cancel()
        if self._threads is not None:
            self._threads.end(address, cancel=True)

    def _new_channel(self, address: str) -> grpc.Channel:
        if self._credentials is not None:
            return grpc.secure_channel(address, self._credentials, options=CHANNEL_OPTIONS)
        return grpc.insecure_channel(address, options=CHANNEL_OPTIONS)

    def _stub(self, address: str) -> pb_grpc.GesmasStub:
        with self._lock:
            entry = self._stubs.get(address)
            if entry is None:
                if self._channels_closed:
                    raise ClientClosed()
                channel = self._new_channel(address)
                stub = pb_grpc.GesmasStub(channel)
                entry = self._stubs[address] = (channel, stub)
            return entry[1]

    def _stream(self, address: str, metadata: tuple[tuple[str, str], ...]) -> CallStream:
        """A Calls stream to ``address`` with room for one more call: the least busy one
        opened with this metadata (a stream's metadata is fixed when it opens: after a new
        login the older streams finish their calls and close), or a new one."""
        stub = self._stub(address)
        with self._lock:
            pool = self._streams.setdefault(address, [])
            stream = pick_stream(pool, metadata)
            if stream is None:
                if self._channels_closed:
                    raise ClientClosed()
                stream = CallStream(stub, address, metadata, self._login, MAX_MESSAGE)
                pool.append(stream)
            return stream

    def _follow_own(self, address: str, metadata: tuple[tuple[str, str], ...], request: Any,
                    follow: tuple[str, str],
                    deadline: float | None) -> tuple[OwnFollowing, Any] | None:
        """(an OwnFollowing of ``request`` at ``address``, its first InvokeResponse): a
        followed call on a Calls RPC of its own, which its caller's thread reads. None when
        this process has no slot left at ``address`` (own_follow.SLOTS): the shared stream
        then carries it. The slot is given back when the following ends."""
        if not SLOTS.take(address):
            return None
        try:
            following = OwnFollowing(self._stub(address), address, metadata, self._login,
                                     MAX_MESSAGE, request, *follow, deadline,
                                     self._deadlines, self._following_ended)
        except BaseException:            # refused before its RPC (the message's size)
            SLOTS.give(address)
            raise
        return following, self._first_answer(following, following.next)

    def _follow_merged(self, address: str, metadata: tuple[tuple[str, str], ...],
                       request: Any, follow: tuple[str, str],
                       deadline: float | None) -> tuple[MergedFollowing, Any]:
        """(a MergedFollowing of ``request`` at ``address``, its first InvokeResponse): a
        followed call on the process's merged stream there (merged_follow)."""
        hub = HUBS.take(address, metadata, self._tls, self._new_channel, self._login,
                        MAX_MESSAGE)
        following = MergedFollowing(hub, deadline, HUBS.release, self._following_ended)
        return following, self._first_answer(
            following, lambda: hub.stream.follow(request, *follow, deadline, following)[1])

    def _first_answer(self, following: OwnFollowing | MergedFollowing,
                      first: Callable[[], Any]) -> Any:
        """``first()``, the first answer of ``following``, which the client's close and
        ``_unresponsive`` end meanwhile (it is closed if that raises)."""
        with self._lock:
            closed = self._channels_closed
            if not closed:
                self._followings.setdefault(following.address, set()).add(following)
        try:
            if closed:
                raise ClientClosed()
            starting(following)
            return first()
        except BaseException:
            following.close()
            raise

    def _following_ended(self, following: OwnFollowing | MergedFollowing) -> None:
        with self._lock:
            own = self._followings.get(following.address)
            if own is not None:
                own.discard(following)
                if not own:
                    del self._followings[following.address]

    def _metadata(self, address: str) -> tuple[tuple[str, str], ...]:
        """The call metadata for ``address``: the login's token (logging in first when it
        is due), or none without a login."""
        return (self._login.metadata(self._authenticate(address))
                if self._login.enabled else ())

    def _authenticate(self, address: str) -> Callable[[str, str], tuple[str, float]]:
        def authenticate(user: str, password: str) -> tuple[str, float]:
            resp = self._attempt(address, "Authenticate",
                                 pb.AuthenticateRequest(user=user, password=password),
                                 core.RPC_TIMEOUT, login=False)
            return resp.token, resp.ttl
        return authenticate

    def _attempt(self, address: str, method: str, request: Any, deadline: float | None,
                 login: bool = True, follow: tuple[str, str] | None = None) -> Any:
        """One attempt of ``method`` at ``address``. An Invoke with ``follow`` (argument,
        key) answers (a Following or None, the first InvokeResponse): a followed call on a
        Calls stream, or one plain Invoke where there is no stream."""
        metadata = self._metadata(address) if login else ()
        if method == "Invoke" and self._call_stream and address not in self._unary_only:
            try:
                if follow is not None and self._follow_stream == "merged":
                    merged, response = self._follow_merged(address, metadata, request,
                                                           follow, deadline)
                    self._seen.note(response)
                    return merged, response
                if follow is not None:
                    own = (self._follow_own(address, metadata, request, follow, deadline)
                           if self._follow_stream == "own" else None)
                    following, response = own or self._stream(address, metadata).follow(
                        request, *follow, deadline)
                    self._seen.note(response)
                    return following, response
                stream = (self._threads.get(address, metadata, self._stub)
                          if self._threads is not None else None)
                response = (stream or self._stream(address, metadata)).call(request, deadline)
                self._seen.note(response)
                return response
            except Unsupported:               # an older replica: unary Invoke there
                self._unary_only.add(address)
        if follow is not None:
            return None, self._attempt(address, method, request, deadline, login)
        try:
            response = getattr(self._stub(address), method)(request, timeout=deadline,
                                                             metadata=metadata)
            if method in core.STREAMED:
                response = list(response)
                self._seen.note(response[0] if response else None)
                return response
            self._seen.note(response)
            return response
        except grpc.RpcError as e:
            raise core.classify(e, address, self._login, metadata) from e
        except ValueError as e:  # "Cannot invoke RPC on closed channel!"
            if self._closed.is_set():
                raise ClientClosed() from e
            raise

    def _call(self, method: str, request: Any, **options: Any) -> Any:
        return self._send(method, request, **options)[1]

    def _send(
        self,
        method: str,
        request: Any,
        *,
        rpc_timeout: float | None = core.RPC_TIMEOUT,
        retry_timeout: float | None = None,
        cap: float | None = None,
        closing: bool = False,
        on_retry: Callable[[], None] | None = None,
        keepalive: bool = False,
        follow: tuple[str, str] | None = None,
    ) -> tuple[str, Any]:
        """Send ``request`` until a replica serves it; see "Retries" in the module doc.
        Returns (the address that answered, the response). ``cap`` is a monotonic time past
        which no retry starts; ``closing`` lets the call run while the client closes;
        ``keepalive`` sends to the leader (only the leader answers a keep-alive)."""
        budget = self._retry_timeout if retry_timeout is None else retry_timeout
        attempts = core.Attempts(self._routing, budget, cap, keepalive, time.monotonic())
        while True:
            started = time.monotonic()
            try:
                response = self._attempt(attempts.address, method, request, rpc_timeout,
                                         follow=follow)
                attempts.succeeded()
                return attempts.address, response
            except core.Failure as failure:
                handle = STARTING.get()
                if handle is not None and handle.stopped:
                    raise FollowStopped() from None  # its follower stopped it: no retry
                error, unresponsive = failure.error, failure.unresponsive
                unreachable = failure.unreachable
            if self._closed.is_set() and not closing:
                raise ClientClosed() from None
            previous = attempts.address
            if unresponsive:
                self._unresponsive(previous)
            pause = attempts.failed(error, started, time.monotonic(), unresponsive,
                                    unreachable)
            log.debug("gesmas: %s at %s failed (%s); next %s", method, previous, error,
                      attempts.address)
            if closing:
                time.sleep(pause)
            elif self._closed.wait(pause):
                raise ClientClosed() from None
            if on_retry is not None:
                on_retry()

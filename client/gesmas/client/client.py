"""The gesmas client: one session, retries with (session, seq), and object proxies.

Theory of operation
-------------------
A ``Client`` holds the cluster's client addresses, one lazily created gRPC channel per
address, and one *session* (OpenSession on connect, CloseSession on close).

Sessions. A daemon thread (keepalive.py) renews the session every ttl/4 seconds with
KeepAlive, which must reach the leader: an UNAVAILABLE answer names the leader in
``leader_hint`` and the thread follows it, and keeps sending keep-alives there. Each
keep-alive attempt has a deadline of ttl/(3 * replicas) within [0.5 s, 1 s]
(``session.keepalive_deadline``); a replica that does not answer in time is a *suspect* for
2 s: the keep-alive moves on to the next replica at once, hints naming the suspect are not
followed (the followers of a hung leader name it until they elect another), and the call
streams to it are cancelled, so calls blocked there are resent elsewhere with the same
(session, seq). A keep-alive round ends only with an answer, the server saying the session
is gone, or the lease running out (``session_.KeepAlives``).

The client knows how long its session is surely valid (``session.Lease``): ``valid_until`` is
the send time of the last acknowledged keep-alive plus the granted TTL minus
``session.lease_margin`` (1 s for a leader that answered while already deposed, plus 1% of the
TTL for clock drift; at most TTL/4). Its ``state`` is ``connected``, ``suspended`` (the
keep-alive that was due is late: still valid until ``valid_until``) or ``lost`` (past
``valid_until``, or the server said the session is gone); listeners (``add_listener``) hear
every change, on the keep-alive thread. A lost session is final: the client closes it on
the server if it can (so that its locks go to the next waiter at once), and then, with
``on_expiry="fail"`` (the default), every call raises ``SessionExpired`` at once; with
``on_expiry="reopen"`` the next call opens a new session (calls in flight at the loss raise
``SessionExpired``). A lock proxy knows whether its hold is still sure (``LockProxy.held``).

Routing. Any replica serves any call, but every call is a Raft command: a replica that is
not the leader forwards it and then waits for the leader's commit notice, two more hops
that made a call through a follower take about twice as long as one through the leader
(docs/performance.md). So by default (``route="leader"``) calls go where keep-alives go: the
leader named in the OpenSession answer, then wherever a hint points. ``route="replica"``
keeps calls on the replica the client uses (the first address, then wherever a failure
moves it), which spreads the gRPC work of many clients over the replicas as ZooKeeper's
clients do, at the price of that extra latency.

Every Invoke carries ``(session, seq)``: ``seq`` comes from a thread-safe counter starting
at 1 and is kept across retries, which makes a call exactly-once; the server answers a
retry with the stored result or joins the same wait. ``ack`` is the highest n such that
every call with seq <= n has ended (a reply, an error, or given up: the client never asks
about it again), so the server may forget those results.

Retries. A call is resent, with the same request, when its replica answers UNAVAILABLE or
the transport fails (connection refused or reset, the replica died or hung while the call
waited, or the client's own gRPC deadline passed): to ``leader_hint`` when there is one,
else to the next address round-robin, after a small exponential backoff (capped at 1 s).
It gives up after ``retry_timeout`` seconds of failing without a break (a long-lived
attempt that then fails starts a new period), and a call with a timeout never retries past
``timeout + retry_timeout`` from its start; a client that has never reached the cluster gives
up once every address has been unreachable (refused, unknown host, TLS on one side only) for
``core.UNREACHABLE_FOR`` seconds. Giving up after failures at several addresses raises an
Unavailable naming each with what it did. Application errors and all other answers are
never retried. A blocked call whose replica dies therefore re-attaches
elsewhere and still returns its result.

Timeouts. ``timeout=None`` leaves InvokeRequest.timeout unset (wait as long as it takes);
``timeout=0`` means "do not wait"; otherwise the server times the wait out in log time and
the gRPC deadline is ``timeout + DEADLINE_MARGIN`` so the server's answer wins (none for a
timeout beyond a year, such as ``threading.TIMEOUT_MAX`` or ``float("inf")``).

Channels send gRPC keepalive pings every 2 s during calls and give up on a replica that does
not acknowledge one within 2 s, so a call blocked on a hung replica (SIGSTOP, a partition)
moves on within ~4 s even when it waits without a deadline, and within
ttl/4 + keep-alive deadline when the hung replica is the leader the keep-alives go to. The
server must accept the pings: ``grpc.http2.min_ping_interval_without_data_ms`` <= 2000 and
``grpc.http2.max_ping_strikes`` = 0 (else it answers "too many pings": the call is retried
and still correct, but noisily).
"""
from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from typing import Any, Iterator

from gesmas.client import convert, core
from gesmas.client import session as session_
from gesmas.client.accessors import StandardObjects
from gesmas.client.admin import AdminCalls, ClassSource, NodeHealth, ObjectInfo, Status
from gesmas.client.keepalive import KeepAliveThread
from gesmas.client.session import ClientClosed, Lease, SessionState
from gesmas.client.errors import (
    GesmasError,
    NotFound,
    SessionExpired,
)
from gesmas.client.security import TLS, Login, resolve_tls
from gesmas.client.streams import STARTING, FollowHandle, FollowStopped, next_cursor
from gesmas.client.transport import (CHANNEL_OPTIONS, DEADLINE_MARGIN, DEFAULT_CLUSTER,
                                     MAX_MESSAGE, MAX_RPC_DEADLINE, Transport, check_address,
                                     parse_cluster, rpc_deadline)
from gesmas.client.proxies import PROXIES, ObjectProxy
from gesmas.v1 import gesmas_pb2 as pb

__all__ = [
    "DEFAULT_CLUSTER",
    "ClassSource",
    "Client",
    "ClientClosed",
    "NodeHealth",
    "ObjectInfo",
    "SessionState",
    "Status",
    "parse_cluster",
    # the transport's, named here too (transport.py)
    "CHANNEL_OPTIONS", "DEADLINE_MARGIN", "MAX_MESSAGE", "MAX_RPC_DEADLINE", "check_address",
]

log = logging.getLogger(__name__)

RPC_TIMEOUT = core.RPC_TIMEOUT
#: What a client does when its session is lost: stay failed, or open a new one.
ON_EXPIRY = ("fail", "reopen")
#: Proxies a client remembers, so that repeated accessor calls cost no round trip.
PROXY_CACHE = 1024


# --- the client ---------------------------------------------------------------------------


class Client(Transport, KeepAliveThread, AdminCalls, StandardObjects):
    """A connection to a gesmas cluster with one session; safe to share between threads.

    ``cluster`` is "host:port,host:port,..." or a list (default: env GESMAS_CLUSTER, else
    ``DEFAULT_CLUSTER``). ``session_ttl`` is the requested session lease in seconds;
    ``retry_timeout`` bounds how long a call keeps retrying while no replica can serve it.
    ``route`` is "leader" (calls go to the Raft leader) or "replica" (calls stay on one
    replica); see "Routing" in the module doc.
    ``tls`` secures the channels (``security.resolve_tls``: a ``TLS``, a CA file, True, or
    None for the GESMAS_TLS_* environment); ``user``/``password`` (or GESMAS_USER /
    GESMAS_PASSWORD) log in to a cluster with auth enabled, ``token`` uses a ready token.
    With ``connect=False`` the session is opened on first use instead of now (the admin
    calls — classes, objects, status — need none). Invocations travel as messages on one
    ``Calls`` stream per replica (``gesmas.client.streams``); ``call_stream=False`` (or
    GESMAS_CALL_STREAM=0) sends each as a unary ``Invoke`` RPC instead (same semantics, more
    cost per call on the replica).
    ``on_expiry`` is what the client does once its session is lost (see "Sessions" in the
    module doc): "fail" (every later call raises ``SessionExpired``; for lock holders) or
    "reopen" (the next call opens a new session; for stateless use).
    ``consistency`` is that of the reads (objects and classes listed, status):
    "linearizable" (they reflect every write acknowledged before them) or "sequential"
    (the replica's own state, never older than what this client has seen:
    ``applied_index``); each read can override it (README "Reads").
    """

    def __init__(
        self,
        cluster: str | list[str] | None = None,
        *,
        session_ttl: float = 10.0,
        retry_timeout: float = 30.0,
        connect: bool = True,
        route: str = "leader",
        tls: TLS | bool | str | dict[str, Any] | None = None,
        user: str | None = None,
        password: str | None = None,
        token: str | None = None,
        call_stream: bool | None = None,
        on_expiry: str = "fail",
        consistency: str = "linearizable",
    ) -> None:
        if not session_ttl > 0:
            raise ValueError(f"session_ttl must be > 0, not {session_ttl!r}")
        if on_expiry not in ON_EXPIRY:
            raise ValueError(f"on_expiry must be 'fail' or 'reopen', not {on_expiry!r}")
        if route not in ("leader", "replica"):
            raise ValueError(f"route must be 'leader' or 'replica', not {route!r}")
        self._consistency = core.consistency_setting(consistency)
        self._seen = core.Seen()
        self._routing = core.Routing(parse_cluster(cluster), route == "leader")
        self._login = Login(user, password, token)
        self._ttl = float(session_ttl)
        self._retry_timeout = float(retry_timeout)
        self._init_transport(resolve_tls(tls), call_stream)    # transport.py
        self._session_lock = threading.RLock()  # opening, losing the session
        self._proxies: OrderedDict[tuple[str, str], ObjectProxy] = OrderedDict()
        self._session = 0
        self._session_secret = ""
        self._granted_ttl = self._ttl
        self._expired: SessionExpired | None = None
        self._closed = threading.Event()
        self._keepalive: threading.Thread | None = None
        self._seqs = core.Sequencer()
        self._on_expiry = on_expiry
        self._lease: Lease | None = None
        self._listeners = session_.Listeners()
        if connect:
            try:
                self.session
            except BaseException:
                self.close()
                raise

    # --- context manager, session ---------------------------------------------------------

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client({','.join(self._routing.addresses)!r}, session={self._session})"

    @property
    def addresses(self) -> list[str]:
        return list(self._routing.addresses)

    @property
    def session(self) -> int:
        """The session id, opening the session (and starting keep-alives) if needed."""
        self._check_usable()
        if self._session:
            return self._session
        with self._session_lock:
            if self._session:
                return self._session
            sent = time.monotonic()
            resp = self._call("OpenSession", pb.OpenSessionRequest(ttl=self._ttl))
            self._granted_ttl = resp.ttl or self._ttl
            self._session_secret = resp.session_secret
            if resp.leader:
                with self._routing.lock:
                    self._routing.learn_leader(resp.leader)
            schedule = session_.KeepAlives(self._granted_ttl, self._routing, time.monotonic())
            lease = Lease(resp.session, self._granted_ttl, sent, schedule.interval,
                          schedule.deadline)
            self._seqs = core.Sequencer()
            self._lease, self._session = lease, resp.session
            self._keepalive = threading.Thread(
                target=self._keepalive_loop, args=(lease, schedule),
                name=f"gesmas-keepalive-{resp.session}", daemon=True)
            self._keepalive.start()
            self._publish(lease)
            return self._session

    @property
    def applied_index(self) -> int:
        """The highest log index seen in an answer: sequential reads reflect at least it."""
        return self._seen.index

    @property
    def leader(self) -> str | None:
        """The leader's client address as last learned (OpenSession, keep-alives, hints)."""
        with self._routing.lock:
            return self._routing.leader

    def close(self) -> None:
        """Close the session (its waiters are aborted, its locks released) and the channels.
        Idempotent."""
        if self._closed.is_set():
            return
        self._closed.set()
        if self._lease is not None:
            self._lease.lose("the client is closed")
        if self._keepalive is not None and self._keepalive is not threading.current_thread():
            self._keepalive.join(timeout=RPC_TIMEOUT)
        if self._session and self._expired is None:
            try:
                self._call("CloseSession", pb.CloseSessionRequest(
                    session=self._session, session_secret=self._session_secret),
                           retry_timeout=min(self._retry_timeout, 5.0), closing=True)
            except GesmasError as e:  # it expires on its own
                log.warning("gesmas: could not close session %d: %s", self._session, e)
        self._close_transport()

    def _check_usable(self) -> None:
        if self._expired is not None:
            raise SessionExpired(self._expired.message, self._expired.type)
        if self._closed.is_set():
            raise ClientClosed()

    # --- sequence numbers --------------------------------------------------------------------

    def _new_seq(self) -> int:
        return self._seqs.new()

    def _end_seq(self, seq: int) -> None:
        self._seqs.end(seq)

    def _current_ack(self) -> int:
        return self._seqs.ack()

    # --- objects -------------------------------------------------------------------------------

    def invoke(
        self,
        class_name: str,
        object_name: str,
        method: str,
        /,
        *args: Any,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> Any:
        """Call ``method`` on the existing object ``object_name`` of class ``class_name``;
        blocks while the method waits, up to ``timeout`` seconds (None: no limit, 0: do
        not wait). Exactly-once: retries reuse the call's (session, seq)."""
        return self._invoke(class_name, object_name, method, args, kwargs, timeout, None)

    def _invoke(self, class_name: str, object_name: str, method: str, args: tuple[Any, ...],
                kwargs: dict[str, Any], timeout: float | None,
                create: tuple[tuple[Any, ...], dict[str, Any]] | None,
                consistency: str | None = None, follow: tuple[str, str] | None = None) -> Any:
        """``invoke``; with ``create`` (constructor args, kwargs) the object is made first
        if it does not exist, in the same command (what proxies from accessors send).
        With ``follow``: (a Following or None, the first answer) of a followed reader
        (``_follow``)."""
        request = core.invoke_request(class_name, object_name, method, args, kwargs, timeout,
                                      create)
        request.session = self.session
        request.session_secret = self._session_secret
        seqs = self._seqs                     # this session's (a reopened one has others)
        request.seq = seqs.new()
        # a method its class declares read-only is served without a log entry, with this
        # consistency, the client's unless the call names one (ignored for other calls)
        request.read.CopyFrom(core.read_options(
            core.consistency_setting(consistency, self._consistency), self._seen))
        try:
            request.ack = seqs.ack()

            def refresh_ack() -> None:
                request.ack = seqs.ack()
                request.read.min_index = max(request.read.min_index, self._seen.index)

            start = time.monotonic()
            try:
                resp = self._call(
                    "Invoke",
                    request,
                    rpc_timeout=rpc_deadline(timeout),
                    cap=None if timeout is None else start + timeout + self._retry_timeout,
                    on_retry=refresh_ack,
                    follow=follow,
                )
            except SessionExpired as e:
                if not isinstance(e, ClientClosed):
                    self._mark_expired(e, request.session)
                raise
            if follow is not None:
                following, resp = resp
                return following, convert.from_value(resp.result)
            return convert.from_value(resp.result)
        finally:
            seqs.end(request.seq)

    def _follow(self, class_name: str, object_name: str, method: str, args: tuple[Any, ...],
                kwargs: dict[str, Any], argument: str, key: str, timeout: float | None,
                create: tuple[tuple[Any, ...], dict[str, Any]] | None,
                consistency: str | None = None,
                handle: FollowHandle | None = None) -> Iterator[Any]:
        """The answers of the declared reader ``method``, for ever: each next one from the
        previous answer's ``key``, passed as the keyword ``argument`` (a Map's watch:
        after_revision from "revision"). On a Calls stream the replica answers again by
        itself (Call.follow): one message per answer, none per re-arm. When the stream or
        the replica fails, the call is made again (elsewhere) from the last answer's
        cursor, so nothing is missed or seen twice; ``timeout`` bounds each wait.
        ``handle.stop()`` (another thread) ends it: the generator returns."""
        kwargs = dict(kwargs)
        while True:
            if handle is not None and handle.stopped:
                return
            token = STARTING.set(handle) if handle is not None else None
            try:
                following, value = self._invoke(class_name, object_name, method, args,
                                                 kwargs, timeout, create, consistency,
                                                 (argument, key))
            except FollowStopped:
                return
            finally:
                if token is not None:
                    STARTING.reset(token)
            try:
                while True:
                    yield value
                    ended = following is None or following.finished
                    moved, cursor = next_cursor(value, key, ended, f"{class_name}.{method}")
                    if moved:
                        kwargs[argument] = cursor
                    if ended:
                        break                  # a replica that answers once: call again
                    try:
                        resp = following.next()
                    except core.Failure as failure:
                        if handle is not None and handle.stopped:
                            return
                        if failure.unresponsive:       # a suspect: follow again elsewhere
                            self._unresponsive(following.stream.address)
                        break                  # follow again (elsewhere if need be)
                    self._seen.note(resp)
                    value = convert.from_value(resp.result)
            except SessionExpired as e:
                if not isinstance(e, ClientClosed):
                    self._mark_expired(e, self.session)
                raise
            finally:
                if following is not None:
                    following.close()

    def object(self, class_name: str, name: str, /, *args: Any, **kwargs: Any) -> ObjectProxy:
        """Get or create the object ``name`` of class ``class_name`` and return a proxy for
        it. Raises AlreadyExists if the name is taken by an object of another class, or by
        one made with other constructor arguments than those given here (arguments left out
        are not compared: ``c.queue("jobs")`` takes the queue whatever its capacity).

        One commit the first time this client asks for (class_name, name) with these
        arguments; later accessor calls return the proxy it remembers (the last 1024) without
        a round trip. Every call
        through the proxy is a get-or-create in the same command, so an object deleted
        meanwhile is made again with these constructor arguments, as a new accessor call
        would do, and ``c.queue("jobs").produce(x)`` in a loop costs one commit per item."""
        key = (class_name, name)
        with self._lock:
            proxy = self._proxies.get(key)
            if proxy is not None and proxy._create == (args, kwargs):
                self._proxies.move_to_end(key)
                return proxy
        request = pb.CreateObjectRequest(class_name=class_name, object_name=name)
        convert.fill_values(request.args, args)
        convert.fill_map(request.kwargs, kwargs)
        request.session = self.session
        request.session_secret = self._session_secret
        self._call("CreateObject", request)
        proxy = PROXIES.get(class_name, ObjectProxy)(self, class_name, name, (args, kwargs))
        with self._lock:
            self._proxies[key] = proxy
            while len(self._proxies) > PROXY_CACHE:
                self._proxies.popitem(last=False)
        return proxy

    def delete_object(self, name: str) -> None:
        """Delete the object ``name``; calls waiting on it fail with Aborted."""
        retried = False

        def note_retry() -> None:
            nonlocal retried
            retried = True

        with self._lock:
            for key in [k for k in self._proxies if k[1] == name]:
                del self._proxies[key]
        try:
            self._call("DeleteObject", pb.DeleteObjectRequest(object_name=name),
                       on_retry=note_retry)
        except NotFound:
            if not retried:  # on a retry, an earlier attempt may have deleted it
                raise

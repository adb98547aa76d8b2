"""gesmas for asyncio: the same objects and calls as ``gesmas.client``, awaitable.

    from gesmas.aio import Client
    async with Client("127.0.0.1:7101,127.0.0.1:7102") as c:
        q = c.queue("jobs")                       # no round trip: a proxy
        await q.produce(b"job-1")
        item = await q.consume(timeout=5)
        async with c.lock("schema") as fence:
            ...
        await c.barrier("phase", parties=3).wait()

Same rules as the synchronous client, from the same code (``gesmas.client.core``): calls go
to the leader (or stay on a replica with ``route="replica"``), are resent with the same
(session, seq) on UNAVAILABLE or a broken connection, so a call blocked on a replica that dies
re-attaches elsewhere and nothing runs twice; the same TLS and login (``tls=``, ``user=``,
``password=``, ``token=``, the GESMAS_* environment). The differences:

- The session is kept alive by a task, not a thread, and every call is a task's await, not a
  thread: ten thousand calls can wait in one process (bench/aio_bench.py). Its state and
  lease (``state``, ``valid_until``, ``add_listener``, ``on_expiry``) follow the sync
  client's rules ("Sessions" in ``gesmas.client.client``); listeners are plain functions,
  called in the event loop.
- Accessors (``c.queue(name, ...)``) return a proxy at once; every call through it is a
  get-or-create of the object in the same command (one commit per call), so an error such as
  AlreadyExists (the name is another class's) comes with the first call.
- Cancelling the task that awaits a call sends a cancel for it on its stream (calls travel
  as messages on ``Calls`` streams, as in the sync client; ``call_stream=False`` makes them
  unary RPCs); the replica then withdraws the call's server-side wait (the Cancel
  command), so a cancelled ``consume`` that was still waiting takes no item. A call that had already completed when the cancellation arrived
  keeps its effect (its answer is lost with the task), as with any RPC cancelled in flight.
- A replica takes ~1000 calls at a time from one stream, and gRPC allows ~1000 concurrent
  RPCs on one connection (the server's ``max_concurrent_streams``); the client opens
  another stream, or connection, to a replica when the ones it has are that busy.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from typing import Any, AsyncIterator

import grpc

from gesmas.client import convert, core
from gesmas.client import session as session_
from gesmas.client.session import Lease, SessionState
from gesmas.aio.proxies import (PROXIES, BarrierProxy, LeaderElectionProxy, LockProxy,
                                MapProxy, ObjectProxy, QueueProxy, ReadWriteLockProxy,
                                SemaphoreProxy)
from gesmas.aio.streams import CallStream
from gesmas.client.client import (CHANNEL_OPTIONS, DEADLINE_MARGIN, MAX_MESSAGE,
                                  MAX_RPC_DEADLINE, ON_EXPIRY, RPC_TIMEOUT, ClientClosed,
                                  parse_cluster)
from gesmas.client.errors import GesmasError, SessionExpired
from gesmas.client.security import TLS, Login, resolve_tls
from gesmas.client.streams import Unsupported, next_cursor, pick_stream
from gesmas.v1 import gesmas_pb2 as pb
from gesmas.v1 import gesmas_pb2_grpc as pb_grpc

__all__ = ["BarrierProxy", "Client", "LeaderElectionProxy", "LockProxy", "ObjectProxy",
           "QueueProxy", "ReadWriteLockProxy", "SemaphoreProxy", "SessionState"]

log = logging.getLogger(__name__)

#: Calls on one connection before the client opens another to the same replica (the
#: server allows 1000 streams per connection: gesmas.server.grpclimits).
STREAMS_PER_CONNECTION = 900
PROXY_CACHE = 1024


class _Connection:
    __slots__ = ("channel", "stub", "busy")

    def __init__(self, address: str, credentials: grpc.ChannelCredentials | None) -> None:
        # a channel of its own (not grpc's shared subchannel): one more TCP connection
        options = [*CHANNEL_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]
        self.channel = (grpc.aio.secure_channel(address, credentials, options=options)
                        if credentials is not None else
                        grpc.aio.insecure_channel(address, options=options))
        self.stub = pb_grpc.GesmasStub(self.channel)
        self.busy = 0


def _late_keepalive(task: asyncio.Future[Any], lease: Lease, sent: float, interval: float,
                    deadline: float) -> None:
    """A keep-alive given up at its deadline ended: an answer renews the lease
    (session.late); a failure is ignored (the round went on)."""
    if not task.cancelled() and task.exception() is None:
        session_.late(lease, sent, task.result().ttl, interval, deadline)


class Client(session_.SessionView):
    """An asyncio connection to a gesmas cluster with one session. Use ``async with`` (or
    ``await c.connect()`` / ``await c.close()``); arguments as ``gesmas.client.Client``."""

    def __init__(self, cluster: str | list[str] | None = None, *, session_ttl: float = 10.0,
                 retry_timeout: float = 30.0, route: str = "leader",
                 tls: TLS | bool | str | dict[str, Any] | None = None,
                 user: str | None = None, password: str | None = None,
                 token: str | None = None, call_stream: bool | None = None,
                 on_expiry: str = "fail", consistency: str = "linearizable") -> None:
        if not session_ttl > 0:
            raise ValueError(f"session_ttl must be > 0, not {session_ttl!r}")
        if on_expiry not in ON_EXPIRY:
            raise ValueError(f"on_expiry must be 'fail' or 'reopen', not {on_expiry!r}")
        if route not in ("leader", "replica"):
            raise ValueError(f"route must be 'leader' or 'replica', not {route!r}")
        self._consistency = core.consistency_setting(consistency)
        self._seen = core.Seen()
        self._routing = core.Routing(parse_cluster(cluster), route == "leader")
        tls_settings = resolve_tls(tls)
        self._credentials = tls_settings.credentials() if tls_settings is not None else None
        self._login = Login(user, password, token)
        self._ttl = float(session_ttl)
        self._retry_timeout = float(retry_timeout)
        self._connections: dict[str, list[_Connection]] = {}
        self._call_stream = core.call_stream_setting(call_stream)
        self._streams: dict[str, list[CallStream]] = {}
        self._unary_only: set[str] = set()
        self._session = 0
        self._session_secret = ""
        self._granted_ttl = self._ttl
        self._session_lock: asyncio.Lock | None = None
        self._login_lock: asyncio.Lock | None = None
        self._expired: SessionExpired | None = None
        self._closed = False
        self._keepalive: asyncio.Task[None] | None = None
        self._seqs = core.Sequencer()
        self._proxies: OrderedDict[tuple[str, str], ObjectProxy] = OrderedDict()
        self._on_expiry = on_expiry
        self._lease: Lease | None = None
        self._listeners = session_.Listeners()
        self._loser: asyncio.Task[None] | None = None
        self._late_keepalives: set[asyncio.Future[Any]] = set()   # given up, not ended

    # --- lifecycle ------------------------------------------------------------------------

    async def __aenter__(self) -> Client:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def connect(self) -> int:
        """Open the session now (otherwise the first call does); returns its id."""
        return await self.session()

    async def session(self) -> int:
        self._check_usable()
        if self._session:
            return self._session
        if self._session_lock is None:
            self._session_lock = asyncio.Lock()
        async with self._session_lock:
            self._check_usable()
            if not self._session:
                sent = time.monotonic()
                resp = await self._call("OpenSession", pb.OpenSessionRequest(ttl=self._ttl))
                self._session_secret = resp.session_secret
                self._granted_ttl = resp.ttl or self._ttl
                if resp.leader:
                    with self._routing.lock:
                        self._routing.learn_leader(resp.leader)
                schedule = session_.KeepAlives(self._granted_ttl, self._routing, time.monotonic())
                lease = Lease(resp.session, self._granted_ttl, sent, schedule.interval,
                              schedule.deadline)
                self._seqs = core.Sequencer()
                self._lease, self._session = lease, resp.session
                self._keepalive = asyncio.get_running_loop().create_task(
                    self._keepalive_loop(lease, schedule),
                    name=f"gesmas-keepalive-{self._session}")
                self._publish(lease)
        return self._session

    async def close(self) -> None:
        """Close the session (its waits are aborted, its locks released) and the channels."""
        if self._closed:
            return
        self._closed = True
        if self._lease is not None:
            self._lease.lose("the client is closed")
        if self._keepalive is not None:
            self._keepalive.cancel()
        for late in list(self._late_keepalives):
            late.cancel()
        if self._session and self._expired is None:
            try:
                await self._call("CloseSession", pb.CloseSessionRequest(
                    session=self._session, session_secret=self._session_secret),
                    retry_timeout=min(self._retry_timeout, 5.0), closing=True)
            except GesmasError as e:
                log.warning("gesmas: could not close session %d: %s", self._session, e)
        streams, self._streams = self._streams, {}
        for spool in streams.values():
            for stream in spool:
                stream.cancel()
        connections, self._connections = self._connections, {}
        for pool in connections.values():
            for conn in pool:
                await conn.channel.close()

    def _check_usable(self) -> None:
        if self._expired is not None:
            raise SessionExpired(self._expired.message, self._expired.type)
        if self._closed:
            raise ClientClosed()

    def _session_lost(self, lease: Lease) -> None:
        self._lose_session(lease)

    async def _keepalive_loop(self, lease: Lease, schedule: session_.KeepAlives) -> None:
        request = pb.KeepAliveRequest(session=lease.session,
                                      session_secret=self._session_secret)
        while not self._closed:
            now = time.monotonic()
            state = lease.state(now)
            if state is SessionState.LOST:
                self._session_lost(lease)
                if not lease.by_server and not self._closed:
                    await self._close_lost(lease)
                return
            self._publish(lease, state)
            wake = min(schedule.due, lease.next_change(now))
            await asyncio.sleep(max(0.0, wake - now))
            if self._closed:
                return
            started = time.monotonic()
            if started < schedule.due:
                continue
            address = schedule.address(started)
            try:
                resp = await self._keepalive_attempt(address, request, schedule, lease,
                                                     started)
            except (core.Failure, GesmasError) as e:
                if session_.keepalive_failed(e, lease, schedule, address, started,
                                             self._unresponsive):
                    return
                continue
            lease.acknowledged(started, resp.ttl, schedule.interval, schedule.deadline,
                               time.monotonic())
            schedule.answered(resp.ttl, time.monotonic())

    async def _keepalive_attempt(self, address: str, request: Any,
                                 schedule: session_.KeepAlives, lease: Lease,
                                 started: float) -> Any:
        """As the sync client's: the answer within ``schedule.deadline``, else an
        unresponsive core.Failure, the RPC left to run as long as its answer could renew the
        lease, which a late answer does from ``started`` (``_late_keepalive``)."""
        metadata = await self._metadata(address)
        interval, deadline = schedule.interval, schedule.deadline
        useful = lease.ttl - session_.lease_margin(lease.ttl)    # an answer renews that long
        conn = self._connection(address)
        conn.busy += 1
        task = asyncio.ensure_future(conn.stub.KeepAlive(
            request, timeout=max(deadline, useful), metadata=metadata))

        def done(task: asyncio.Future[Any]) -> None:
            conn.busy -= 1
            self._late_keepalives.discard(task)
        self._late_keepalives.add(task)      # referenced until it ends
        task.add_done_callback(done)
        try:
            resp = await asyncio.wait_for(asyncio.shield(task), deadline)
        except TimeoutError:
            task.add_done_callback(lambda t: _late_keepalive(t, lease, started, interval,
                                                             deadline))
            raise session_.given_up(address, deadline) from None
        except grpc.RpcError as e:
            raise core.classify(e, address, self._login, metadata) from e
        self._seen.note(resp)
        return resp

    async def _close_lost(self, lease: Lease) -> None:
        """Close a session the client gave up (best effort), so that its locks go to
        their next waiters now."""
        try:
            await self._call("CloseSession", pb.CloseSessionRequest(
                session=lease.session, session_secret=self._session_secret),
                retry_timeout=min(self._retry_timeout, lease.ttl))
        except GesmasError as e:
            log.info("gesmas: could not close the lost session %d: %s", lease.session, e)

    def _unresponsive(self, address: str) -> None:
        """``address`` gave no answer in time: cancel the call streams to it, so that the
        calls waiting there are resent elsewhere (same session and seq) now."""
        for stream in self._streams.pop(address, []):
            stream.cancel()

    # --- transport and retries (the rules are core's) --------------------------------------

    def _connection(self, address: str) -> _Connection:
        if self._closed and not self._connections:
            raise ClientClosed()
        pool = self._connections.setdefault(address, [])
        best = min(pool, key=lambda c: c.busy) if pool else None
        if best is None or best.busy >= STREAMS_PER_CONNECTION:
            best = _Connection(address, self._credentials)
            pool.append(best)
        return best

    async def _metadata(self, address: str) -> tuple[tuple[str, str], ...]:
        if not self._login.enabled:
            return ()
        if self._login.can_renew() and self._login.due():
            if self._login_lock is None:
                self._login_lock = asyncio.Lock()
            async with self._login_lock:
                if self._login.due():
                    user, password = self._login.credentials()
                    resp = await self._attempt(address, "Authenticate", pb.AuthenticateRequest(
                        user=user, password=password), RPC_TIMEOUT, login=False)
                    self._login.store(resp.token, resp.ttl)
        return self._login.header()

    def _stream(self, address: str, metadata: tuple[tuple[str, str], ...]) -> CallStream:
        """As the sync client's: the least busy stream opened with this metadata, or a new
        one (on the least busy connection)."""
        if self._closed:
            raise ClientClosed()
        pool = self._streams.setdefault(address, [])
        stream = pick_stream(pool, metadata)
        if stream is None:
            stream = CallStream(self._connection(address).stub, address, metadata,
                                self._login, MAX_MESSAGE)
            pool.append(stream)
        return stream

    async def _attempt(self, address: str, method: str, request: Any,
                       deadline: float | None, login: bool = True,
                       follow: tuple[str, str] | None = None) -> Any:
        metadata = await self._metadata(address) if login else ()
        if method == "Invoke" and self._call_stream and address not in self._unary_only:
            try:
                stream = self._stream(address, metadata)
                if follow is not None:    # (its Following, the first answer), as sync
                    following, response = await stream.follow(request, *follow, deadline)
                    self._seen.note(response)
                    return following, response
                response = await stream.call(request, deadline)
                self._seen.note(response)
                return response
            except Unsupported:               # an older replica: unary Invoke there
                self._unary_only.add(address)
        if follow is not None:
            return None, await self._attempt(address, method, request, deadline, login)
        conn = self._connection(address)
        conn.busy += 1
        try:
            response = await getattr(conn.stub, method)(request, timeout=deadline,
                                                        metadata=metadata)
            self._seen.note(response)
            return response
        except grpc.RpcError as e:
            raise core.classify(e, address, self._login, metadata) from e
        finally:
            conn.busy -= 1

    async def _call(self, method: str, request: Any, **options: Any) -> Any:
        return (await self._send(method, request, **options))[1]

    async def _send(self, method: str, request: Any, *, rpc_timeout: float | None = RPC_TIMEOUT,
                    retry_timeout: float | None = None, cap: float | None = None,
                    closing: bool = False, on_retry: Any = None,
                    keepalive: bool = False,
                    follow: tuple[str, str] | None = None) -> tuple[str, Any]:
        budget = self._retry_timeout if retry_timeout is None else retry_timeout
        attempts = core.Attempts(self._routing, budget, cap, keepalive, time.monotonic())
        while True:
            started = time.monotonic()
            try:
                response = await self._attempt(attempts.address, method, request, rpc_timeout,
                                               follow=follow)
                attempts.succeeded()
                return attempts.address, response
            except core.Failure as failure:
                error, unresponsive = failure.error, failure.unresponsive
                unreachable = failure.unreachable
            if self._closed and not closing:
                raise ClientClosed() from None
            if unresponsive:
                self._unresponsive(attempts.address)
            pause = attempts.failed(error, started, time.monotonic(), unresponsive,
                                    unreachable)
            await asyncio.sleep(pause)
            if on_retry is not None:
                on_retry()

    # --- calls -----------------------------------------------------------------------------

    async def invoke(self, class_name: str, object_name: str, method: str, /, *args: Any,
                     timeout: float | None = None, **kwargs: Any) -> Any:
        """Call ``method`` on the existing object ``object_name``; as the sync client's."""
        return await self._invoke(class_name, object_name, method, args, kwargs, timeout, None)

    async def _invoke(self, class_name: str, object_name: str, method: str,
                      args: tuple[Any, ...], kwargs: dict[str, Any], timeout: float | None,
                      create: tuple[tuple[Any, ...], dict[str, Any]] | None,
                      consistency: str | None = None,
                      follow: tuple[str, str] | None = None) -> Any:
        request = core.invoke_request(class_name, object_name, method, args, kwargs, timeout,
                                      create)
        request.session = await self.session()
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
                resp = await self._call(
                    "Invoke", request,
                    rpc_timeout=core.rpc_deadline(timeout, DEADLINE_MARGIN, MAX_RPC_DEADLINE),
                    cap=None if timeout is None else start + timeout + self._retry_timeout,
                    on_retry=refresh_ack, follow=follow)
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

    async def _follow(self, class_name: str, object_name: str, method: str,
                      args: tuple[Any, ...], kwargs: dict[str, Any], argument: str, key: str,
                      timeout: float | None,
                      create: tuple[tuple[Any, ...], dict[str, Any]] | None,
                      consistency: str | None = None) -> AsyncIterator[Any]:
        """As the sync client's ``_follow``: the answers of a followed reader, for ever."""
        kwargs = dict(kwargs)
        while True:
            following, value = await self._invoke(class_name, object_name, method, args,
                                                  kwargs, timeout, create, consistency,
                                                  (argument, key))
            try:
                while True:
                    yield value
                    ended = following is None or following.finished
                    moved, cursor = next_cursor(value, key, ended, f"{class_name}.{method}")
                    if moved:
                        kwargs[argument] = cursor
                    if ended:
                        break
                    try:
                        resp = await following.next()
                    except core.Failure as failure:
                        if failure.unresponsive:
                            self._unresponsive(following.stream.address)
                        break
                    self._seen.note(resp)
                    value = convert.from_value(resp.result)
            except SessionExpired as e:
                if not isinstance(e, ClientClosed):
                    self._mark_expired(e, self._session)
                raise
            finally:
                if following is not None:
                    following.close()

    def object(self, class_name: str, name: str, /, *args: Any, **kwargs: Any) -> ObjectProxy:
        """A proxy for the object ``name`` of class ``class_name``, made with these
        constructor arguments by its first call if it does not exist. No round trip: a
        name taken by another class, or by an object made with other constructor arguments
        (those given; the others are not compared), fails each call with AlreadyExists."""
        key = (class_name, name)
        proxy = self._proxies.get(key)
        if proxy is None or proxy._create != (args, kwargs):
            proxy = PROXIES.get(class_name, ObjectProxy)(self, class_name, name,
                                                          (args, kwargs))
            self._proxies[key] = proxy
            while len(self._proxies) > PROXY_CACHE:
                self._proxies.popitem(last=False)
        return proxy

    def queue(self, name: str, **kwargs: Any) -> QueueProxy:
        proxy = self.object("Queue", name, **kwargs)
        assert isinstance(proxy, QueueProxy)
        return proxy

    def lock(self, name: str, **kwargs: Any) -> LockProxy:
        proxy = self.object("Lock", name, **kwargs)
        assert isinstance(proxy, LockProxy)
        return proxy

    def semaphore(self, name: str, **kwargs: Any) -> SemaphoreProxy:
        proxy = self.object("Semaphore", name, **kwargs)
        assert isinstance(proxy, SemaphoreProxy)
        return proxy

    def barrier(self, name: str, **kwargs: Any) -> BarrierProxy:
        proxy = self.object("Barrier", name, **kwargs)
        assert isinstance(proxy, BarrierProxy)
        return proxy

    def double_barrier(self, name: str, **kwargs: Any) -> ObjectProxy:
        return self.object("DoubleBarrier", name, **kwargs)

    def latch(self, name: str, **kwargs: Any) -> ObjectProxy:
        return self.object("CountDownLatch", name, **kwargs)

    def counter(self, name: str, **kwargs: Any) -> ObjectProxy:
        return self.object("Counter", name, **kwargs)

    def election(self, name: str, **kwargs: Any) -> LeaderElectionProxy:
        proxy = self.object("LeaderElection", name, **kwargs)
        assert isinstance(proxy, LeaderElectionProxy)
        return proxy

    def map(self, name: str, **kwargs: Any) -> MapProxy:
        proxy = self.object("Map", name, **kwargs)
        assert isinstance(proxy, MapProxy)
        return proxy

    def rwlock(self, name: str, **kwargs: Any) -> ReadWriteLockProxy:
        proxy = self.object("ReadWriteLock", name, **kwargs)
        assert isinstance(proxy, ReadWriteLockProxy)
        return proxy

    async def delete_object(self, name: str) -> None:
        for key in [k for k in self._proxies if k[1] == name]:
            del self._proxies[key]
        await self._call("DeleteObject", pb.DeleteObjectRequest(object_name=name))

    async def register_class(self, source: str) -> dict[str, int]:
        resp = await self._call("RegisterClass", pb.RegisterClassRequest(source=source))
        return {c.name: c.version for c in resp.classes}

    async def auth(self, op: str, **args: Any) -> Any:
        request = pb.AuthRequest(op=op)
        convert.fill_map(request.args, args)
        return convert.from_value((await self._call("Auth", request)).result)

    @property
    def applied_index(self) -> int:
        """The highest log index seen in an answer: sequential reads reflect at least it."""
        return self._seen.index

    def _read_options(self, consistency: str | None) -> Any:
        return core.read_options(core.consistency_setting(consistency, self._consistency),
                                 self._seen)

    async def list_objects(self, *, prefix: str = "", class_name: str = "",
                           limit: int | None = None,
                           consistency: str | None = None) -> list[dict[str, Any]]:
        """The live objects in name order, filtered and limited as
        ``gesmas.client.Client.list_objects`` (page after page; each page a read)."""
        return [o async for o in self.iter_objects(prefix=prefix, class_name=class_name,
                                                   limit=limit, consistency=consistency)]

    def iter_objects(self, *, prefix: str = "", class_name: str = "",
                     limit: int | None = None, page_size: int = core.DEFAULT_PAGE,
                     consistency: str | None = None) -> AsyncIterator[dict[str, Any]]:
        """``async for o in c.iter_objects(...)``: the objects ``list_objects`` gives, one
        page (``page_size`` objects, default 1,000, at most 10,000) fetched at a time, as
        ``gesmas.client.Client.iter_objects``."""
        size = core.page_size(limit, page_size)            # checked now, not at the first await
        return self._pages(prefix, class_name, limit, size, consistency)

    async def _pages(self, prefix: str, class_name: str, left: int | None, size: int,
                     consistency: str | None) -> AsyncIterator[dict[str, Any]]:
        token = ""
        while left != 0:
            resp = await self._call("ListObjects", pb.ListObjectsRequest(
                prefix=prefix, class_name=class_name, page_token=token,
                limit=size if left is None else min(size, left),
                read=self._read_options(consistency)))
            for o in resp.objects:
                if left is not None:
                    if left == 0:          # a server before paging answers every object
                        return
                    left -= 1
                yield {"name": o.name, "class_name": o.class_name,
                       "class_version": o.class_version, "waiters": o.waiters}
            token = resp.next_page_token
            if not token:
                return

    async def list_classes(self, *, consistency: str | None = None) -> dict[str, int]:
        """{class name: newest version} (a read)."""
        resp = await self._call("ListClasses", pb.ListClassesRequest(
            read=self._read_options(consistency)))
        return {c.name: c.version for c in resp.classes}

    async def get_class(self, name: str, version: int | None = None, *,
                        consistency: str | None = None) -> dict[str, Any]:
        """{"name", "version", "source"} of a class (a read)."""
        request = pb.GetClassRequest(name=name, read=self._read_options(consistency))
        if version is not None:
            request.version = version
        resp = await self._call("GetClass", request)
        return {"name": resp.name, "version": resp.version, "source": resp.source}

    async def status(self, *, consistency: str | None = None) -> dict[str, Any]:
        """The answering replica's Status (a read, as ``list_objects``)."""
        address, resp = await self._send("Status", pb.StatusRequest(
            read=self._read_options(consistency)))
        return {"address": address, "leader_address": resp.leader_address,
                "is_leader": resp.is_leader, "term": resp.term,
                "commit_index": resp.commit_index, "last_applied": resp.last_applied,
                "object_count": resp.object_count, "waiter_count": resp.waiter_count,
                "session_count": resp.session_count, "applied_index": resp.applied_index}

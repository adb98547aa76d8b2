"""A tooz driver: ``gesmas://[user:password@]host:port,host:port?timeout=30&tls_ca=ca.pem``.

Registered under tooz's ``tooz.backends`` entry point (``pip install gesmas[tooz]``):

    coord = tooz.coordination.get_coordinator("gesmas://127.0.0.1:7101,127.0.0.1:7102",
                                              b"member-1")
    coord.start(start_heart=True)

Mapping onto gesmas (the server does the waiting; the classes are in objects/group.py):

- The coordinator is one gesmas session whose lease is ``timeout`` seconds (default 30).
  tooz's ``heartbeat()`` *is* the session keep-alive: the driver's client sends none on its
  own, so a coordinator that stops heart-beating loses its session after ``timeout`` and with
  it its locks, group memberships and leadership (``start(start_heart=True)`` beats for you).
- Locks are ``SharedLock`` objects named ``tooz.lock.<name>``, held by (session, lock
  instance): blocking acquires wait server-side, FIFO, bounded by the call timeout.
- Groups are ``Group`` objects named ``tooz.group.<id>``; elections are ``Election`` objects
  named ``tooz.election.<id>``. ``run_watchers(timeout)`` with a timeout and nothing to report
  long-polls the server (Group.changes / Election.campaign) instead of returning at once.

URL options: ``timeout`` (session lease, s), ``retry_timeout`` (how long a call keeps retrying
while no replica answers, default 5 s), ``route`` (leader|replica), ``consistency``
(linearizable|sequential: that of get_members, get_leader and the other reads; README
"Reads"), ``tls_ca``, ``tls_cert``,
``tls_key`` (PEM files: TLS, as ``Client(tls=TLS(...))``), ``tls`` (true: TLS with the
environment's files or the system's roots; false: plain text). A login is the URL's
``user:password@`` (percent-encoded; a user without a password takes GESMAS_PASSWORD). What
the URL leaves out comes from the GESMAS_* environment, as for ``Client()``. The address
list the client dials is the URL's hosts only, never its credentials.
"""
from __future__ import annotations

import contextlib
import datetime
import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

import tooz
from tooz import coordination, locking, utils

from urllib.parse import unquote

from gesmas.client import core, errors
from gesmas.client.client import Client
from gesmas.client.security import TLS
from gesmas.v1 import gesmas_pb2 as pb

GROUP_PREFIX = "tooz.group."
ELECTION_PREFIX = "tooz.election."
LOCK_PREFIX = "tooz.lock."


def _name(value: bytes | str) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return str(value)


def _bytes(value: str) -> bytes:
    return value.encode("utf-8", "surrogateescape")


def _dump(capabilities: Any) -> bytes | None:
    """Capabilities travel as msgpack bytes (tooz.utils.dumps, as the redis driver stores
    them), so any value tooz accepts round-trips; b"" (join_group's default) is none."""
    return None if capabilities == b"" else utils.dumps(capabilities)


def _load(stored: bytes | None) -> Any:
    return None if stored is None else utils.loads(stored)


def _time(seconds: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)


def _option(options: dict[str, Any], key: str, default: Any) -> Any:
    value = options.get(key)
    if isinstance(value, list):
        value = value[-1] if value else None
    return default if value is None else value


def url_login(netloc: str) -> tuple[str, str | None, str | None]:
    """(hosts, user, password) of a URL's ``[user[:password]@]host:port,...``; the password
    of a user given without one is GESMAS_PASSWORD's (Client's default), hence None here."""
    userinfo, at, hosts = netloc.rpartition("@")
    if not at:
        return hosts, None, None
    user, colon, password = userinfo.partition(":")
    if not user:
        raise ValueError("gesmas URL: a password without a user name before '@'")
    return hosts, unquote(user), unquote(password) if colon else None


def url_tls(options: dict[str, Any]) -> TLS | bool | None:
    """``Client(tls=...)`` from the URL options tls_ca, tls_cert, tls_key and tls."""
    files = {k: _option(options, f"tls_{k}", None) for k in ("ca", "cert", "key")}
    flag = _option(options, "tls", None)
    if flag is not None:
        words = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
        if str(flag).lower() not in words:
            raise ValueError(f"gesmas URL: tls={flag!r}: say true or false")
        flag = words[str(flag).lower()]
    if any(files.values()):
        if flag is False:
            raise ValueError("gesmas URL: tls=false with tls_ca, tls_cert or tls_key")
        return TLS(ca=files["ca"], cert=files["cert"], key=files["key"])
    return flag


class _HeartbeatClient(Client):
    """A Client whose session is kept alive only by explicit `beat()` calls (tooz's
    heartbeat), not by a background thread."""

    def _keepalive_loop(self, lease: Any, schedule: Any) -> None:
        return

    def beat(self) -> float:
        session = self.session
        sent = time.monotonic()
        resp = self._call("KeepAlive", pb.KeepAliveRequest(
            session=session, session_secret=self._session_secret), keepalive=True)
        lease = self._lease
        if lease is not None and lease.session == session:
            lease.acknowledged(sent, resp.ttl, lease.interval, lease.deadline,
                               time.monotonic())
        return float(resp.ttl or self._granted_ttl)


class _Result(coordination.CoordAsyncResult[Any]):
    """The calls run synchronously: the result (or the error) is ready when returned."""

    def __init__(self, fn: Any, *args: Any) -> None:
        self._value: Any = None
        self._error: BaseException | None = None
        try:
            self._value = fn(*args)
        except BaseException as e:  # noqa: B036 - re-raised by get()
            self._error = e

    def get(self, timeout: float | None = None) -> Any:
        if self._error is not None:
            raise self._error
        return self._value

    def done(self) -> bool:
        return True


@contextlib.contextmanager
def _translated(group_id: bytes | None = None, member_id: bytes | None = None) -> Iterator[None]:
    try:
        yield
    except errors.NotFound as e:
        if group_id is not None:
            raise coordination.GroupNotCreated(group_id) from e
        raise tooz.ToozError(str(e)) from e
    except errors.ApplicationError as e:
        if e.type == "MemberAlreadyExist":
            raise coordination.MemberAlreadyExist(group_id or b"", member_id or b"") from e
        if e.type == "MemberNotJoined":
            raise coordination.MemberNotJoined(group_id or b"", member_id or b"") from e
        if e.type == "GroupNotEmpty":
            raise coordination.GroupNotEmpty(group_id or b"") from e
        raise tooz.ToozError(str(e)) from e
    except (errors.Unavailable, errors.SessionExpired, errors.Unauthenticated) as e:
        raise coordination.ToozConnectionError(str(e)) from e
    except errors.Timeout as e:
        raise coordination.OperationTimedOut(str(e)) from e
    except errors.GesmasError as e:
        raise tooz.ToozError(str(e)) from e


class GesmasLock(locking.Lock):
    def __init__(self, driver: GesmasDriver, name: bytes) -> None:
        super().__init__(name)
        self._driver = driver
        self._object = LOCK_PREFIX + _name(name)
        self._token = uuid.uuid4().hex

    def _call(self, method: str, *args: Any, timeout: float | None = None) -> Any:
        client = self._driver._require_client()
        with _translated():
            return getattr(client.object("SharedLock", self._object), method)(
                *args, timeout=timeout)

    def acquire(self, blocking: bool | float = True, shared: bool = False,
                timeout: float | None = None) -> bool:
        if blocking is False:
            return bool(self._call("acquire", self._token, shared, False, timeout=0))
        wait = timeout
        if blocking is not True:
            wait = float(blocking)
        try:
            return bool(self._call("acquire", self._token, shared, True, timeout=wait))
        except coordination.OperationTimedOut:
            return False

    def release(self) -> bool:
        return bool(self._call("release", self._token))

    def break_(self) -> bool:
        return bool(self._call("break_"))

    def heartbeat(self) -> bool:
        if not self._call("is_owner", self._token):
            return False
        self._driver.heartbeat()
        return True

    def is_still_owner(self) -> bool:
        return bool(self._call("is_owner", self._token))


class GesmasDriver(coordination.CoordinationDriverCachedRunWatchers):
    """tooz coordinator on a gesmas cluster; see the module docstring."""

    CHARACTERISTICS = (
        coordination.Characteristics.DISTRIBUTED_ACROSS_THREADS,
        coordination.Characteristics.DISTRIBUTED_ACROSS_PROCESSES,
        coordination.Characteristics.DISTRIBUTED_ACROSS_HOSTS,
        coordination.Characteristics.LINEARIZABLE,
        coordination.Characteristics.SERIALIZABLE,
        coordination.Characteristics.SAME_VIEW_UNDER_PARTITIONS,
    )

    def __init__(self, member_id: bytes, parsed_url: Any, options: dict[str, Any]) -> None:
        super().__init__(member_id, parsed_url, options)
        self._cluster, self._user, self._password = url_login(parsed_url.netloc)
        self._tls = url_tls(options)
        if self._user is not None and self._password is None:
            self._password = os.environ.get("GESMAS_PASSWORD")
            if self._password is None:
                raise ValueError(f"gesmas URL: user {self._user!r} without a password (give "
                                 "user:password@, or GESMAS_PASSWORD)")
        self.timeout = float(_option(options, "timeout", 30.0))
        self.retry_timeout = float(_option(options, "retry_timeout", 5.0))
        self.route = str(_option(options, "route", "leader"))
        self.consistency = str(_option(options, "consistency", "linearizable"))
        core.consistency_setting(self.consistency)       # a bad value fails here, named
        self._client: _HeartbeatClient | None = None
        self._leading: set[bytes] = set()
        self._versions: dict[bytes, int] = {}

    # --- lifecycle -------------------------------------------------------------------------

    def _start(self) -> None:
        try:
            self._client = _HeartbeatClient(self._cluster, session_ttl=self.timeout,
                                            retry_timeout=self.retry_timeout, route=self.route,
                                            consistency=self.consistency, tls=self._tls, user=self._user,
                                            password=self._password)
        except (errors.GesmasError, ValueError) as e:
            raise coordination.ToozConnectionError(str(e)) from e
        self._leading = set()
        self._versions = {}
        self._group_members.clear()

    def _stop(self) -> None:
        client, self._client = self._client, None
        self._leading = set()
        if client is not None:
            client.close()

    def _require_client(self) -> _HeartbeatClient:
        client = self._client
        if client is None:
            raise tooz.ToozError("the coordinator is not started")
        return client

    def heartbeat(self) -> float:
        client = self._require_client()
        with _translated():
            ttl = client.beat()
        return max(ttl / 3.0, 0.05)

    # --- groups ----------------------------------------------------------------------------

    def _group(self, method: str, group_id: bytes, *args: Any,
               timeout: float | None = None) -> Any:
        client = self._require_client()
        return client.invoke("Group", GROUP_PREFIX + _name(group_id), method, *args,
                             timeout=timeout)

    def create_group(self, group_id: bytes) -> coordination.CoordAsyncResult[None]:
        def create() -> None:
            client = self._require_client()
            with _translated(group_id):
                if not client.object("Group", GROUP_PREFIX + _name(group_id)).claim():
                    raise coordination.GroupAlreadyExist(group_id)
        return _Result(create)

    def get_groups(self) -> coordination.CoordAsyncResult[list[bytes]]:
        def groups() -> list[bytes]:
            client = self._require_client()
            with _translated():
                return [_bytes(o["name"][len(GROUP_PREFIX):]) for o in client.list_objects(
                        prefix=GROUP_PREFIX, class_name="Group")]
        return _Result(groups)

    def join_group(self, group_id: bytes, capabilities: Any = b"") -> \
            coordination.CoordAsyncResult[None]:
        def join() -> None:
            with _translated(group_id, self._member_id):
                self._group("join", group_id, _name(self._member_id), _dump(capabilities))
            self._joined_groups.add(group_id)
        return _Result(join)

    def leave_group(self, group_id: bytes) -> coordination.CoordAsyncResult[None]:
        def leave() -> None:
            try:
                with _translated(group_id, self._member_id):
                    self._group("leave", group_id, _name(self._member_id))
            finally:
                self._joined_groups.discard(group_id)
        return _Result(leave)

    def delete_group(self, group_id: bytes) -> coordination.CoordAsyncResult[None]:
        def delete() -> None:
            client = self._require_client()
            with _translated(group_id):
                self._group("check_empty", group_id)
                client.delete_object(GROUP_PREFIX + _name(group_id))
        return _Result(delete)

    def _destroy_group(self, group_id: bytes) -> None:
        client = self._require_client()
        with _translated(group_id):
            client.delete_object(GROUP_PREFIX + _name(group_id))

    def get_members(self, group_id: bytes) -> coordination.CoordAsyncResult[set[bytes]]:
        def members() -> set[bytes]:
            with _translated(group_id):
                return {_bytes(m) for m in self._group("members", group_id)}
        return _Result(members)

    def get_member_capabilities(self, group_id: bytes, member_id: bytes) -> \
            coordination.CoordAsyncResult[Any]:
        def caps() -> Any:
            with _translated(group_id, member_id):
                return _load(self._group("member", group_id, _name(member_id))["capabilities"])
        return _Result(caps)

    def get_members_with_capabilities(self, group_id: bytes) -> \
            coordination.CoordAsyncResult[dict[bytes, Any]]:
        def caps() -> dict[bytes, Any]:
            with _translated(group_id):
                return {_bytes(m): _load(c) for m, c in
                        self._group("members_caps", group_id).items()}
        return _Result(caps)

    def get_member_info(self, group_id: bytes, member_id: bytes) -> \
            coordination.CoordAsyncResult[dict[str, Any]]:
        def info() -> dict[str, Any]:
            with _translated(group_id, member_id):
                info = self._group("member", group_id, _name(member_id))
            return {"capabilities": _load(info["capabilities"]),
                    "created_at": _time(info["created_at"]),
                    "updated_at": _time(info["updated_at"])}
        return _Result(info)

    def update_capabilities(self, group_id: bytes, capabilities: Any) -> \
            coordination.CoordAsyncResult[None]:
        def update() -> None:
            with _translated(group_id, self._member_id):
                self._group("update", group_id, _name(self._member_id), _dump(capabilities))
        return _Result(update)

    # --- watchers and elections ------------------------------------------------------------

    def watch_join_group(self, group_id: bytes, callback: Any) -> None:
        self._check_group(group_id)
        super().watch_join_group(group_id, callback)

    def watch_leave_group(self, group_id: bytes, callback: Any) -> None:
        self._check_group(group_id)
        super().watch_leave_group(group_id, callback)

    def _check_group(self, group_id: bytes) -> None:
        with _translated(group_id):
            self._versions.setdefault(group_id, self._group("changes", group_id, -1)["version"])

    def _election(self, method: str, group_id: bytes, *args: Any,
                  timeout: float | None = None) -> Any:
        client = self._require_client()
        with _translated(group_id):
            proxy = client.object("Election", ELECTION_PREFIX + _name(group_id))
            return getattr(proxy, method)(*args, timeout=timeout)

    def get_leader(self, group_id: bytes) -> coordination.CoordAsyncResult[bytes]:
        def leader() -> Any:                   # None while nobody leads (as other drivers)
            value = self._election("leader", group_id)
            return None if value is None else _bytes(value)
        return _Result(leader)

    def stand_down_group_leader(self, group_id: bytes) -> bool:
        self._leading.discard(group_id)
        return bool(self._election("resign", group_id, _name(self._member_id)))

    def run_watchers(self, timeout: float | None = None) -> list[Any]:
        result = self._run_group_watchers(timeout)
        result.extend(self._run_elections(timeout if not result else 0))
        return result

    def _run_group_watchers(self, timeout: float | None) -> list[Any]:
        watched = set(self._hooks_join_group) | set(self._hooks_leave_group)
        if not (timeout and len(watched) == 1 and not self._hooks_elected_leader):
            return super().run_watchers()
        # Nothing else to watch: the server holds the call until the group changes (a change
        # that the cache already knows, say a join and its leave, makes no event: wait again).
        (group_id,) = watched
        deadline = time.monotonic() + timeout
        while True:
            try:
                with _translated(group_id):
                    seen = self._group("changes", group_id, self._versions.get(group_id, -1),
                                       timeout=max(deadline - time.monotonic(), 0.0))
                self._versions[group_id] = seen["version"]
            except (coordination.OperationTimedOut, coordination.GroupNotCreated):
                return super().run_watchers()
            result = super().run_watchers()
            if result or time.monotonic() >= deadline:
                return result

    def _run_elections(self, timeout: float | None) -> list[Any]:
        result: list[Any] = []
        me = _name(self._member_id)
        for group_id, hooks in list(self._hooks_elected_leader.items()):
            if group_id in self._leading:
                continue
            if timeout and len(self._hooks_elected_leader) == 1:
                try:
                    elected = self._election("campaign", group_id, me, timeout=timeout)
                except coordination.OperationTimedOut:
                    elected = False
            else:
                elected = self._election("try_campaign", group_id, me)
            if elected:
                self._leading.add(group_id)
                result.extend(hooks.run(coordination.LeaderElected(group_id,
                                                                   self._member_id)))
        return result

    def unwatch_elected_as_leader(self, group_id: bytes, callback: Any) -> None:
        super().unwatch_elected_as_leader(group_id, callback)
        if group_id not in self._hooks_elected_leader and group_id in self._leading:
            self.stand_down_group_leader(group_id)

    # --- locks -----------------------------------------------------------------------------

    def get_lock(self, name: bytes) -> GesmasLock:
        return GesmasLock(self, name)


__all__ = ["GesmasDriver", "GesmasLock"]

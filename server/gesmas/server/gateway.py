"""The gRPC servicer: authenticate, validate, build a command or a read, await its answer,
convert the reply.

Nothing here decides anything. An RPC that changes the replicated state becomes one command
through the Raft log, proposed by `Node.call`, which resolves when this replica applies the
command and the kernel answers under the call's tag; only the replica that accepted a call
answers it. An RPC that only reads (ListObjects, ListClasses, GetClass, Status) is no log
entry: `_read` runs a function of the kernel on this replica's applied state through
`Node.read`, with the consistency the request asks for (README "Reads"). Every successful
answer carries the log index of the state it reflects (`applied_index`; `_reflects`).
A declared reader (a Map's get or watch...) runs the same way, in reader_calls.py.

Authentication happens here, authorization in the kernel: `_caller` reads the caller's token
("authorization: Bearer ...", tokens.py) or, under mutual TLS, its certificate's common name,
and every command carries that user; the kernel checks it against the replicated users and
roles (kernel/auth.py), for a read too (`Queries.answer` gets the user). Passwords are hashed
here before a user_add/user_passwd enters the log.

A log entry costs every replica (an fsync, the apply), so **every request that becomes a log
entry needs a login when auth is on** (`_user`), checked here before anything is proposed: a
missing login, a token revoked (its user deleted, or its password changed: tokens.py binds a
token to its user record) and a certificate naming no user are refused against this
replica's applied users, after it has applied what it knows to be committed
(`Node.catch_up`). The kernel checks again, at the entry's place in the log. What stays open
without a login commits nothing:

- Authenticate checks the password against this replica's applied record first; only a
  caller who gave a correct password gets the read through the log that confirms it (a login
  costs one entry, and at most two scrypt checks run at a time);
- Status without a digest gives the counts (a read, no log entry); its digest needs a login
  and, with auth on, the admin permission (it hashes the whole state);
- KeepAlive (the session's secret is its credential) is answered by the leader's memory;
- health checks and server reflection are grpc's own services.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import TYPE_CHECKING, Any

import grpc

from gesmas.protocol import values
from gesmas.v1 import gesmas_pb2 as pb
from gesmas.v1 import gesmas_pb2_grpc as pb_grpc

from . import backup, reader_calls, streams, tokens, wire
from .calls import CallFailed
from .config import MAX_MESSAGE
from .kernel import auth, codec, queries
from .kernel.errors import Code, Error, KernelError
from .reader_calls import ReaderCalls
from .reader_calls import read_options as _read_options
from .reader_calls import reflects as _reflects
from .reader_calls import saw as _saw

if TYPE_CHECKING:  # pragma: no cover
    from .node import Node

log = logging.getLogger(__name__)

MAX_NAME = 256

def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _invalid(message: str) -> CallFailed:
    return CallFailed(Error(Code.INVALID_ARGUMENT, message))


def _name(kind: str, value: str) -> str:
    if not value or len(value) > MAX_NAME:
        raise _invalid(f"{kind} must be 1 to {MAX_NAME} characters, got {len(value)}")
    return value


def _address(kind: str, value: str) -> str:
    """A "host:port" address as the replicas spell it (no scheme, port 1..65535)."""
    host, sep, port = value.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 \
            or "/" in host or " " in host:
        raise _invalid(f"{kind} must be host:port, got {value!r}")
    return value.strip()


def _unauthenticated(message: str) -> CallFailed:
    return CallFailed(Error(Code.UNAUTHENTICATED, message, "Unauthenticated"))


class Gateway(pb_grpc.GesmasServicer):
    def __init__(self, node: Node) -> None:
        self.node = node
        self.tokens = tokens.Tokens(node.config.secret or "")
        self._password_checks = asyncio.Semaphore(2)   # scrypt is costly: 2 at a time
        # checked for an unknown user too, so that the answer's timing does not tell
        self._no_user_hash = tokens.hash_password(os.urandom(16).hex())
        self.stream_calls = 0       # calls in flight on all Calls streams (streams.py)
        # ... at most this many (unary calls have their own bound, grpclimits)
        self.max_stream_calls = getattr(node.config, "max_stream_calls", 150_000)
        self.stopping = asyncio.Event()     # the replica stops: Calls streams end (streams.py)
        self.readers = ReaderCalls(node, self.stopping)    # declared readers, off the log

    # -- authentication ----------------------------------------------------------------------

    async def _caller(self, context: Any) -> str:
        """The authenticated caller: the user of its token, else of its client certificate,
        else "" (nobody). A token must still stand for its user record and, with auth on, a
        certificate must name a user, both as this replica has applied the users."""
        token = ""
        for key, value in context.invocation_metadata() or ():
            if key == "authorization" and isinstance(value, str):
                scheme, _, token = value.partition(" ")
                if scheme.lower() != "bearer" or not token:
                    raise _unauthenticated("authorization metadata must be 'Bearer <token>'")
        if token:
            try:
                claims = self.tokens.verify(token)
            except tokens.TokenError as e:
                raise _unauthenticated(str(e)) from None
            if self.tokens.revoked(claims, self.node.password_hash(claims.user)):
                await self.node.catch_up()       # issued for a record not applied here yet?
                reason = self.tokens.revoked(claims, self.node.password_hash(claims.user))
                if reason:
                    raise _unauthenticated(reason)
            return claims.user
        if self.node.config.tls_client_ca:
            names = (context.auth_context() or {}).get("x509_common_name") or []
            if names:
                name = names[0].decode("utf-8", "replace")
                if name.startswith("@"):
                    raise _unauthenticated(f"certificate name {name!r} is not a user name")
                if self.node.auth_enabled() and self.node.password_hash(name) is None:
                    await self.node.catch_up()
                    if self.node.password_hash(name) is None and \
                            await self._answer(context, self._cmd(
                                codec.Auth, op="credentials", args={"name": name},
                                user=auth.SYSTEM)) is None:
                        # asked through the log (a replica may lag more than catch_up waits;
                        # the cluster's CA vouched for this caller, so a log read is fair)
                        raise _unauthenticated(f"user {name!r} does not exist (the name of "
                                               "the client certificate): ask an admin to add it")
                return name
        return ""

    async def _user(self, context: Any) -> str:
        """The caller of a request that becomes a log entry: with auth on (as this replica has
        applied it), one without a login is refused before anything is proposed. A replica
        that has not caught up with the log once since it started cannot tell whether auth
        is on yet: it proposes nothing for a caller without a login, it says UNAVAILABLE.
        (One that lags later may still propose such a request; the kernel refuses it.)"""
        user = await self._caller(context)
        if not user and not self.node.auth_enabled() and not self.node.caught_up_once():
            await self.node.catch_up()
            if not self.node.auth_enabled() and not self.node.caught_up_once():
                raise CallFailed(Error(
                    Code.UNAVAILABLE, "this replica has not caught up with the log, so it "
                    "cannot tell yet whether this cluster needs a login; retry (or another "
                    "replica)", "NotCaughtUp"))
        return self._logged_in(user)

    def _logged_in(self, user: str, needs: str = "this request") -> str:
        if user:
            return user
        if self.node.auth_enabled():
            raise _unauthenticated(
                f"{needs} needs a login: this cluster has auth enabled (Authenticate with a "
                "user name and password and send 'authorization: Bearer <token>', or present "
                "a client certificate)")
        if self.node.requires_auth():
            raise CallFailed(Error(Code.UNAVAILABLE, "this replica serves only authenticated "
                                   "calls and the cluster has not enabled auth yet (its root "
                                   "user is being bootstrapped); retry", "AuthPending"))
        return ""

    async def _password_matches(self, password: str, stored: str | None) -> bool:
        """scrypt, two at a time; checked against a throw-away hash for an unknown user too,
        so that the answer's timing does not tell."""
        async with self._password_checks:
            matches = await asyncio.get_running_loop().run_in_executor(
                None, tokens.check_password, password,
                self._no_user_hash if stored is None else stored)
        return stored is not None and matches

    async def Authenticate(self, request: Any, context: Any) -> Any:
        return await self._guard(context, self._authenticate, request)

    async def _authenticate(self, request: Any, context: Any) -> Any:
        """Check the password against this replica's applied record: a wrong one is refused
        without a log entry (once this replica has applied what it knows to be committed, so
        that a user just added elsewhere is found). A right one is confirmed through the log
        (the record may have changed since this replica applied it) and the token is bound to
        the record the log holds."""
        name, password = request.user, request.password
        if not name or len(name) > 64 or len(password) > 1024:
            raise _unauthenticated("wrong user name or password")
        stored = self.node.password_hash(name)
        if not await self._password_matches(password, stored):
            await self.node.catch_up()
            newer = self.node.password_hash(name)
            if newer == stored or not await self._password_matches(password, newer):
                if not self.node.is_current():
                    # a replica that has not heard a leader or lags behind its commit index
                    # (starting, electing, catching up) may not know this user yet
                    raise CallFailed(Error(Code.UNAVAILABLE, "this replica is catching up "
                                           "with the log and cannot check this login yet; "
                                           "retry", "CatchingUp"))
                raise _unauthenticated("wrong user name or password")
            stored = newer
        creds = await self._answer(context, self._cmd(
            codec.Auth, op="credentials", args={"name": name}, user=auth.SYSTEM))
        if creds is None or (creds["hash"] != stored
                             and not await self._password_matches(password, creds["hash"])):
            raise _unauthenticated("wrong user name or password")
        return pb.AuthenticateResponse(
            token=self.tokens.issue(name, creds["gen"], creds["hash"]), ttl=self.tokens.ttl)

    async def Auth(self, request: Any, context: Any) -> Any:
        return await self._guard(context, self._auth, request)

    async def _auth(self, request: Any, context: Any) -> Any:
        user = await self._user(context)
        if request.op not in auth.CLIENT_OPS:
            raise _invalid(f"unknown auth operation {request.op!r} (operations: "
                           f"{', '.join(sorted(auth.CLIENT_OPS))})")
        args = values.from_value_map(request.args)
        if request.op in ("user_add", "user_passwd"):
            password = args.pop("password", None)
            if not isinstance(password, str) or not 8 <= len(password) <= 1024:
                raise _invalid("password must be a string of 8 to 1024 characters")
            args["hash"] = await asyncio.get_running_loop().run_in_executor(
                None, tokens.hash_password, password)
        value = await self._answer(context, self._cmd(codec.Auth, op=request.op, args=args,
                                                      user=user))
        return pb.AuthResponse(result=values.to_value(value, "result"))

    async def _answer(self, context: grpc.aio.ServicerContext, cmd: codec.Command) -> Any:
        """Propose `cmd` and return the kernel's value, or abort the RPC with its error."""
        c, index = await self.node.call(cmd)
        if c.error is not None:
            raise CallFailed(c.error)
        _saw(index)
        return c.value

    async def _read(self, request: Any, fn: Any) -> Any:
        """`fn(kernel)` on this replica's applied state, as the request's ReadOptions ask
        (no log entry); its value, or the RPC fails with its error."""
        consistency, min_index = _read_options(request)
        value, index = await self.node.read(fn, consistency, min_index)
        _saw(index)
        return value

    async def _abort(self, context: grpc.aio.ServicerContext, error: Error,
                     leader_hint: str = "", request: Any = None) -> None:
        if log.isEnabledFor(logging.INFO):
            log.info("call failed: %s session=%s seq=%s %s", type(request).__name__,
                     getattr(request, "session", "-"), getattr(request, "seq", "-"), error)
        status, details, trailers = wire.error_to_status(error, leader_hint)
        context.set_trailing_metadata(trailers)
        await context.abort(status, details)

    def _cmd(self, cls: type[codec.Command], **fields: Any) -> codec.Command:
        return cls(ts=time.time(), tag=self.node.new_tag(), **fields)

    # -- sessions ------------------------------------------------------------------------------

    async def OpenSession(self, request: Any, context: Any) -> Any:
        return await self._guard(context, self._open_session, request)

    async def _open_session(self, request: Any, context: Any) -> Any:
        ttl = request.ttl or self.node.config.default_ttl
        if not 0 < ttl <= 3600:
            raise _invalid(f"ttl must be in (0, 3600] seconds, not {ttl}")
        user = await self._user(context)
        secret = os.urandom(16).hex()
        sid = await self._answer(context, self._cmd(codec.OpenSession, ttl=ttl, secret=secret,
                                                    user=user))
        return pb.OpenSessionResponse(session=sid, ttl=ttl, session_secret=secret,
                                      leader=self.node.leader_client_addr() or "")

    async def KeepAlive(self, request: Any, context: Any) -> Any:
        return await self._guard(context, self._keep_alive, request)

    async def _keep_alive(self, request: Any, context: Any) -> Any:
        ttl = self.node.keep_alive(request.session, request.session_secret)
        _saw(self.node.applied_index())
        return pb.KeepAliveResponse(ttl=ttl)

    async def CloseSession(self, request: Any, context: Any) -> Any:
        return await self._guard(context, self._close_session, request)

    async def _close_session(self, request: Any, context: Any) -> Any:
        user = await self._user(context)
        await self._answer(context, self._cmd(codec.CloseSession, session=request.session,
                                              secret=request.session_secret, user=user))
        return pb.CloseSessionResponse()

    # -- calls ---------------------------------------------------------------------------------

    async def Invoke(self, request: Any, context: Any) -> Any:
        return await self._guard(context, self._invoke, request)

    async def _invoke(self, request: Any, context: Any) -> Any:
        _reflects.set(0)
        if request.seq < 1:
            raise _invalid(f"seq must be >= 1, not {request.seq}")
        if not 0 <= request.ack < request.seq:       # the kernel checks it too (log path)
            raise _invalid(f"ack must be in [0, seq), not {request.ack} (seq {request.seq})")
        timeout = request.timeout if request.HasField("timeout") else None
        if timeout is not None and not timeout >= 0:
            raise _invalid(f"timeout must be >= 0, not {timeout}")
        if request.create and not request.class_name:
            raise _invalid("create=true needs the class_name of the object to create")
        user = await self._user(context)
        name = _name("object_name", request.object_name)
        method = _name("method", request.method)
        k = self.node.kernel
        if k is not None and k.is_reader(name, method):     # a hint: read() checks again
            args = values.from_values(request.args)
            kwargs = values.from_value_map(request.kwargs)
            try:
                result = await self.readers.answer(request, user, name, method, args,
                                                   kwargs, timeout)
                return pb.InvokeResponse(result=result, applied_index=_reflects.get())
            except CallFailed as e:
                if not (request.create and e.error.code == Code.NOT_FOUND):
                    raise                        # gone since: get-or-create through the log
        cmd = self._cmd(
            codec.Invoke, session=request.session, seq=request.seq, ack=request.ack,
            class_name=request.class_name, name=_name("object_name", request.object_name),
            method=_name("method", request.method),
            args=values.from_values(request.args), kwargs=values.from_value_map(request.kwargs),
            timeout=timeout, secret=request.session_secret, user=user,
            create=request.create, ctor_args=values.from_values(request.ctor_args),
            ctor_kwargs=values.from_value_map(request.ctor_kwargs), measured=request.create)
        started = time.perf_counter()
        try:
            value = await self._answer(context, cmd)
        finally:        # a withdrawn call is no duration (thousands end at once with a stream)
            if self.node.metrics is not None and not _cancelling():
                self.node.metrics.invoked(request.class_name or "?", request.method,
                                          time.perf_counter() - started)
        return pb.InvokeResponse(result=values.to_value(value, "result"),
                                 applied_index=_reflects.get())

    async def follow(self, request: Any, context: Any, follow: Any) -> tuple[Any, Any]:
        """A Call with `follow` (streams.CallStream): the first answer of a declared reader,
        as `_invoke` gives it (a get-or-create goes through the log), and the async iterator
        of the further ones, each from the previous answer's cursor (ReaderCalls.follow),
        for ever; it ends with CallFailed."""
        argument, key = reader_calls.follow_names(follow)
        name = _name("object_name", request.object_name)
        method = _name("method", request.method)
        k = self.node.kernel
        if k is None or not k.declares_reader(name, request.class_name, method):
            raise _invalid(f"follow: {name!r}.{method} is not a declared reader (or the "
                           "object does not exist and class_name names no class): only a "
                           "reader's answers can be followed")
        first = await self._invoke(request, context)
        user = await self._user(context)
        timeout = request.timeout if request.HasField("timeout") else None
        return first, self.readers.follow(request, user, name, method, argument, key, timeout,
                                          values.from_value(first.result))

    async def Calls(self, request_iterator: Any, context: Any) -> None:
        """Invocations as messages on one stream (streams.py)."""
        await streams.CallStream(self, context, 2 * MAX_MESSAGE).serve()

    async def CreateObject(self, request: Any, context: Any) -> Any:
        return await self._guard(context, self._create_object, request)

    async def _create_object(self, request: Any, context: Any) -> Any:
        user = await self._user(context)
        cmd = self._cmd(
            codec.CreateObject, session=request.session,
            class_name=_name("class_name", request.class_name),
            name=_name("object_name", request.object_name),
            args=values.from_values(request.args), kwargs=values.from_value_map(request.kwargs),
            secret=request.session_secret, user=user, measured=True)
        value = await self._answer(context, cmd)
        return pb.CreateObjectResponse(created=bool(value["created"]))

    async def DeleteObject(self, request: Any, context: Any) -> Any:
        return await self._guard(context, self._delete_object, request)

    async def _delete_object(self, request: Any, context: Any) -> Any:
        user = await self._user(context)
        await self._answer(context, self._cmd(
            codec.DeleteObject, name=_name("object_name", request.object_name), user=user))
        return pb.DeleteObjectResponse()

    # -- classes -------------------------------------------------------------------------------

    async def RegisterClass(self, request: Any, context: Any) -> Any:
        return await self._guard(context, self._register_class, request)

    async def _register_class(self, request: Any, context: Any) -> Any:
        if not request.source.strip():
            raise _invalid("class source is empty")
        user = await self._user(context)
        value = await self._answer(context, self._cmd(codec.RegisterClass,
                                                      source=request.source, user=user))
        return pb.RegisterClassResponse(classes=[
            pb.ClassInfo(name=n, version=v) for n, v in sorted(value.items())])

    async def ListClasses(self, request: Any, context: Any) -> Any:
        return await self._guard(context, self._list_classes, request)

    async def _list_classes(self, request: Any, context: Any) -> Any:
        user = await self._user(context)
        value = await self._read(request, lambda k: k.queries.answer("classes", None, user))
        return pb.ListClassesResponse(classes=[
            pb.ClassInfo(name=c["name"], version=c["version"])
            for c in sorted(value, key=lambda c: c["name"])])

    async def GetClass(self, request: Any, context: Any) -> Any:
        return await self._guard(context, self._get_class, request)

    async def _get_class(self, request: Any, context: Any) -> Any:
        version = request.version if request.HasField("version") else None
        name = _name("name", request.name)
        user = await self._user(context)
        value = await self._read(request, lambda k: k.queries.answer("class", [name, version],
                                                                     user))
        return pb.GetClassResponse(name=value["name"], version=value["version"],
                                   source=value["source"])

    async def ListObjects(self, request: Any, context: Any) -> Any:
        return await self._guard(context, self._list_objects, request)

    async def _list_objects(self, request: Any, context: Any) -> Any:
        """One page, in name order, from the names the kernel keeps sorted (no sort here);
        the kernel checks the limit and the strings, naming the field it refuses."""
        user = await self._user(context)
        after, prefix, class_name, limit = (request.page_token, request.prefix,
                                            request.class_name, request.limit)
        try:                                      # refused before a read index is asked
            queries.page_limit(limit)
        except KernelError as e:
            raise CallFailed(e.error) from None
        value = await self._read(request, lambda k: k.queries.objects_page(
            user, after=after, prefix=prefix, class_name=class_name, limit=limit))
        return pb.ListObjectsResponse(objects=[
            pb.ObjectInfo(name=o["name"], class_name=o["class"], class_version=o["version"],
                          waiters=o["waiters"]) for o in value["objects"]],
            next_page_token=value["next"])

    # -- status --------------------------------------------------------------------------------

    async def Status(self, request: Any, context: Any) -> Any:
        return await self._guard(context, self._status, request)

    async def _status(self, request: Any, context: Any) -> Any:
        """A read (no log entry) of the counts, as StatusRequest.read asks; this replica's
        view of the cluster besides. Without a login: the counts only (even with auth on).
        The digest needs a login and, with auth on, the admin permission: it hashes the
        whole state."""
        user = await self._caller(context)
        with_digest = request.with_digest
        if with_digest:
            user = self._logged_in(user, "Status with_digest (it hashes the whole state)")

        def read(k: Any) -> tuple[dict[str, Any], str]:
            stats = k.queries.answer("stats", None, user) if user else queries.stats(k)
            if not with_digest:
                return stats, ""
            k.auth.check(user, "admin", "")
            return stats, k.queries.answer("digest", None, user)
        stats, digest = await self._read(request, read)
        st = self.node.status()
        return pb.StatusResponse(
            node_id=st["node_id"], leader_address=st["leader_address"] or "",
            is_leader=st["is_leader"], term=st["term"], commit_index=st["commit_index"],
            last_applied=st["last_applied"],
            nodes=[pb.NodeHealth(node_id=n["node_id"], address=n["address"],
                                 connected=n["connected"], match_index=n["match_index"])
                   for n in st["nodes"]],
            object_count=stats["objects"], waiter_count=stats["waiters"],
            session_count=stats["sessions"], state_digest=digest, rejoining=st["rejoining"])

    # -- membership (admin) ----------------------------------------------------------------

    async def AddNode(self, request: Any, context: Any) -> Any:
        return await self._guard(context, self._add_node, request)

    async def _add_node(self, request: Any, context: Any) -> Any:
        raft = _address("raft_addr", request.raft_addr)
        client = _address("client_addr", request.client_addr) if request.client_addr else ""
        await self._check_admin(context)
        changed = await self.node.change_membership(True, raft, client)
        return pb.AddNodeResponse(changed=changed)

    async def RemoveNode(self, request: Any, context: Any) -> Any:
        return await self._guard(context, self._remove_node, request)

    async def _remove_node(self, request: Any, context: Any) -> Any:
        raft = _address("raft_addr", request.raft_addr)
        await self._check_admin(context)
        changed = await self.node.change_membership(False, raft)
        return pb.RemoveNodeResponse(changed=changed)

    async def _check_admin(self, context: Any) -> None:
        """Membership is not kernel state, but who may change it is: ask the log."""
        await self._answer(context, self._cmd(codec.Auth, op="check_admin",
                                              user=await self._user(context)))

    # -- backups (admin) -----------------------------------------------------------------------

    async def Backup(self, request: Any, context: Any) -> None:
        await self._guard(context, self._backup, request)

    async def _backup(self, request: Any, context: Any) -> Any:
        """A checkpoint at a fresh log index K and the digest of the state there, streamed
        (backup.py); the admin permission first. Returns an empty message for _guard."""
        await self._check_admin(context)
        index, blob, digest, fmt = await self.node.backups.take(self.node)
        _saw(index)
        st = self.node.status()
        for chunk in backup.messages(index, blob, digest, fmt,
                                     [n["node_id"] for n in st["nodes"]], st["node_id"]):
            await context.write(chunk)
        return pb.BackupChunk()

    # -- errors --------------------------------------------------------------------------------

    async def _guard(self, context: Any, handler: Any, request: Any) -> Any:
        """Run `handler`; turn gesmas failures into the documented status codes."""
        metrics = self.node.metrics
        started = time.perf_counter() if metrics is not None else 0.0
        code: str | None = None
        _reflects.set(0)
        try:
            response = await handler(request, context)
            index = _reflects.get()
            if index:
                response.applied_index = index
            return response
        except CallFailed as e:
            code = e.error.code.name
            await self._abort(context, e.error, e.leader_hint, request)
        except (ValueError, TypeError) as e:     # a value the wire conversion refused
            code = Code.INVALID_ARGUMENT.name
            await self._abort(context, Error(Code.INVALID_ARGUMENT, str(e)), "", request)
        finally:
            if metrics is not None:
                metrics.observe(handler.__name__.lstrip("_"), started, code)

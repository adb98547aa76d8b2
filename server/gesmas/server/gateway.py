"""The gRPC servicer: authenticate, validate, build a command, await its completion, convert
the reply.

Nothing here decides anything: every RPC becomes one command through the Raft log (reads
too), proposed by `Node.call`, which resolves when this replica applies the command and the
kernel answers under the call's tag. Only the replica that accepted a call answers it.

Authentication happens here, authorization in the kernel: `_user` reads the caller's token
("authorization: Bearer ...", tokens.py) or, under mutual TLS, its certificate's common name,
and every command carries that user; the kernel checks it against the replicated users and
roles (kernel/auth.py). Passwords are checked here against the hash the log holds, read
through the log, and hashed here before a user_add/user_passwd enters it.
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

from . import streams, tokens, wire
from .calls import CallFailed
from .config import MAX_MESSAGE
from .kernel import auth, codec
from .kernel.errors import Code, Error

if TYPE_CHECKING:  # pragma: no cover
    from .node import Node

log = logging.getLogger(__name__)

MAX_NAME = 256


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

    # -- authentication ----------------------------------------------------------------------

    def _user(self, context: Any) -> str:
        """The authenticated caller: from its token, else its client certificate, else ""
        (nobody; the kernel refuses it when auth is enabled)."""
        token = ""
        for key, value in context.invocation_metadata() or ():
            if key == "authorization" and isinstance(value, str):
                scheme, _, token = value.partition(" ")
                if scheme.lower() != "bearer" or not token:
                    raise _unauthenticated("authorization metadata must be 'Bearer <token>'")
        if token:
            try:
                user, gen = self.tokens.verify(token)
            except tokens.TokenError as e:
                raise _unauthenticated(str(e)) from None
            known = self.node.user_generation(user)
            if known is not None and known > gen:
                raise _unauthenticated(f"token of {user!r} revoked (password changed): "
                                       "authenticate again")
            return user
        if self.node.config.tls_client_ca:
            names = (context.auth_context() or {}).get("x509_common_name") or []
            if names:
                name = names[0].decode("utf-8", "replace")
                if name.startswith("@"):
                    raise _unauthenticated(f"certificate name {name!r} is not a user name")
                return name
        if self.node.requires_auth():
            raise CallFailed(Error(Code.UNAVAILABLE, "this replica serves only authenticated "
                                   "calls and the cluster has not enabled auth yet (its root "
                                   "user is being bootstrapped); retry", "AuthPending"))
        return ""

    async def Authenticate(self, request: Any, context: Any) -> Any:
        return await self._guard(context, self._authenticate, request)

    async def _authenticate(self, request: Any, context: Any) -> Any:
        name = request.user
        if not name or len(name) > 64 or len(request.password) > 1024:
            raise _unauthenticated("wrong user name or password")
        creds = await self._answer(context, self._cmd(
            codec.Auth, op="credentials", args={"name": name}, user=auth.SYSTEM))
        stored = creds["hash"] if creds is not None else self._no_user_hash
        async with self._password_checks:
            matches = await asyncio.get_running_loop().run_in_executor(
                None, tokens.check_password, request.password, stored)
        if creds is None or not matches:
            raise _unauthenticated("wrong user name or password")
        return pb.AuthenticateResponse(token=self.tokens.issue(name, creds["gen"]),
                                       ttl=self.tokens.ttl)

    async def Auth(self, request: Any, context: Any) -> Any:
        return await self._guard(context, self._auth, request)

    async def _auth(self, request: Any, context: Any) -> Any:
        user = self._user(context)
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
        c = await self.node.call(cmd)
        if c.error is not None:
            raise CallFailed(c.error)
        return c.value

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
        secret = os.urandom(16).hex()
        sid = await self._answer(context, self._cmd(codec.OpenSession, ttl=ttl, secret=secret,
                                                    user=self._user(context)))
        return pb.OpenSessionResponse(session=sid, ttl=ttl, session_secret=secret,
                                      leader=self.node.leader_client_addr() or "")

    async def KeepAlive(self, request: Any, context: Any) -> Any:
        return await self._guard(context, self._keep_alive, request)

    async def _keep_alive(self, request: Any, context: Any) -> Any:
        ttl = self.node.keep_alive(request.session, request.session_secret)
        return pb.KeepAliveResponse(ttl=ttl)

    async def CloseSession(self, request: Any, context: Any) -> Any:
        return await self._guard(context, self._close_session, request)

    async def _close_session(self, request: Any, context: Any) -> Any:
        await self._answer(context, self._cmd(codec.CloseSession, session=request.session,
                                              secret=request.session_secret,
                                              user=self._user(context)))
        return pb.CloseSessionResponse()

    # -- calls ---------------------------------------------------------------------------------

    async def Invoke(self, request: Any, context: Any) -> Any:
        return await self._guard(context, self._invoke, request)

    async def _invoke(self, request: Any, context: Any) -> Any:
        if request.seq < 1:
            raise _invalid(f"seq must be >= 1, not {request.seq}")
        timeout = request.timeout if request.HasField("timeout") else None
        if timeout is not None and not timeout >= 0:
            raise _invalid(f"timeout must be >= 0, not {timeout}")
        if request.create and not request.class_name:
            raise _invalid("create=true needs the class_name of the object to create")
        cmd = self._cmd(
            codec.Invoke, session=request.session, seq=request.seq, ack=request.ack,
            class_name=request.class_name, name=_name("object_name", request.object_name),
            method=_name("method", request.method),
            args=values.from_values(request.args), kwargs=values.from_value_map(request.kwargs),
            timeout=timeout, secret=request.session_secret, user=self._user(context),
            create=request.create, ctor_args=values.from_values(request.ctor_args),
            ctor_kwargs=values.from_value_map(request.ctor_kwargs))
        started = time.perf_counter()
        try:
            value = await self._answer(context, cmd)
        finally:
            if self.node.metrics is not None:
                self.node.metrics.invoked(request.class_name or "?", request.method,
                                          time.perf_counter() - started)
        return pb.InvokeResponse(result=values.to_value(value, "result"))

    async def Calls(self, request_iterator: Any, context: Any) -> None:
        """Invocations as messages on one stream (streams.py)."""
        await streams.CallStream(self, context, 2 * MAX_MESSAGE).serve()

    async def CreateObject(self, request: Any, context: Any) -> Any:
        return await self._guard(context, self._create_object, request)

    async def _create_object(self, request: Any, context: Any) -> Any:
        cmd = self._cmd(
            codec.CreateObject, session=request.session,
            class_name=_name("class_name", request.class_name),
            name=_name("object_name", request.object_name),
            args=values.from_values(request.args), kwargs=values.from_value_map(request.kwargs),
            secret=request.session_secret, user=self._user(context))
        value = await self._answer(context, cmd)
        return pb.CreateObjectResponse(created=bool(value["created"]))

    async def DeleteObject(self, request: Any, context: Any) -> Any:
        return await self._guard(context, self._delete_object, request)

    async def _delete_object(self, request: Any, context: Any) -> Any:
        await self._answer(context, self._cmd(
            codec.DeleteObject, name=_name("object_name", request.object_name),
            user=self._user(context)))
        return pb.DeleteObjectResponse()

    # -- classes -------------------------------------------------------------------------------

    async def RegisterClass(self, request: Any, context: Any) -> Any:
        return await self._guard(context, self._register_class, request)

    async def _register_class(self, request: Any, context: Any) -> Any:
        if not request.source.strip():
            raise _invalid("class source is empty")
        value = await self._answer(context, self._cmd(codec.RegisterClass,
                                                      source=request.source,
                                                      user=self._user(context)))
        return pb.RegisterClassResponse(classes=[
            pb.ClassInfo(name=n, version=v) for n, v in sorted(value.items())])

    async def ListClasses(self, request: Any, context: Any) -> Any:
        return await self._guard(context, self._list_classes, request)

    async def _list_classes(self, request: Any, context: Any) -> Any:
        value = await self._answer(context, self._cmd(codec.Query, what="classes",
                                                      user=self._user(context)))
        return pb.ListClassesResponse(classes=[
            pb.ClassInfo(name=c["name"], version=c["version"])
            for c in sorted(value, key=lambda c: c["name"])])

    async def GetClass(self, request: Any, context: Any) -> Any:
        return await self._guard(context, self._get_class, request)

    async def _get_class(self, request: Any, context: Any) -> Any:
        version = request.version if request.HasField("version") else None
        value = await self._answer(context, self._cmd(
            codec.Query, what="class", arg=[_name("name", request.name), version],
            user=self._user(context)))
        return pb.GetClassResponse(name=value["name"], version=value["version"],
                                   source=value["source"])

    async def ListObjects(self, request: Any, context: Any) -> Any:
        return await self._guard(context, self._list_objects, request)

    async def _list_objects(self, request: Any, context: Any) -> Any:
        value = await self._answer(context, self._cmd(codec.Query, what="objects",
                                                      user=self._user(context)))
        return pb.ListObjectsResponse(objects=[
            pb.ObjectInfo(name=o["name"], class_name=o["class"], class_version=o["version"],
                          waiters=o["waiters"])
            for o in sorted(value, key=lambda o: o["name"])])

    # -- status --------------------------------------------------------------------------------

    async def Status(self, request: Any, context: Any) -> Any:
        return await self._guard(context, self._status, request)

    async def _status(self, request: Any, context: Any) -> Any:
        stats = await self._answer(context, self._cmd(codec.Query, what="stats"))
        digest = ""
        if request.with_digest:
            digest = await self._answer(context, self._cmd(codec.Query, what="digest"))
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
                                              user=self._user(context)))

    # -- errors --------------------------------------------------------------------------------

    async def _guard(self, context: Any, handler: Any, request: Any) -> Any:
        """Run `handler`; turn gesmas failures into the documented status codes."""
        metrics = self.node.metrics
        started = time.perf_counter() if metrics is not None else 0.0
        code: str | None = None
        try:
            return await handler(request, context)
        except CallFailed as e:
            code = e.error.code.name
            await self._abort(context, e.error, e.leader_hint, request)
        except (ValueError, TypeError) as e:     # a value the wire conversion refused
            code = Code.INVALID_ARGUMENT.name
            await self._abort(context, Error(Code.INVALID_ARGUMENT, str(e)), "", request)
        finally:
            if metrics is not None:
                metrics.observe(handler.__name__.lstrip("_"), started, code)

"""The exceptions a gesmas client raises: one class per error code of the wire contract.

A failed RPC carries a gRPC status code and, in its trailing metadata under
``gesmas-error-bin``, a serialized ``gesmas.v1.ErrorDetail`` (code, message, type,
leader_hint). ``error_from_rpc`` turns a ``grpc.RpcError`` into the matching
``GesmasError`` subclass, reading the detail when present and falling back to the gRPC
status code when not (transport failures, proxies): e.g. UNAVAILABLE -> ``Unavailable``.

    GesmasError
    ├── NotFound            unknown class, object, method or session
    ├── InvalidArgument     bad arguments, bad class source
    ├── Timeout             a wait reached its deadline (also a TimeoutError)
    │   ├── QueueEmpty      a Queue's consume or reserve timed out (also queue.Empty)
    │   └── QueueFull       a bounded Queue's produce timed out (also queue.Full)
    ├── Aborted             interrupted: object deleted, ...
    │   └── SessionExpired  the session expired or was closed; open a new one
    ├── ApplicationError    the method raised; its type name is ``.type``
    ├── Unavailable         no leader / replica not ready; ``.leader_hint`` may say where
    ├── ResourceExhausted   step budget, payload or waiter limits
    ├── AlreadyExists       the object exists with another class
    ├── Internal            a bug in gesmas (also: unknown or unexpected status codes)
    ├── Unauthenticated     no valid credentials (auth is enabled): log in
    └── PermissionDenied    the user may not do this, or the session is not its own

This module mirrors ``gesmas.server.kernel.errors`` but must not import the server; what both
sides share is in ``gesmas.protocol``.
"""
from __future__ import annotations

import builtins
import queue
import threading
from typing import Any, ClassVar

import grpc

from gesmas.protocol.errors import ERROR_METADATA_KEY, SESSION_EXPIRED_TYPE
from gesmas.v1 import gesmas_pb2 as pb

__all__ = [
    "ERROR_CLASSES",
    "ERROR_METADATA_KEY",
    "SESSION_EXPIRED_TYPE",
    "Aborted",
    "AlreadyExists",
    "ApplicationError",
    "Compacted",
    "GesmasError",
    "Internal",
    "InvalidArgument",
    "NotFound",
    "PermissionDenied",
    "QueueEmpty",
    "QueueFull",
    "Replaced",
    "Unauthenticated",
    "ResourceExhausted",
    "SessionExpired",
    "Timeout",
    "Unavailable",
    "error_from_detail",
    "error_from_rpc",
    "queue_timeout",
]


class GesmasError(Exception):
    """Base of all gesmas errors.

    Attributes: ``code`` (int, a ``gesmas.v1.ErrorCode`` number), ``message`` (one line),
    ``type`` (the remote exception type for ApplicationError, the reason for Aborted, else
    usually empty) and ``leader_hint`` (the leader's address for Unavailable, else empty).
    """

    code: ClassVar[int] = pb.ERROR_CODE_INTERNAL

    def __init__(self, message: str = "", type: str = "", leader_hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.type = type
        self.leader_hint = leader_hint

    @property
    def code_name(self) -> str:
        """The code's name without prefix, e.g. ``"NOT_FOUND"``."""
        name: str = pb.ErrorCode.Name(self.code)
        return name.removeprefix("ERROR_CODE_")

    def __str__(self) -> str:
        head = self.code_name
        if self.type:
            head += f" ({self.type})"
        text = f"{head}: {self.message}"
        if self.leader_hint:
            text += f" [leader: {self.leader_hint}]"
        return text

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(message={self.message!r}, type={self.type!r}, "
            f"leader_hint={self.leader_hint!r})"
        )

    def __reduce__(self) -> tuple[Any, ...]:  # keep the attributes through pickling
        return (type(self), (self.message, self.type, self.leader_hint))


class NotFound(GesmasError):
    """Unknown class, class version, object, method or session."""

    code = pb.ERROR_CODE_NOT_FOUND


class InvalidArgument(GesmasError):
    """Bad arguments, bad class source, or a malformed request."""

    code = pb.ERROR_CODE_INVALID_ARGUMENT


class Timeout(GesmasError, TimeoutError):
    """A wait reached its deadline (gRPC DEADLINE_EXCEEDED). Also a ``TimeoutError``, as
    ``concurrent.futures`` and ``asyncio`` time out."""

    code = pb.ERROR_CODE_TIMEOUT


class QueueEmpty(Timeout, queue.Empty):
    """A Queue's ``consume`` (or ``reserve``) found no item in time: also ``queue.Empty``,
    which ``queue.Queue.get(timeout=...)`` raises."""


class QueueFull(Timeout, queue.Full):
    """A bounded Queue's ``produce`` found no room in time: also ``queue.Full``, which
    ``queue.Queue.put(timeout=...)`` raises."""


def queue_timeout(method: str, error: Timeout) -> Timeout:
    """The Timeout a Queue's ``method`` raises for ``error``: QueueEmpty for the calls that
    wait for an item, QueueFull for the one that waits for room, else ``error`` itself."""
    cls = {"consume": QueueEmpty, "reserve": QueueEmpty, "produce": QueueFull}.get(method)
    if cls is None or isinstance(error, cls):
        return error
    return cls(error.message, error.type, error.leader_hint)


class Aborted(GesmasError):
    """The call was interrupted, e.g. its object was deleted; ``type`` gives the reason."""

    code = pb.ERROR_CODE_ABORTED


class SessionExpired(Aborted):
    """The caller's session expired or was closed: it cannot be used again."""


class ApplicationError(GesmasError):
    """The remote method raised; ``type`` is the exception's type name, e.g. ``"ValueError"``.
    A result of the call, not a server failure."""

    code = pb.ERROR_CODE_APPLICATION


class Unavailable(GesmasError):
    """No leader, replica not ready, or the server could not be reached; retry, preferably
    at ``leader_hint`` when it is set."""

    code = pb.ERROR_CODE_UNAVAILABLE


class ResourceExhausted(GesmasError):
    """A limit was hit: step budget, payload size, number of waiters or results."""

    code = pb.ERROR_CODE_RESOURCE_EXHAUSTED


class AlreadyExists(GesmasError):
    """The object already exists with another class."""

    code = pb.ERROR_CODE_ALREADY_EXISTS


class Internal(GesmasError):
    """A bug in gesmas itself, or a failure the client cannot classify."""

    code = pb.ERROR_CODE_INTERNAL


class Unauthenticated(GesmasError):
    """The cluster has authentication enabled and the call carried no valid credentials
    (no token, an expired or revoked one, a deleted user, a wrong password)."""

    code = pb.ERROR_CODE_UNAUTHENTICATED


class PermissionDenied(GesmasError):
    """The authenticated user may not do this (its roles give no such permission), or the
    session named in the call belongs to another client (wrong session secret)."""

    code = pb.ERROR_CODE_PERMISSION_DENIED


#: ErrorCode number -> exception class (ERROR_CODE_OK has none).
ERROR_CLASSES: dict[int, type[GesmasError]] = {
    cls.code: cls
    for cls in (
        NotFound,
        InvalidArgument,
        Timeout,
        Aborted,
        ApplicationError,
        Unavailable,
        ResourceExhausted,
        AlreadyExists,
        Internal,
        Unauthenticated,
        PermissionDenied,
    )
}

# Used only when a failed RPC has no (readable) ErrorDetail.
_STATUS_CLASSES: dict[grpc.StatusCode, type[GesmasError]] = {
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.OUT_OF_RANGE: InvalidArgument,
    grpc.StatusCode.DEADLINE_EXCEEDED: Timeout,  # also the client's own gRPC deadline
    grpc.StatusCode.ABORTED: Aborted,
    grpc.StatusCode.CANCELLED: Aborted,
    grpc.StatusCode.FAILED_PRECONDITION: ApplicationError,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.INTERNAL: Internal,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
}


# Where Python has a convention, a remote exception is also catchable as the built-in one:
# ``except ValueError`` catches a method's ValueError, ``except RuntimeError`` a release of a
# lock this session does not hold (as with ``threading.Lock``), ``except
# threading.BrokenBarrierError`` a broken Barrier. Each is a subclass of ApplicationError and
# of the built-in, named Remote<type> (e.g. ``RemoteValueError``).
_PYTHON_BASES: dict[str, type[BaseException]] = {
    name: getattr(builtins, name) for name in (
        "ValueError", "TypeError", "KeyError", "IndexError", "LookupError", "RuntimeError",
        "PermissionError", "ZeroDivisionError", "ArithmeticError", "OverflowError",
        "AttributeError", "NotImplementedError", "AssertionError", "RecursionError")
}
_PYTHON_BASES.update({"LockNotOwned": RuntimeError,
                      "BrokenBarrierError": threading.BrokenBarrierError,
                      "Compacted": LookupError, "Replaced": LookupError})
REMOTE_CLASSES: dict[str, type[ApplicationError]] = {}
for _name, _base in _PYTHON_BASES.items():
    _cls = type(f"Remote{_name}", (ApplicationError, _base),
                {"__module__": __name__, "__doc__": f"A remote {_name}."})
    globals()[_cls.__name__] = REMOTE_CLASSES[_name] = _cls
#: A Map's watch after a revision whose changes it no longer keeps (the message names the
#: oldest revision a watch may start after).
Compacted = REMOTE_CLASSES["Compacted"]
#: A Map's watch given the ``created`` of a map since deleted and made again under its name.
Replaced = REMOTE_CLASSES["Replaced"]


def error_from_detail(detail: pb.ErrorDetail) -> GesmasError:
    """The exception for an ErrorDetail. An ABORTED detail with type ``"SessionExpired"``
    becomes ``SessionExpired``; an APPLICATION detail whose type has a Python counterpart
    one of the REMOTE_CLASSES; an unknown code (or OK) becomes ``Internal``."""
    cls = ERROR_CLASSES.get(detail.code, Internal)
    if cls is Aborted and detail.type == SESSION_EXPIRED_TYPE:
        cls = SessionExpired
    elif cls is ApplicationError:
        cls = REMOTE_CLASSES.get(detail.type, ApplicationError)
    return cls(detail.message, detail.type, detail.leader_hint)


def _detail(rpc_error: grpc.RpcError) -> pb.ErrorDetail | None:
    trailing = getattr(rpc_error, "trailing_metadata", None)
    metadata = trailing() if callable(trailing) else None
    for key, value in metadata or ():
        if key == ERROR_METADATA_KEY:
            detail = pb.ErrorDetail()
            try:
                detail.ParseFromString(value)
            except Exception:  # a corrupt detail: fall back to the status code
                return None
            return detail if detail.code != pb.ERROR_CODE_OK else None
    return None


def error_from_rpc(rpc_error: grpc.RpcError) -> GesmasError:
    """Convert a failed gRPC call (sync or ``grpc.aio``) into a ``GesmasError``. Raise it
    with ``raise error_from_rpc(e) from e`` to keep the gRPC error as the cause."""
    detail = _detail(rpc_error)
    if detail is not None:
        return error_from_detail(detail)
    code_fn = getattr(rpc_error, "code", None)
    status = code_fn() if callable(code_fn) else None
    details_fn = getattr(rpc_error, "details", None)
    message = (details_fn() if callable(details_fn) else None) or str(rpc_error)
    if status is None:  # an RpcError that is not a call outcome: treat as transport
        return Unavailable(message)
    cls = _STATUS_CLASSES.get(status, Internal)
    if cls is Aborted and status is grpc.StatusCode.CANCELLED:
        return cls(message, "Cancelled")
    return cls(message)

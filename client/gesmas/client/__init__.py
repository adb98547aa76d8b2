"""gesmas client library: ``Client``, object proxies and the typed errors.

    from gesmas.client import Client
    with Client("127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103") as c:
        q = c.queue("jobs", capacity=100)
        q.produce(b"job-1")
        item = q.consume(timeout=5.0)
        with c.lock("schema") as fence:
            ...

TLS and a login: ``Client(..., tls=TLS(ca="ca.pem"), user="alice", password=...)``.
"""
from gesmas.client.client import (
    DEFAULT_CLUSTER,
    ClassSource,
    Client,
    ClientClosed,
    NodeHealth,
    ObjectInfo,
    SessionState,
    Status,
)
from gesmas.client.errors import (
    Aborted,
    AlreadyExists,
    ApplicationError,
    Compacted,
    GesmasError,
    Internal,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    QueueEmpty,
    QueueFull,
    Replaced,
    ResourceExhausted,
    SessionExpired,
    Timeout,
    Unauthenticated,
    Unavailable,
)
from gesmas.client.security import TLS
from gesmas.client.map_mirror import MapMirror
from gesmas.client.proxies import (
    Fence,
    LeaderElectionProxy,
    LockProxy,
    MapProxy,
    ObjectProxy,
    QueueProxy,
    ReadWriteLockProxy,
    SemaphoreProxy,
)

__all__ = [
    "DEFAULT_CLUSTER",
    "Aborted",
    "AlreadyExists",
    "ApplicationError",
    "ClassSource",
    "Client",
    "ClientClosed",
    "Compacted",
    "Fence",
    "GesmasError",
    "Internal",
    "InvalidArgument",
    "LeaderElectionProxy",
    "LockProxy",
    "MapMirror",
    "MapProxy",
    "NodeHealth",
    "NotFound",
    "ObjectInfo",
    "ObjectProxy",
    "PermissionDenied",
    "QueueEmpty",
    "QueueFull",
    "QueueProxy",
    "ReadWriteLockProxy",
    "Replaced",
    "ResourceExhausted",
    "SemaphoreProxy",
    "SessionExpired",
    "SessionState",
    "Status",
    "TLS",
    "Timeout",
    "Unauthenticated",
    "Unavailable",
]

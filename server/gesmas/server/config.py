"""A replica's configuration: one frozen object, parsed in one place.

Sources, highest precedence first, the same for every key: command-line flags, the `--config`
JSON file (keys as the flags, with `_` or `-`), environment variables (`GESMAS_<KEY>`, e.g.
`GESMAS_CLIENT_ADDR`, `GESMAS_TLS_CERT`; the secret is `GESMAS_CLUSTER_SECRET`), defaults. `load` checks what it can before
anything starts: the required addresses, unknown keys, types, that there is a cluster secret
(always: the Raft port authenticates every frame with it), and that a client port that is not
loopback has TLS and a root password (or --insecure).
"""
from __future__ import annotations

import functools
import ipaddress
import json
import os
from dataclasses import dataclass
from typing import Any, Mapping

HASH_SEED = "0"                     # PYTHONHASHSEED of every replica (DESIGN §3.3)
MAX_MESSAGE = 16 * 1024 * 1024      # gRPC message size limit, both directions

#: the keys of a --config file, as flag names with '_'
KEYS = ("id", "client_addr", "raft_addr", "peers", "data_dir", "secret", "unsafe_no_fsync",
        "skip_entries", "checkpoint_every", "tls_cert", "tls_key", "tls_client_ca",
        "root_password_file", "insecure", "metrics_addr", "secret_file", "log_format",
        "new_cluster", "runaway_limit", "snapshot_every", "restore",
        "max_stream_calls")


class ConfigError(ValueError):
    """The configuration is unusable; the message says which setting and why."""


@dataclass(frozen=True)
class NodeConfig:
    node_id: int
    client_addr: str                       # host:port of the gRPC gateway
    raft_addr: str                         # host:port of this node's Raft endpoint
    peers: tuple[tuple[str, str], ...]     # (raft addr, client addr or "") of the others
    data_dir: str
    secret: str | None = None
    fsync: bool = True
    default_ttl: float = 10.0
    commit_timeout: float = 5.0            # a proposal not applied by then fails UNAVAILABLE
    checkpoint_every: int = 20_000         # commands between checkpoints
    snapshot_every: int = 20_000           # log entries between snapshots (log compaction)
    max_stream_calls: int = 150_000        # calls in flight on all Calls streams (streams.py)
    duty_period: float = 0.05              # seconds between two rounds of leader duties
    skip_entries: frozenset[int] = frozenset()   # poison log entries (README), all replicas
    tls_cert: str | None = None            # PEM files of the client port's certificate...
    tls_key: str | None = None             # ...and key: TLS on the client port
    tls_client_ca: str | None = None       # CA of client certificates: mutual TLS
    root_password: str | None = None       # bootstraps auth on a new cluster (user root)
    insecure: bool = False                 # allow a non-loopback client port without auth/TLS
    metrics_addr: str | None = None        # host:port of the Prometheus metrics (off: None)
    log_format: str = "text"               # or "json" (logs.py)
    new_cluster: bool = False              # an empty data dir is a new cluster's (rejoin.py)
    runaway_limit: float = 10.0            # CPU seconds one log entry may take; 0: no watchdog
    restore: str | None = None             # a backup file to seed the empty data dir with
    failpoint_native_stall: bool = False   # test only: GESMAS_FAILPOINT_NATIVE_STALL=1


@functools.lru_cache(maxsize=64)
def is_loopback(addr: str) -> bool:
    """Whether the host of "host:port" is a loopback address (127.0.0.0/8, ::1, localhost).
    Cached: a replica asks it of its own address on every call without a login."""
    host = addr.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def require_secret(secret: str | None) -> None:
    """The one rule for the cluster secret: always required, loopback too. Replicas exchange
    pickled messages; every frame is authenticated with the secret before it is read, so
    without one an open Raft port would run anyone's code (any local user's, on loopback)."""
    if not secret:
        raise ConfigError("a cluster secret (--secret or GESMAS_CLUSTER_SECRET) is required: "
                          "the Raft port authenticates every message with it (`gesmas up` "
                          "makes one for a local cluster)")


def read_file(path: str) -> dict[str, Any]:
    """The settings of a --config JSON file, keys normalised to flag names with '_'."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(f"--config {path}: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: expected a JSON object")
    out = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if name not in KEYS:
            raise ConfigError(f"--config {path}: unknown key {key!r}")
        out[name] = value
    return out


def _peers(value: Any) -> tuple[tuple[str, str], ...]:
    if isinstance(value, str):
        value = value.split(",")
    if not isinstance(value, (list, tuple)) or not all(isinstance(p, str) for p in value):
        raise ConfigError("peers must be a list of RAFT=CLIENT strings or one comma-separated "
                          "string")
    pairs = []
    for p in value:
        if p.strip():
            raft, _, client = p.strip().partition("=")
            pairs.append((raft.strip(), client.strip()))
    return tuple(pairs)


def _seconds(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigError(f"{name} must be a number of seconds, not {value!r}")
    try:
        seconds = float(value)
    except ValueError:
        raise ConfigError(f"{name} must be a number of seconds, not {value!r}") from None
    if not 0 <= seconds < float("inf"):
        raise ConfigError(f"{name} must be a number of seconds >= 0, not {value!r}")
    return seconds


def _int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigError(f"{name} must be an integer, not {value!r}")
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"{name} must be an integer, not {value!r}") from None


def _at_least(name: str, value: Any, low: int) -> int:
    n = _int(name, value)
    if n < low:
        raise ConfigError(f"{name} must be at least {low}, not {n}")
    return n


#: environment variable of each key: GESMAS_<KEY>, but for the secret's historic name
ENV = {key: f"GESMAS_{key.upper()}" for key in KEYS} | {"secret": "GESMAS_CLUSTER_SECRET"}
_TRUE = ("1", "true", "yes", "on")
#: test-only failpoint (kernel/failpoints.py), read from the environment only
FAILPOINT_NATIVE_STALL = "GESMAS_FAILPOINT_NATIVE_STALL"


def _id(value: Any) -> int:
    """A node id: an integer, or "from-hostname": the ordinal at the end of the host name
    plus one (a Kubernetes StatefulSet's pod gesmas-2 is node 3)."""
    if value == "from-hostname":
        import socket
        tail = socket.gethostname().rsplit("-", 1)[-1]
        if not tail.isdigit():
            raise ConfigError(f"id from-hostname: the host name {socket.gethostname()!r} "
                              "does not end with -<ordinal>")
        return int(tail) + 1
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"id must be an integer or from-hostname, not {value!r}")
    return value


def load(flags: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> NodeConfig:
    """The configuration from parsed flags (a mapping with the KEYS as names, None or missing
    when not given, plus "config", the file's path) and the environment. Every key has one
    precedence order: the flag, else the --config file, else the environment (ENV), else
    the default."""
    file = read_file(flags["config"]) if flags.get("config") else {}

    def pick(name: str, default: Any = None) -> Any:
        v = flags.get(name)
        if v not in (None, "", []):
            return v
        if name in file:
            return file[name]
        return environ.get(ENV[name]) or default

    def flag(name: str) -> bool:
        v = pick(name, False)
        return v.strip().lower() in _TRUE if isinstance(v, str) else bool(v)

    node_id, client_addr, raft_addr = pick("id"), pick("client_addr"), pick("raft_addr")
    if node_id is None or client_addr is None or raft_addr is None:
        raise ConfigError("--id, --client-addr and --raft-addr are required (or a --config "
                          "file with id, client_addr, raft_addr, peers, data_dir, or "
                          "GESMAS_ID, GESMAS_CLIENT_ADDR, GESMAS_RAFT_ADDR)")
    node_id = _id(node_id)
    # the node itself may be listed (one --peers for every node, as in Kubernetes): dropped
    peers = tuple(p for p in _peers(pick("peers", [])) if p[0] != raft_addr)
    secret = pick("secret") or None
    secret_file = pick("secret_file")
    if not secret and secret_file:
        secret = _read_secret("secret_file", secret_file, 16)
    require_secret(secret)
    tls_cert, tls_key = pick("tls_cert") or None, pick("tls_key") or None
    client_ca = pick("tls_client_ca") or None
    if bool(tls_cert) != bool(tls_key) or (client_ca and not tls_cert):
        raise ConfigError("TLS needs both --tls-cert and --tls-key (and --tls-client-ca only "
                          "with them)")
    for name, path in (("tls_cert", tls_cert), ("tls_key", tls_key),
                       ("tls_client_ca", client_ca)):
        if path and not os.path.isfile(path):
            raise ConfigError(f"{name}: no such file {path!r}")
    root_file = pick("root_password_file") or None
    root_password = _read_secret("root_password_file", root_file, 8) if root_file else None
    insecure = flag("insecure")
    if not is_loopback(str(client_addr)) and not insecure and not (tls_cert and root_password):
        raise ConfigError(
            f"the client port {client_addr} is not loopback: give it TLS (--tls-cert, "
            "--tls-key) and a root password (--root-password-file, which enables auth on a new "
            "cluster), or run it open with --insecure (anyone who reaches the port can do "
            "everything)")
    skip = pick("skip_entries") or ()
    if isinstance(skip, str):
        skip = [x for x in skip.split(",") if x.strip()]
    if not isinstance(skip, (list, tuple)):
        raise ConfigError(f"skip_entries must be a list of log indices, not {skip!r}")
    return NodeConfig(
        node_id=node_id, client_addr=str(client_addr), raft_addr=str(raft_addr), peers=peers,
        data_dir=str(pick("data_dir") or f"gesmas-data-{node_id}"), secret=secret,
        fsync=not flag("unsafe_no_fsync"),
        checkpoint_every=_int("checkpoint_every", pick("checkpoint_every", 20_000)),
        snapshot_every=_at_least("snapshot_every", pick("snapshot_every", 20_000), 100),
        max_stream_calls=_at_least("max_stream_calls", pick("max_stream_calls", 150_000), 1),
        skip_entries=frozenset(_int("skip_entries", i) for i in skip),
        tls_cert=tls_cert, tls_key=tls_key, tls_client_ca=client_ca,
        root_password=root_password, insecure=insecure,
        metrics_addr=pick("metrics_addr") or None,
        log_format=str(pick("log_format") or "text"),
        new_cluster=flag("new_cluster"),
        runaway_limit=_seconds("runaway_limit", pick("runaway_limit", 10.0)),
        restore=str(pick("restore")) if pick("restore") else None,
        failpoint_native_stall=str(environ.get(FAILPOINT_NATIVE_STALL, "")).strip().lower()
        in _TRUE)


def _read_secret(name: str, path: Any, minimum: int) -> str:
    try:
        with open(str(path), encoding="utf-8") as f:
            value = f.read().rstrip("\r\n")
    except OSError as e:
        raise ConfigError(f"{name}: {e}") from None
    if len(value) < minimum:
        raise ConfigError(f"{name}: it must hold at least {minimum} characters")
    return value

"""A replica's configuration: one frozen object, parsed in one place.

Sources, highest precedence first: command-line flags, the `--config` JSON file (keys as the
flags, with `_` or `-`), environment variables (`GESMAS_CLUSTER_SECRET`,
`GESMAS_CHECKPOINT_EVERY`, `GESMAS_TLS_CERT`, `GESMAS_TLS_KEY`, `GESMAS_TLS_CLIENT_CA`,
`GESMAS_ROOT_PASSWORD_FILE`, `GESMAS_INSECURE`), defaults. `load` checks what it can before
anything starts: the required addresses, unknown keys, types, that there is a cluster secret
(always: the Raft port authenticates every frame with it), and that a client port that is not
loopback has TLS and a root password (or --insecure).
"""
from __future__ import annotations

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
        "root_password_file", "insecure", "metrics_addr")


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
    duty_period: float = 0.05              # seconds between two rounds of leader duties
    skip_entries: frozenset[int] = frozenset()   # poison log entries (README), all replicas
    tls_cert: str | None = None            # PEM files of the client port's certificate...
    tls_key: str | None = None             # ...and key: TLS on the client port
    tls_client_ca: str | None = None       # CA of client certificates: mutual TLS
    root_password: str | None = None       # bootstraps auth on a new cluster (user root)
    insecure: bool = False                 # allow a non-loopback client port without auth/TLS
    metrics_addr: str | None = None        # host:port of the Prometheus metrics (off: None)


def is_loopback(addr: str) -> bool:
    """Whether the host of "host:port" is a loopback address (127.0.0.0/8, ::1, localhost)."""
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


def _int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigError(f"{name} must be an integer, not {value!r}")
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"{name} must be an integer, not {value!r}") from None


def load(flags: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> NodeConfig:
    """The configuration from parsed flags (a mapping with the KEYS as names, None or missing
    when not given, plus "config", the file's path) and the environment."""
    file = read_file(flags["config"]) if flags.get("config") else {}

    def pick(name: str, default: Any = None) -> Any:
        v = flags.get(name)
        return v if v not in (None, "", []) else file.get(name, default)

    node_id, client_addr, raft_addr = pick("id"), pick("client_addr"), pick("raft_addr")
    if node_id is None or client_addr is None or raft_addr is None:
        raise ConfigError("--id, --client-addr and --raft-addr are required (or a --config "
                          "file with id, client_addr, raft_addr, peers, data_dir)")
    if isinstance(node_id, bool) or not isinstance(node_id, int):
        raise ConfigError(f"id must be an integer, not {node_id!r}")
    peers = _peers(pick("peers", []))
    secret = pick("secret") or environ.get("GESMAS_CLUSTER_SECRET") or None
    require_secret(secret)
    tls_cert = pick("tls_cert") or environ.get("GESMAS_TLS_CERT") or None
    tls_key = pick("tls_key") or environ.get("GESMAS_TLS_KEY") or None
    client_ca = pick("tls_client_ca") or environ.get("GESMAS_TLS_CLIENT_CA") or None
    if bool(tls_cert) != bool(tls_key) or (client_ca and not tls_cert):
        raise ConfigError("TLS needs both --tls-cert and --tls-key (and --tls-client-ca only "
                          "with them)")
    for name, path in (("tls_cert", tls_cert), ("tls_key", tls_key),
                       ("tls_client_ca", client_ca)):
        if path and not os.path.isfile(path):
            raise ConfigError(f"{name}: no such file {path!r}")
    root_file = pick("root_password_file") or environ.get("GESMAS_ROOT_PASSWORD_FILE") or None
    root_password = None
    if root_file:
        try:
            with open(root_file, encoding="utf-8") as f:
                root_password = f.read().rstrip("\r\n")
        except OSError as e:
            raise ConfigError(f"root_password_file: {e}") from None
        if len(root_password) < 8:
            raise ConfigError("root_password_file: the root password must have at least 8 "
                              "characters")
    insecure = bool(pick("insecure", False)) or environ.get("GESMAS_INSECURE", "") in (
        "1", "true", "yes")
    if not is_loopback(str(client_addr)) and not insecure and not (tls_cert and root_password):
        raise ConfigError(
            f"the client port {client_addr} is not loopback: give it TLS (--tls-cert, "
            "--tls-key) and a root password (--root-password-file, which enables auth on a new "
            "cluster), or run it open with --insecure (anyone who reaches the port can do "
            "everything)")
    skip = pick("skip_entries") or ()
    if not isinstance(skip, (list, tuple)):
        raise ConfigError(f"skip_entries must be a list of log indices, not {skip!r}")
    every = pick("checkpoint_every", environ.get("GESMAS_CHECKPOINT_EVERY") or 20_000)
    return NodeConfig(
        node_id=node_id, client_addr=str(client_addr), raft_addr=str(raft_addr), peers=peers,
        data_dir=str(pick("data_dir") or f"gesmas-data-{node_id}"), secret=secret,
        fsync=not bool(pick("unsafe_no_fsync", False)),
        checkpoint_every=_int("checkpoint_every", every),
        skip_entries=frozenset(_int("skip_entries", i) for i in skip),
        tls_cert=tls_cert, tls_key=tls_key, tls_client_ca=client_ca,
        root_password=root_password, insecure=insecure,
        metrics_addr=pick("metrics_addr") or environ.get("GESMAS_METRICS_ADDR") or None)

"""A replica's configuration: one frozen object, parsed in one place.

Sources, highest precedence first: command-line flags, the `--config` JSON file (keys as the
flags, with `_` or `-`), environment variables (`GESMAS_CLUSTER_SECRET`,
`GESMAS_CHECKPOINT_EVERY`), defaults. `load` checks what it can before anything starts: the
required addresses, unknown keys, types, and that a cluster whose Raft addresses are not all
loopback has a secret.
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
        "skip_entries", "checkpoint_every")


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


def is_loopback(addr: str) -> bool:
    """Whether the host of "host:port" is a loopback address (127.0.0.0/8, ::1, localhost)."""
    host = addr.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def require_secret(secret: str | None, raft_addrs: Any) -> None:
    """The one rule for the cluster secret: required when any Raft address is not loopback."""
    if secret is None and not all(is_loopback(a) for a in raft_addrs):
        raise ConfigError("a cluster secret (--secret or GESMAS_CLUSTER_SECRET; the Replica's "
                          "password) is required when any Raft address is not loopback: "
                          "replicas exchange pickled messages, so an open Raft port would run "
                          "anyone's code")


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
    require_secret(secret, (raft_addr, *(r for r, _ in peers)))
    skip = pick("skip_entries") or ()
    if not isinstance(skip, (list, tuple)):
        raise ConfigError(f"skip_entries must be a list of log indices, not {skip!r}")
    every = pick("checkpoint_every", environ.get("GESMAS_CHECKPOINT_EVERY") or 20_000)
    return NodeConfig(
        node_id=node_id, client_addr=str(client_addr), raft_addr=str(raft_addr), peers=peers,
        data_dir=str(pick("data_dir") or f"gesmas-data-{node_id}"), secret=secret,
        fsync=not bool(pick("unsafe_no_fsync", False)),
        checkpoint_every=_int("checkpoint_every", every),
        skip_entries=frozenset(_int("skip_entries", i) for i in skip))

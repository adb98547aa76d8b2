"""A local cluster of replica processes on 127.0.0.1: `gesmas up`, the tests and the benchmarks.

Each replica is a real `gesmas server` process. `LocalCluster` starts them, waits until a
leader has registered the standard classes, and stops them by pid (SIGTERM, then SIGKILL).
"""
from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from .node import HASH_SEED


def free_ports(n: int) -> list[int]:
    """n distinct ports the OS considers free on 127.0.0.1 right now."""
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


@dataclass
class Member:
    node_id: int
    client_addr: str
    raft_addr: str
    data_dir: str
    log_path: str
    proc: subprocess.Popen[bytes] | None = None


@dataclass
class LocalCluster:
    nodes: int = 3
    base_port: int | None = None          # None: ephemeral ports
    data_dir: str | None = None           # None: a temporary folder, removed on stop
    fsync: bool = True
    secret: str = field(default_factory=lambda: secrets.token_hex(16))
    members: list[Member] = field(default_factory=list)
    _tmp: str | None = None

    def __post_init__(self) -> None:
        if self.data_dir is None:
            self._tmp = tempfile.mkdtemp(prefix="gesmas-")
            self.data_dir = self._tmp
        if self.base_port is None:
            ports = free_ports(2 * self.nodes)
            client, raft = ports[:self.nodes], ports[self.nodes:]
        else:
            client = [self.base_port + i + 1 for i in range(self.nodes)]
            raft = [self.base_port + 100 + i + 1 for i in range(self.nodes)]
        for i in range(self.nodes):
            d = os.path.join(self.data_dir, f"node{i + 1}")
            self.members.append(Member(i + 1, f"127.0.0.1:{client[i]}", f"127.0.0.1:{raft[i]}",
                                       d, os.path.join(self.data_dir, f"node{i + 1}.log")))

    @property
    def addresses(self) -> str:
        return ",".join(m.client_addr for m in self.members)

    def command(self, m: Member) -> list[str]:
        peers = ",".join(f"{o.raft_addr}={o.client_addr}" for o in self.members if o is not m)
        cmd = [sys.executable, "-m", "gesmas.client.cli", "server", "--id", str(m.node_id),
               "--client-addr", m.client_addr, "--raft-addr", m.raft_addr, "--peers", peers,
               "--data-dir", m.data_dir]
        if not self.fsync:
            cmd.append("--unsafe-no-fsync")
        return cmd

    def start_member(self, m: Member) -> None:
        os.makedirs(m.data_dir, exist_ok=True)
        env = dict(os.environ, PYTHONHASHSEED=HASH_SEED, GESMAS_CLUSTER_SECRET=self.secret)
        log = open(m.log_path, "ab")
        m.proc = subprocess.Popen(self.command(m), env=env, stdout=log, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL)
        log.close()

    def start(self, timeout: float = 60.0) -> LocalCluster:
        for m in self.members:
            self.start_member(m)
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until a leader is elected and the standard classes are registered."""
        from gesmas.client import Client, GesmasError
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            for m in self.members:
                if m.proc is not None and m.proc.poll() is not None:
                    raise RuntimeError(f"node {m.node_id} exited with {m.proc.returncode}; "
                                       f"log:\n{self.tail(m)}")
            try:
                with Client(self.addresses, session_ttl=5.0) as c:
                    names = {cls["name"] if isinstance(cls, dict) else cls
                             for cls in _class_names(c.list_classes())}
                    if {"Queue", "Lock", "Counter"} <= names:
                        return
            except (GesmasError, OSError) as e:
                last = e
            time.sleep(0.2)
        raise TimeoutError(f"cluster not ready in {timeout}s: {last}\n" +
                           "\n".join(self.tail(m) for m in self.members))

    def tail(self, m: Member, lines: int = 30) -> str:
        try:
            with open(m.log_path, encoding="utf-8", errors="replace") as f:
                return f"--- node {m.node_id} ---\n" + "".join(f.readlines()[-lines:])
        except OSError:
            return f"--- node {m.node_id}: no log ---"

    def kill(self, m: Member, sig: int = signal.SIGKILL) -> None:
        if m.proc is not None and m.proc.poll() is None:
            os.kill(m.proc.pid, sig)
            if sig in (signal.SIGKILL, signal.SIGTERM):
                m.proc.wait(timeout=30)

    def stop(self) -> None:
        for m in self.members:
            if m.proc is not None and m.proc.poll() is None:
                try:
                    os.kill(m.proc.pid, signal.SIGCONT)
                    os.kill(m.proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for m in self.members:
            if m.proc is not None:
                try:
                    m.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    m.proc.kill()
                    m.proc.wait(timeout=10)
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _class_names(classes: Any) -> list[Any]:
    return list(classes.keys()) if isinstance(classes, dict) else list(classes)


def stop_on_signals() -> None:
    """SIGTERM (and SIGINT, even where a shell started us with it ignored) end the foreground
    wait with KeyboardInterrupt, so that the nodes are stopped on every way out."""
    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)


def run_up(args: Any) -> int:
    """`gesmas up`: a local cluster in the foreground until Ctrl-C."""
    stop_on_signals()
    cluster = LocalCluster(nodes=args.nodes, base_port=args.base_port, data_dir=args.data_dir,
                           fsync=not getattr(args, "unsafe_no_fsync", False))
    print(f"starting {cluster.nodes} gesmas nodes (data in {cluster.data_dir}) ...", flush=True)
    try:
        cluster.start()
        print("cluster ready. Client addresses:", flush=True)
        for m in cluster.members:
            print(f"  node {m.node_id}: {m.client_addr}   (raft {m.raft_addr}, log {m.log_path})")
        print(f"\n  export GESMAS_CLUSTER={cluster.addresses}\n\nCtrl-C stops every node.",
              flush=True)
        while all(m.proc is not None and m.proc.poll() is None for m in cluster.members):
            time.sleep(0.5)
        print("a node exited; stopping the cluster", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nstopping ...", flush=True)
        return 0
    except (RuntimeError, TimeoutError) as e:
        print(f"gesmas up: the cluster did not start: {e}", file=sys.stderr)
        return 1
    finally:
        cluster.stop()

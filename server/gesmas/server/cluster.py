"""A local cluster of replica processes on 127.0.0.1: `gesmas up`, the tests and the benchmarks.

Each replica is a real `gesmas server` process. `LocalCluster` starts them, waits until a
leader has registered the standard classes, and stops them by pid (SIGTERM, then SIGKILL).

The cluster always has a secret (random per LocalCluster). `secure=True` also gives it TLS on
the client ports (a throw-away CA and certificates, certs.py) and auth, bootstrapped with a
random root password (`--root-password-file`); `client_cert_auth=True` makes the client
ports require client certificates (mutual TLS). `client_options()` are the `Client` keyword
arguments that reach such a cluster. GESMAS_TEST_SECURE=1 in the environment makes every
LocalCluster secure and exports the client settings (GESMAS_TLS_CA, GESMAS_USER,
GESMAS_PASSWORD) to this process, so that a whole test suite runs with TLS and auth on.
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
from typing import Any, Callable

from .config import HASH_SEED


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


def tail_log(path: str, label: str, lines: int = 30) -> str:
    """The last `lines` lines of a process log, headed by `label`, for error messages."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f"--- {label} ---\n" + "".join(f.readlines()[-lines:])
    except OSError:
        return f"--- {label}: no log ---"


class StartInterrupted(Exception):
    """`LocalCluster.start(stop=...)` gave up because `stop()` became true."""


class PortInUse(RuntimeError):
    """A port the cluster was told to take is in use on 127.0.0.1."""


def port_in_use(port: int) -> bool:
    """Whether something listens on (or holds) 127.0.0.1:`port` now. SO_REUSEADDR, as the
    servers set it, so that a port left in TIME_WAIT by a stopped replica is not taken for
    one in use."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


#: What a GESMAS_* variable of the environment would make every replica of a local cluster
#: do alike, where each needs its own: it is not passed on (`metrics_base` gives each one a
#: metrics port of its own).
PER_NODE_ENV = ("GESMAS_METRICS_ADDR",)


def stop_by_pid(procs: list[subprocess.Popen[bytes] | None], timeout: float = 10.0) -> None:
    """SIGCONT + SIGTERM every process still running (a SIGSTOPped one could not act on
    SIGTERM), wait for each, SIGKILL what does not exit in time."""
    for p in procs:
        if p is not None and p.poll() is None:
            try:
                os.kill(p.pid, signal.SIGCONT)
                os.kill(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    for p in procs:
        if p is not None:
            try:
                p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=timeout)


@dataclass
class Member:
    node_id: int
    client_addr: str
    raft_addr: str
    data_dir: str
    log_path: str
    proc: subprocess.Popen[bytes] | None = None
    metrics_addr: str = ""                 # with LocalCluster(metrics=True)
    new_cluster: bool = False              # its next start passes --new-cluster (start())


@dataclass
class LocalCluster:
    nodes: int = 3
    base_port: int | None = None          # None: ephemeral ports
    data_dir: str | None = None           # None: a temporary folder, removed on stop
    fsync: bool = True
    secret: str = field(default_factory=lambda: secrets.token_hex(16))
    members: list[Member] = field(default_factory=list)
    _tmp: str | None = None
    env: dict[str, str] = field(default_factory=dict)     # extra environment of the servers
    secure: bool = field(default_factory=lambda: os.environ.get("GESMAS_TEST_SECURE") == "1")
    client_cert_auth: bool = False
    root_password: str = field(default_factory=lambda: secrets.token_urlsafe(18))
    users: tuple[str, ...] = ("root",)                  # client certificates to make
    metrics: bool = False                               # each node serves /metrics
    restore: str | None = None            # a backup file: the first start seeds every replica
    raft_base: int | None = None          # Raft of node i on raft_base + i (0: free; None:
                                          # base_port + 100 + i, free without base_port)
    metrics_base: int | None = None       # /metrics of node i on metrics_base + i (0: free)
    pki: Any = None
    _token: tuple[str, float] | None = field(default=None, repr=False)   # metadata()'s

    def __post_init__(self) -> None:
        if self.data_dir is None:
            self._tmp = tempfile.mkdtemp(prefix="gesmas-")
            self.data_dir = self._tmp
        if self.client_cert_auth:
            self.secure = True
        if self.secure:
            from .certs import make_pki
            self.pki = make_pki(os.path.join(self.data_dir, "pki"), users=self.users)
            path = os.path.join(self.data_dir, "pki", "root-password")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(self.root_password + "\n")
        # every free port in one call: ports from two calls can be the same (the first
        # call's are free again once it returns), which failed a start with "Address
        # already in use" when the metrics port of one node was another's client port
        free = iter(free_ports(3 * self.nodes))
        client, raft = self._ports(free)
        for i in range(self.nodes):
            d = os.path.join(self.data_dir, f"node{i + 1}")
            self.members.append(Member(i + 1, f"127.0.0.1:{client[i]}", f"127.0.0.1:{raft[i]}",
                                       d, os.path.join(self.data_dir, f"node{i + 1}.log")))
        if self.metrics_base:
            for i, m in enumerate(self.members):
                m.metrics_addr = f"127.0.0.1:{self.metrics_base + i + 1}"
        elif self.metrics or self.metrics_base == 0:
            for m in self.members:
                m.metrics_addr = f"127.0.0.1:{next(free)}"

    @property
    def addresses(self) -> str:
        return ",".join(m.client_addr for m in self.members)

    def _ports(self, free: Any) -> tuple[list[int], list[int]]:
        """The client and Raft ports of the replicas: node i (from 1) on base_port + i and
        raft_base + i (without raft_base: base_port + 100 + i); ports from `free` where no
        base is given."""
        n = self.nodes
        client = ([self.base_port + i + 1 for i in range(n)] if self.base_port
                  else [next(free) for _ in range(n)])
        raft_base = self._raft_base()
        raft = ([raft_base + i + 1 for i in range(n)] if raft_base
                else [next(free) for _ in range(n)])
        return client, raft

    def _raft_base(self) -> int | None:
        if self.raft_base is not None:
            return self.raft_base or None              # 0: free ports
        return self.base_port + 100 if self.base_port else None

    def fixed_ports(self) -> list[tuple[int, str]]:
        """(port, what it is for) of every port given by a base rather than picked free."""
        out = []
        raft_fixed = bool(self._raft_base())
        for m in self.members:
            if self.base_port:
                out.append((int(m.client_addr.rpartition(":")[2]),
                            f"the client port of node {m.node_id}"))
            if raft_fixed:
                out.append((int(m.raft_addr.rpartition(":")[2]),
                            f"the Raft port of node {m.node_id}"))
            if self.metrics_base:
                out.append((int(m.metrics_addr.rpartition(":")[2]),
                            f"the metrics port of node {m.node_id}"))
        return out

    def check_ports(self) -> None:
        """PortInUse naming the first fixed port that is taken (a replica would fail on it
        later, and on its Raft port without saying which)."""
        for port, what in self.fixed_ports():
            if port_in_use(port):
                raise PortInUse(f"port {port} ({what}) is in use on 127.0.0.1")

    def peer_raft_addr(self, m: Member, o: Member) -> str:
        """The Raft address by which `m` knows `o` (a test cluster may put a proxy there)."""
        return o.raft_addr

    def command(self, m: Member) -> list[str]:
        peers = ",".join(f"{self.peer_raft_addr(m, o)}={o.client_addr}"
                         for o in self.members if o is not m)
        cmd = [sys.executable, "-m", "gesmas.client.cli", "server", "--id", str(m.node_id),
               "--client-addr", m.client_addr, "--raft-addr", m.raft_addr, "--peers", peers,
               "--data-dir", m.data_dir]
        if not self.fsync:
            cmd.append("--unsafe-no-fsync")
        if m.new_cluster:
            cmd.append("--new-cluster")
            if self.restore:
                cmd += ["--restore", self.restore]
        if m.metrics_addr:
            cmd += ["--metrics-addr", m.metrics_addr]
        if self.secure:
            cmd += ["--tls-cert", self.pki.server_cert, "--tls-key", self.pki.server_key,
                    "--root-password-file", os.path.join(self.data_dir or "", "pki",
                                                         "root-password")]
            if self.client_cert_auth:
                cmd += ["--tls-client-ca", self.pki.ca_cert]
        return cmd

    # -- how clients reach it ----------------------------------------------------------------

    def client_options(self, user: str = "root", password: str | None = None,
                       cert: bool | None = None) -> dict[str, Any]:
        """`Client` keyword arguments for this cluster as `user` (root by default, with the
        bootstrap password; with `cert`, by its client certificate instead of a password)."""
        if not self.secure:
            return {}
        from gesmas.client.security import TLS
        cert = self.client_cert_auth if cert is None else cert
        if cert:
            c, k = self.pki.clients[user]
            return {"tls": TLS(ca=self.pki.ca_cert, cert=c, key=k)}
        c, k = self.pki.clients.get("root", (None, None)) if self.client_cert_auth \
            else (None, None)
        return {"tls": TLS(ca=self.pki.ca_cert, cert=c, key=k), "user": user,
                "password": self.root_password if password is None else password}

    def client_env(self) -> dict[str, str]:
        """The environment that makes `Client()` reach this cluster as root."""
        env = {"GESMAS_CLUSTER": self.addresses}
        if self.secure:
            env.update(GESMAS_TLS_CA=self.pki.ca_cert, GESMAS_USER="root",
                       GESMAS_PASSWORD=self.root_password)
            if self.client_cert_auth:
                c, k = self.pki.clients["root"]
                env.update(GESMAS_TLS_CERT=c, GESMAS_TLS_KEY=k)
        return env

    def channel(self, address: str) -> Any:
        """A raw gRPC channel to `address` (TLS when the cluster has it)."""
        import grpc
        if not self.secure:
            return grpc.insecure_channel(address)
        from gesmas.client.security import TLS
        c, k = self.pki.clients["root"] if self.client_cert_auth else (None, None)
        return grpc.secure_channel(address, TLS(ca=self.pki.ca_cert, cert=c, key=k)
                                   .credentials())

    def metadata(self, channel: Any, timeout: float = 5.0) -> tuple[tuple[str, str], ...]:
        """Call metadata with a root token (auth), or none. The token is kept for half its
        life (any replica accepts it); `forget_token` drops it when a replica refused it."""
        if not self.secure:
            return ()
        now = time.monotonic()
        if self._token is None or now > self._token[1]:
            from gesmas.v1 import gesmas_pb2 as pb
            from gesmas.v1 import gesmas_pb2_grpc as pb_grpc
            r = pb_grpc.GesmasStub(channel).Authenticate(
                pb.AuthenticateRequest(user="root", password=self.root_password),
                timeout=timeout)
            self._token = (r.token, now + r.ttl / 2)
        return (("authorization", f"Bearer {self._token[0]}"),)

    def forget_token(self) -> None:
        self._token = None

    def start_member(self, m: Member) -> None:
        if m.proc is not None and m.proc.poll() is None:
            raise RuntimeError(f"replica {m.node_id} is already running (pid {m.proc.pid})")
        os.makedirs(m.data_dir, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if k not in PER_NODE_ENV}
        env.update(PYTHONHASHSEED=HASH_SEED, GESMAS_CLUSTER_SECRET=self.secret)
        env.update(self.env)
        log = open(m.log_path, "ab")
        m.proc = subprocess.Popen(self.command(m), env=env, stdout=log, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL)
        m.new_cluster = False
        log.close()

    def start(self, timeout: float = 60.0,
              stop: Callable[[], bool] | None = None) -> LocalCluster:
        """Start every replica and wait until the cluster is ready (wait_ready); raises
        StartInterrupted as soon as `stop()` is true (the replicas are left running: stop
        them with stop())."""
        # No replica has data yet: the first start of a new cluster. A replica started on an
        # emptied dir next to others that have data is rejoining (replication/rejoin.py).
        new = not any(os.path.isdir(m.data_dir) and os.listdir(m.data_dir)
                      for m in self.members)
        self.check_ports()
        for m in self.members:
            m.new_cluster = new
            self.start_member(m)
        self.wait_ready(timeout, stop)
        if os.environ.get("GESMAS_TEST_SECURE") == "1":
            os.environ.update(self.client_env())
        return self

    def wait_ready(self, timeout: float = 60.0,
                   stop: Callable[[], bool] | None = None) -> None:
        """Wait until a leader is elected and the standard classes are registered; raise
        StartInterrupted as soon as `stop()` is true."""
        import grpc
        from gesmas.v1 import gesmas_pb2 as pb
        from gesmas.v1 import gesmas_pb2_grpc as pb_grpc
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            for m in self.members:
                if stop is not None and stop():
                    raise StartInterrupted("stop requested while the cluster was starting")
                if m.proc is not None and m.proc.poll() is not None:
                    raise RuntimeError(f"node {m.node_id} exited with {m.proc.returncode}; "
                                       f"log:\n{self.tail(m)}")
                with self.channel(m.client_addr) as channel:
                    try:
                        names = {c.name for c in pb_grpc.GesmasStub(channel).ListClasses(
                            pb.ListClassesRequest(), timeout=2.0,
                            metadata=self.metadata(channel)).classes}
                    except grpc.RpcError as e:
                        last = e
                        continue
                if {"Queue", "Lock", "Counter"} <= names:
                    return
            time.sleep(0.2)
        raise TimeoutError(f"cluster not ready in {timeout}s: {last}\n" +
                           "\n".join(self.tail(m) for m in self.members))

    def tail(self, m: Member, lines: int = 30) -> str:
        return tail_log(m.log_path, f"node {m.node_id}", lines)

    def kill(self, m: Member, sig: int = signal.SIGKILL) -> None:
        if m.proc is not None and m.proc.poll() is None:
            os.kill(m.proc.pid, sig)
            if sig in (signal.SIGKILL, signal.SIGTERM):
                m.proc.wait(timeout=30)

    # -- operations: restarts, the leader, status --------------------------------------------

    def restart_member(self, m: Member, sig: int = signal.SIGKILL) -> None:
        """Stop `m` (kill -9 by default) if it runs, and start it again on its data dir."""
        if m.proc is not None and m.proc.poll() is None:
            os.kill(m.proc.pid, signal.SIGCONT)
            self.kill(m, sig)
        self.start_member(m)

    def alive(self, m: Member) -> bool:
        return m.proc is not None and m.proc.poll() is None

    def member_status(self, m: Member, timeout: float = 2.0,
                      digest: bool = False) -> dict[str, Any] | None:
        """`m`'s own answer to the Status RPC (no retry, no redirect; a sequential read: its
        own view, also without a leader), or None if it gave none within `timeout` (down,
        hung). With `digest`, also
        the state digest `m` computed ("state_digest"). As root on a secure cluster: a
        Status without a login is only the replica's local view, and has no digest."""
        import grpc
        from gesmas.v1 import gesmas_pb2 as pb
        from gesmas.v1 import gesmas_pb2_grpc as pb_grpc
        if not self.alive(m):
            return None
        with self.channel(m.client_addr) as channel:
            try:
                r = pb_grpc.GesmasStub(channel).Status(     # its own view: sequential
                    pb.StatusRequest(with_digest=digest, read=pb.ReadOptions(
                        consistency=pb.CONSISTENCY_SEQUENTIAL)), timeout=timeout,
                    metadata=self.metadata(channel, timeout))
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.UNAUTHENTICATED:
                    self.forget_token()
                return None
        return {"node_id": r.node_id, "leader_address": r.leader_address,
                "is_leader": r.is_leader, "term": r.term, "commit_index": r.commit_index,
                "last_applied": r.last_applied, "waiter_count": r.waiter_count,
                "object_count": r.object_count, "session_count": r.session_count,
                "state_digest": r.state_digest, "rejoining": r.rejoining}

    def find_leader(self, timeout: float = 30.0, among: list[Member] | None = None) -> Member:
        """The member that answers Status as the leader (a Status commits through the log, so
        a deposed leader that has not noticed yet cannot answer it)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for m in among or self.members:
                st = self.member_status(m, timeout=min(2.0, max(0.1, deadline - time.monotonic())))
                if st is not None and st["is_leader"]:
                    return m
            time.sleep(0.1)
        raise TimeoutError(f"no leader among {[m.node_id for m in among or self.members]} in "
                           f"{timeout}s\n" + "\n".join(self.tail(m) for m in self.members))

    def wait_caught_up(self, m: Member, timeout: float = 30.0) -> dict[str, Any]:
        """Wait until `m` answers Status with last_applied >= the leader's commit index as
        it was when this call began."""
        leader = self.find_leader(timeout)
        target = (self.member_status(leader) or {}).get("commit_index", 0)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = self.member_status(m)
            if st is not None and st["last_applied"] >= target:
                return st
            time.sleep(0.1)
        raise TimeoutError(f"node {m.node_id} did not catch up to {target}\n{self.tail(m)}")

    def stop(self) -> None:
        stop_by_pid([m.proc for m in self.members])
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        try:
            return self.start()
        except BaseException:  # a cluster that never got ready is still stopped by pid
            self.stop()
            raise

    def __exit__(self, *exc: Any) -> None:
        self.stop()

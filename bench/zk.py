#!/usr/bin/env python
"""A local 3-node ZooKeeper ensemble on 127.0.0.1 for the paper benchmarks (bench/paper.py).

    python bench/zk.py            # start an ensemble, print its connect string, wait for Ctrl-C

Uses Debian's `zookeeper` package (installed with `apt-get install -y zookeeper` when
/usr/share/java/zookeeper.jar is missing; needs root). Each node gets its own folder in a
temporary directory with a `zoo.cfg` and a `myid`, distinct client / peer / election ports on
127.0.0.1, and is started directly as
`java -Xmx256m -cp <zookeeper.jar> org.apache.zookeeper.server.quorum.QuorumPeerMain zoo.cfg`.
Settings are ZooKeeper's durable defaults (forceSync=yes: the transaction log is fsynced before
a write is acknowledged; tickTime 2000, initLimit 10, syncLimit 5). Changed from the defaults,
none of them about durability: the AdminServer (HTTP on 8080) is off, the `srvr`/`mntr`/`ruok`
four-letter words are allowed (used to wait for a quorum) and `maxClientCnxns=0` lifts the
per-IP connection limit of 60, since every benchmark client connects from 127.0.0.1.
Nodes are stopped by pid (SIGTERM, then SIGKILL) and the folder is removed.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from gesmas.server.cluster import free_ports, stop_by_pid, tail_log

JAVA_DIR = "/usr/share/java"
ZK_JAR = os.path.join(JAVA_DIR, "zookeeper.jar")
MAIN = "org.apache.zookeeper.server.quorum.QuorumPeerMain"


def ensure_installed(timeout: float = 900.0) -> None:
    """Install Debian's zookeeper package if its jar is missing (apt-get, as root)."""
    if os.path.exists(ZK_JAR) and shutil.which("java"):
        return
    if os.geteuid() != 0:
        raise RuntimeError(f"{ZK_JAR} missing and not root: run `apt-get install -y zookeeper`")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    print("installing zookeeper (apt-get) ...", file=sys.stderr, flush=True)
    # an install interrupted earlier (a benchmark stopped mid-way) leaves dpkg half-done, and
    # apt-get then refuses everything until it is finished
    subprocess.run(["dpkg", "--configure", "-a"], env=env, check=False, timeout=timeout,
                   stdin=subprocess.DEVNULL)
    subprocess.run(["apt-get", "update", "-qq"], env=env, check=False, timeout=timeout,
                   stdin=subprocess.DEVNULL)
    subprocess.run(["apt-get", "install", "-y", "-qq", "zookeeper"], env=env, check=True,
                   timeout=timeout, stdin=subprocess.DEVNULL)
    if not os.path.exists(ZK_JAR):
        raise RuntimeError(f"zookeeper installed but {ZK_JAR} is missing")


def version() -> str:
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "zookeeper"],
                             capture_output=True, text=True, timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    real = os.path.realpath(ZK_JAR)
    return os.path.basename(real).removeprefix("zookeeper-").removesuffix(".jar")


def java_version() -> str:
    try:
        out = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=20)
        return (out.stderr or out.stdout).splitlines()[0].strip()
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


def four_letter(port: int, word: str, timeout: float = 2.0) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(word.encode())
        chunks = []
        while True:
            b = s.recv(4096)
            if not b:
                break
            chunks.append(b)
    return b"".join(chunks).decode(errors="replace")


@dataclass
class ZkNode:
    myid: int
    client_port: int
    peer_port: int
    election_port: int
    folder: str
    proc: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> str:
        return os.path.join(self.folder, "server.log")


@dataclass
class ZkEnsemble:
    nodes: int = 3
    heap: str = "256m"
    base_dir: str | None = None
    members: list[ZkNode] = field(default_factory=list)
    _tmp: str | None = None

    def __post_init__(self) -> None:
        if self.base_dir is None:
            self._tmp = tempfile.mkdtemp(prefix="gesmas-zk-")
            self.base_dir = self._tmp
        ports = free_ports(3 * self.nodes)
        for i in range(self.nodes):
            self.members.append(ZkNode(i + 1, ports[3 * i], ports[3 * i + 1], ports[3 * i + 2],
                                       os.path.join(self.base_dir, f"zk{i + 1}")))

    @property
    def hosts(self) -> list[str]:
        return [f"127.0.0.1:{m.client_port}" for m in self.members]

    @property
    def connect_string(self) -> str:
        return ",".join(self.hosts)

    def _write_config(self, m: ZkNode) -> str:
        data = os.path.join(m.folder, "data")
        os.makedirs(data, exist_ok=True)
        with open(os.path.join(data, "myid"), "w") as f:
            f.write(f"{m.myid}\n")
        lines = [
            "tickTime=2000", "initLimit=10", "syncLimit=5",
            f"dataDir={data}",
            f"clientPort={m.client_port}", "clientPortAddress=127.0.0.1",
            "maxClientCnxns=0", "admin.enableServer=false",
            "4lw.commands.whitelist=srvr,mntr,ruok",
            # forceSync is left at its default (yes): fsync before acknowledging
        ] + [f"server.{o.myid}=127.0.0.1:{o.peer_port}:{o.election_port}" for o in self.members]
        cfg = os.path.join(m.folder, "zoo.cfg")
        with open(cfg, "w") as f:
            f.write("\n".join(lines) + "\n")
        return cfg

    def classpath(self) -> str:
        cp = [ZK_JAR]   # its manifest's Class-Path names the other jars in /usr/share/java
        simple = os.path.join(JAVA_DIR, "slf4j-simple.jar")
        if os.path.exists(simple):
            cp.append(simple)
        return ":".join(cp)

    def start(self, timeout: float = 90.0) -> ZkEnsemble:
        ensure_installed()
        for m in self.members:
            cfg = self._write_config(m)
            log = open(m.log_path, "ab")
            m.proc = subprocess.Popen(
                ["java", f"-Xmx{self.heap}", "-Xms64m", "-XX:+UseSerialGC",
                 "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
                 "-Dzookeeper.jmx.log4j.disable=true",
                 "-cp", self.classpath(), MAIN, cfg],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=m.folder)
            log.close()
        try:
            self.wait_quorum(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def modes(self) -> dict[int, str]:
        out = {}
        for m in self.members:
            try:
                text = four_letter(m.client_port, "srvr")
            except OSError:
                out[m.myid] = "down"
                continue
            mode = [ln.split(":", 1)[1].strip() for ln in text.splitlines()
                    if ln.startswith("Mode:")]
            out[m.myid] = mode[0] if mode else "not serving"
        return out

    def wait_quorum(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        modes: dict[int, str] = {}
        while time.monotonic() < deadline:
            for m in self.members:
                if m.proc is not None and m.proc.poll() is not None:
                    raise RuntimeError(f"zookeeper node {m.myid} exited with "
                                       f"{m.proc.returncode}:\n{self.tail(m)}")
            modes = self.modes()
            if sorted(modes.values()).count("leader") == 1 and \
                    all(v in ("leader", "follower") for v in modes.values()):
                return
            time.sleep(0.3)
        raise TimeoutError(f"no zookeeper quorum in {timeout}s: {modes}\n" +
                           "\n".join(self.tail(m) for m in self.members))

    def tail(self, m: ZkNode, lines: int = 20) -> str:
        return tail_log(m.log_path, f"zk {m.myid}", lines)

    def stop(self) -> None:
        stop_by_pid([m.proc for m in self.members])
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self) -> ZkEnsemble:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> int:
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)
    ens = ZkEnsemble()
    try:
        ens.start()
        print(f"zookeeper {version()} ensemble up: {ens.connect_string} "
              f"(modes {ens.modes()}, data in {ens.base_dir}); Ctrl-C stops it", flush=True)
        while all(m.proc is not None and m.proc.poll() is None for m in ens.members):
            time.sleep(0.5)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        ens.stop()


if __name__ == "__main__":
    sys.exit(main())

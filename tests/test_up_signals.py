"""`gesmas up` stops on SIGINT and SIGTERM in every race (issue 26, point 8).

A Ctrl-C in a terminal is a SIGINT to the whole foreground process group: the supervisor and
its nodes get it at once, so nodes may exit before the supervisor acts on its own copy. The
supervisor must then stop, never restart them, and every process must be gone. Each test
starts `gesmas up` in a session of its own (so the signal reaches nothing else), on free
ports and a temporary data dir, and the fixture SIGKILLs, by pid, whatever of that session is
still there when the test ends, failed or not."""
from __future__ import annotations

import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field

import pytest

from gesmas.server import up

STOPPED_WITHIN = 60.0      # generous: "it stopped", not a performance bound
READY_WITHIN = 180.0       # a cluster start on a loaded 2-core machine


def stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, process group) of `pid`, or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return fields[0], int(fields[1]), int(fields[2])


def running(pid: int) -> bool:
    st = stat(pid)
    return st is not None and st[0] not in ("Z", "X")


def processes(match) -> list[int]:
    """The running processes whose stat matches."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = stat(int(name))
            if st is not None and st[0] not in ("Z", "X") and match(st):
                out.append(int(name))
    return out


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    """Wait until none of `pids` runs (an event per process: its pidfd becomes readable when
    it exits); returns those still running after `timeout`."""
    deadline = time.monotonic() + timeout
    fds = {}
    try:
        for pid in pids:
            try:
                fds[os.pidfd_open(pid)] = pid
            except ProcessLookupError:
                pass
        while fds and time.monotonic() < deadline:
            ready, _, _ = select.select(list(fds), [], [], deadline - time.monotonic())
            for fd in ready:
                os.close(fd)
                del fds[fd]
        return [pid for pid in fds.values() if running(pid)]
    finally:
        for fd in fds:
            os.close(fd)


@dataclass
class Up:
    """A `gesmas up` in its own session, its output read by a thread."""
    proc: subprocess.Popen
    lines: list[str] = field(default_factory=list)
    starting: threading.Event = field(default_factory=threading.Event)
    ready: threading.Event = field(default_factory=threading.Event)
    ended: threading.Event = field(default_factory=threading.Event)

    said: threading.Condition = field(default_factory=threading.Condition)

    def read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self.said:
                self.lines.append(line)
                self.said.notify_all()
            if line.startswith("starting "):
                self.starting.set()
            if line.startswith("cluster ready"):
                self.ready.set()
        with self.said:
            self.ended.set()
            self.said.notify_all()
        self.starting.set()               # nothing more to wait for
        self.ready.set()

    def wait_line(self, text: str) -> str:
        """The first line of its output that contains `text`, once it has come."""
        def found() -> str | None:
            return next((line for line in self.lines if text in line), None)
        with self.said:
            self.said.wait_for(lambda: found() is not None or self.ended.is_set(),
                               READY_WITHIN)
            line = found()
        assert line is not None, f"no line with {text!r}:\n{self.output}"
        return line

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def group(self) -> list[int]:
        """Every running process of its session's process group (nodes, their watchdogs)."""
        return processes(lambda st: st[2] == self.proc.pid)

    def nodes(self) -> list[int]:
        return processes(lambda st: st[1] == self.proc.pid)

    def wait_ready(self) -> None:
        assert self.ready.wait(READY_WITHIN), f"not ready:\n{self.output}"
        assert "cluster ready" in self.output, f"gesmas up ended:\n{self.output}"

    def assert_all_gone(self, known: list[int]) -> None:
        rc = self.proc.wait(timeout=STOPPED_WITHIN)
        left = wait_gone(known + self.group(), STOPPED_WITHIN)
        assert not left, f"still running: {left}\n{self.output}"
        self.ended.wait(STOPPED_WITHIN)
        assert rc == 0, self.output
        assert "restarting" not in self.output, self.output
        assert "did not start" not in self.output, self.output
        assert "stopping" in self.output, self.output


@pytest.fixture
def start_up(tmp_path):
    started: list[Up] = []

    def start(*options: str, env: dict[str, str] | None = None) -> Up:
        data = tmp_path / f"up{len(started)}"
        proc = subprocess.Popen(
            [sys.executable, "-m", "gesmas.client.cli", "up", "--base-port", "0",
             "--data-dir", str(data), "--unsafe-no-fsync", *options],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, start_new_session=True, env=dict(os.environ, **(env or {})))
        u = Up(proc)
        started.append(u)
        threading.Thread(target=u.read, daemon=True).start()
        return u

    yield start
    for u in started:                          # whatever is left of each session, by pid
        if u.proc.poll() is None:
            u.proc.kill()                      # first: it restarts no node after this
        u.proc.wait(timeout=30)
        for _ in range(10):
            left = u.group()
            if not left:
                break
            for pid in left:
                st = stat(pid)
                if st is not None and st[2] == u.proc.pid:    # still one of ours
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            wait_gone(left, 10)
        if u.proc.stdout is not None:
            u.ended.wait(10)
            u.proc.stdout.close()


@pytest.fixture
def cpu_load():
    """A busy-loop process per core for the duration of the test (each ends by itself after
    10 minutes at most), SIGKILLed by pid when the test ends."""
    cores = len(os.sched_getaffinity(0))
    burners = [subprocess.Popen(
        [sys.executable, "-c", "import time\nend = time.monotonic() + 600\n"
                               "while time.monotonic() < end: pass"])
        for _ in range(cores)]
    try:
        yield burners
    finally:
        for p in burners:
            p.kill()
            p.wait(timeout=30)


def interrupt_group_when_ready(u: Up) -> None:
    u.wait_ready()
    nodes = u.nodes()
    assert len(nodes) == 3, (nodes, u.output)
    known = u.group()
    os.killpg(u.proc.pid, signal.SIGINT)          # what a Ctrl-C in its terminal does
    u.assert_all_gone(known)


def test_a_ctrl_c_to_the_process_group_stops_everything(start_up):
    interrupt_group_when_ready(start_up())


@pytest.mark.parametrize("attempt", range(2))
def test_a_ctrl_c_to_the_process_group_stops_everything_under_cpu_load(
        start_up, cpu_load, attempt):
    assert all(p.poll() is None for p in cpu_load)
    interrupt_group_when_ready(start_up())


@pytest.mark.parametrize("when", ["starting", "nodes spawned"])
def test_a_ctrl_c_while_the_nodes_are_starting_stops_everything(start_up, when):
    u = start_up()
    assert u.starting.wait(READY_WITHIN), u.output
    if when == "nodes spawned":                 # the nodes are importing, not serving yet
        deadline = time.monotonic() + READY_WITHIN
        while len(u.nodes()) < 3 and not u.ended.is_set():
            assert time.monotonic() < deadline, u.output
            time.sleep(0.01)
    known = u.group()
    os.killpg(u.proc.pid, signal.SIGINT)
    u.assert_all_gone(known)


def test_sigterm_to_the_supervisor_alone_stops_the_nodes(start_up):
    u = start_up()
    u.wait_ready()
    known = u.group()
    nodes = u.nodes()
    assert len(nodes) == 3
    os.kill(u.proc.pid, signal.SIGTERM)               # the nodes get nothing from us
    u.assert_all_gone(known)


def test_metrics_ports_and_a_node_stopped_on_purpose_stays_down(start_up):
    """Each node serves metrics on a port of its own, printed at start, whatever
    GESMAS_METRICS_ADDR says (it would make every node bind one port); a node stopped with
    SIGTERM exits 0 and is left down, the others serve on."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        u = start_up("--metrics-port", "0", env={
            "GESMAS_METRICS_ADDR": "127.0.0.1:%d" % taken.getsockname()[1]})
        u.wait_ready()
    u.wait_line("Ctrl-C stops every node")            # the addresses are printed before
    assert "GESMAS_METRICS_ADDR is not passed to the nodes" in u.output
    addrs = re.findall(r"metrics http://(\S+)/metrics", u.output)
    assert len(set(addrs)) == 3, u.output
    with urllib.request.urlopen(f"http://{addrs[1]}/metrics", timeout=30) as r:
        assert "gesmas_raft_term" in r.read().decode()

    nodes = u.nodes()
    assert len(nodes) == 3
    known = u.group()
    os.kill(nodes[0], signal.SIGTERM)
    line = u.wait_line("left down, as asked")
    assert "stopped (exit status 0)" in line
    assert not wait_gone([nodes[0]], STOPPED_WITHIN)
    assert sorted(u.nodes()) == sorted(nodes[1:])       # decided: it is not restarted
    os.killpg(u.proc.pid, signal.SIGINT)
    u.assert_all_gone(known)


def test_a_port_in_use_is_named(start_up):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        u = start_up("--raft-port", str(port - 2))
        assert u.proc.wait(timeout=STOPPED_WITHIN) == 1
    u.ended.wait(STOPPED_WITHIN)
    assert f"port {port} (the Raft port of node 2) is in use on 127.0.0.1" in u.output
    assert "cluster ready" not in u.output and not u.group()


@pytest.mark.parametrize("nodes, base, raft, metrics, says", [
    (3, 7100, None, None, None),
    (3, 0, None, 0, None),
    (3, 7100, 8000, 9000, None),
    (3, 7100, 7102, None, "--raft-port 7102 and --base-port 7100: the nodes' ports would"),
    (200, 7100, None, None, "(Raft: BASE+100+i) and --base-port 7100"),
    (3, 65533, None, None, "BASE must be from 1 to 65532"),
    (3, 0, None, -1, "--metrics-port -1: node i takes BASE+i"),
    (3, 7100, None, 7201, "--metrics-port 7201 and --base-port 7100 (Raft"),
])
def test_port_bases_that_cannot_work_are_refused(nodes, base, raft, metrics, says):
    problem = up.port_plan_problem(nodes, base, raft, metrics)
    assert (problem is None) if says is None else (says in (problem or "")), problem


def test_make_run_takes_its_ports_from_make_variables(capsys):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    shown = subprocess.run(["make", "-n", "-s", "run", "PORT=7000", "RAFT_PORT=8000",
                            "METRICS_PORT=9000"], cwd=root, capture_output=True, text=True,
                           check=True).stdout
    line = " ".join(shown.replace("\\\n", " ").split())
    assert "-m gesmas.server.demo --base-port 7000 --raft-port 8000 --metrics-port 9000" \
        in line, shown
    from gesmas.server import demo                  # the demo refuses what cannot work
    with pytest.raises(SystemExit) as e:
        demo.main(["--base-port", "7000", "--raft-port", "7002"])
    assert e.value.code == 2
    assert "--raft-port (RAFT_PORT) 7002 and --base-port (PORT) 7000" in \
        capsys.readouterr().err


# --- the supervisor's decisions, in process --------------------------------------------------

class FakeProc:
    def __init__(self, code: int | None) -> None:
        self.returncode = code
        self.pid = -1

    def poll(self) -> int | None:
        return self.returncode


@dataclass
class FakeMember:
    node_id: int
    proc: FakeProc
    data_dir: str = "d"
    log_path: str = "l"


class FakeCluster:
    def __init__(self, codes: list[int | None]) -> None:
        self.members = [FakeMember(i + 1, FakeProc(c)) for i, c in enumerate(codes)]
        self.started: list[int] = []

    def start_member(self, m: FakeMember) -> None:
        self.started.append(m.node_id)
        m.proc = FakeProc(None)


def test_a_node_that_exits_before_the_supervisor_sees_the_stop_is_not_restarted(capsys):
    """The node died of the Ctrl-C first; the supervisor's own copy arrives during the pause
    before a restart: the stop wins, nothing is restarted or announced as restarting."""
    cluster = FakeCluster([None, 0, None])
    asked: list[bool] = []
    up.supervise(cluster, poll=0.01, stop=lambda: bool(asked),
                 wait=lambda t: asked.append(True))
    assert cluster.started == []
    assert "restarting" not in capsys.readouterr().err


def test_a_node_that_dies_alone_is_still_restarted(capsys):
    cluster = FakeCluster([None, -9, None])
    waits: list[float] = []

    class Done(Exception):
        pass

    def wait(t: float) -> None:
        waits.append(t)
        if cluster.started:
            raise Done                     # ends the loop after one restart

    with pytest.raises(Done):
        up.supervise(cluster, poll=0.01, stop=lambda: False, wait=wait)
    assert cluster.started == [2] and waits[0] == up.RESTART_PAUSE
    assert "node 2 exited with -9; the others keep serving; restarting" in \
        capsys.readouterr().err


def test_a_node_that_exits_with_0_is_left_down(capsys):
    cluster = FakeCluster([None, 0, None])
    waits: list[float] = []

    class Done(Exception):
        pass

    def wait(t: float) -> None:
        waits.append(t)
        if len(waits) > 3:
            raise Done                     # a few rounds after the decision

    with pytest.raises(Done):
        up.supervise(cluster, poll=0.01, stop=lambda: False, wait=wait)
    assert cluster.started == []
    err = capsys.readouterr().err
    assert err.count("node 2 stopped (exit status 0): left down, as asked") == 1, err


@pytest.fixture
def stop_signals():
    s = up.StopSignals().install()
    try:
        yield s
    finally:
        s.uninstall()


def test_a_stop_signal_is_recorded_and_counted(stop_signals):
    assert not stop_signals.requested() and not stop_signals.wait(0)
    os.kill(os.getpid(), signal.SIGINT)
    assert stop_signals.wait(STOPPED_WITHIN)
    assert stop_signals.signum == signal.SIGINT and stop_signals.count == 1
    started = time.monotonic()                     # waiting for a second one waits
    assert not stop_signals.wait(0.2, beyond=1)
    assert time.monotonic() - started >= 0.2
    os.kill(os.getpid(), signal.SIGTERM)
    assert stop_signals.wait(STOPPED_WITHIN, beyond=1)
    assert stop_signals.count == 2 and stop_signals.signum == signal.SIGINT


IGNORES_SIGTERM = (
    "import signal, sys, time\n"
    "def term(*a):\n"
    "    print('term', flush=True)\n"
    "signal.signal(signal.SIGTERM, term)\n"
    "print('ready', flush=True)\n"
    "end = time.monotonic() + 600\n"
    "while time.monotonic() < end: time.sleep(1)\n")


@pytest.fixture
def stubborn():
    """A child that ignores SIGTERM (says 'term' when it gets one), as a hung node would."""
    p = subprocess.Popen([sys.executable, "-c", IGNORES_SIGTERM], stdout=subprocess.PIPE,
                         text=True)
    try:
        assert p.stdout is not None and p.stdout.readline() == "ready\n"
        yield p
    finally:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=30)
        p.stdout.close()


def test_stopping_escalates_to_sigkill_after_the_grace(stubborn):
    cluster = FakeCluster([None])
    cluster.members[0].proc = stubborn
    up.stop_nodes(cluster, None, grace=0.5)
    assert stubborn.returncode == -signal.SIGKILL
    assert stubborn.stdout.readline() == "term\n"


def test_a_second_stop_signal_kills_at_once(stubborn, stop_signals):
    cluster = FakeCluster([None])
    cluster.members[0].proc = stubborn
    os.kill(os.getpid(), signal.SIGINT)                 # the first Ctrl-C: stopping
    assert stop_signals.wait(STOPPED_WITHIN)

    read: list[str] = []

    def second_ctrl_c() -> None:                        # once the node has had its SIGTERM
        read.append(stubborn.stdout.readline())
        if read[0] == "term\n":
            os.kill(os.getpid(), signal.SIGINT)
    t = threading.Thread(target=second_ctrl_c)
    t.start()
    started = time.monotonic()
    up.stop_nodes(cluster, stop_signals, grace=120)
    t.join(STOPPED_WITHIN)
    assert stubborn.returncode == -signal.SIGKILL
    assert read == ["term\n"]
    assert time.monotonic() - started < 60         # it did not wait for the grace
    assert stop_signals.count == 2

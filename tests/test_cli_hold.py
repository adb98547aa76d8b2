"""`gesmas lock`, `gesmas elect` and `gesmas delete` (issue 26, point 13) against one real
3-replica cluster shared by the module.

Each `gesmas` runs as a process of its own, its output read line by line by a thread: a line
it or its command prints is the event a test waits for (a bound on that wait fails the test
instead of hanging it, it is not what the test measures). The commands under a hold are
small Python programs that say what they see and wait for a line on stdin. Every `gesmas`
started is SIGKILLed by pid at the end of the test, with its command's process group."""
from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading

import pytest

from gesmas.client import Client
from gesmas.client import cli
from test_cluster import wait_for, waiters

pytestmark = pytest.mark.cluster

LINE_WITHIN = 120.0          # generous: a line is awaited, not timed

# A command that prints its lock or election environment, then waits for a line on stdin;
# SIGTERM and SIGINT make it say so and exit with 5 and 3.
HOLDER = r"""
import os, signal, sys
def said(word, code):
    def handler(signum, frame):
        print(word, flush=True)
        os._exit(code)
    return handler
signal.signal(signal.SIGTERM, said("term", 5))
signal.signal(signal.SIGINT, said("int", 3))
keys = sorted(k for k in os.environ if k.startswith(("GESMAS_LOCK_", "GESMAS_ELECTION_")))
print("env " + " ".join(f"{k}={os.environ[k]}" for k in keys), flush=True)
line = sys.stdin.readline()
sys.exit(int(line or 0))
"""


class Gesmas:
    """One `gesmas ...` process; `line()` gives its next line of stdout (its command's
    output included), `err` what it wrote on stderr once it has ended."""

    def __init__(self, cluster, *argv: str) -> None:
        # a gesmas that hangs is ended with SIGABRT (wait()), which faulthandler answers
        # with every thread's stack on stderr: where it hung is in the failure
        env = dict(os.environ, **cluster.client_env(), PYTHONFAULTHANDLER="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gesmas.client.cli", *argv], env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self.err = ""
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def line(self) -> str:
        try:
            got = self.lines.get(timeout=LINE_WITHIN)
        except queue.Empty:
            raise AssertionError(f"no line from {self.proc.args}") from None
        assert got is not None, f"ended without the line: {self.wait()} {self.err}"
        return got

    def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def wait(self) -> int:
        assert self.proc.stderr is not None
        try:
            code = self.proc.wait(timeout=LINE_WITHIN)  # bounded: a process that hangs fails
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGABRT)
            self.proc.wait(timeout=30)
            raise AssertionError(f"{self.proc.args} did not end within {LINE_WITHIN:g} s; "
                                 f"its stacks and stderr:\n{self.proc.stderr.read()}") from None
        self.err = self.proc.stderr.read()
        return code

    def env(self) -> dict[str, str]:
        """The environment the held command printed ("env K=V ...")."""
        line = self.line()
        assert line.startswith("env "), line
        return dict(kv.split("=", 1) for kv in line[4:].split())


@pytest.fixture
def gesmas(cluster):
    started: list[Gesmas] = []

    def start(*argv: str) -> Gesmas:
        g = Gesmas(cluster, *argv)
        started.append(g)
        return g

    yield start
    for g in started:                  # whatever is still running, by pid
        if g.proc.poll() is None:
            os.kill(g.proc.pid, signal.SIGCONT)
            g.proc.kill()
        g.proc.wait(timeout=30)
        for stream in (g.proc.stdin, g.proc.stdout, g.proc.stderr):
            if stream is not None:
                stream.close()


def holder(*argv: str) -> list[str]:
    return ["--", sys.executable, "-c", HOLDER, *argv]


@pytest.fixture
def client(cluster):
    with Client(cluster.addresses, **cluster.client_options()) as c:
        yield c


# --- lock ----------------------------------------------------------------------------------


def test_the_command_runs_under_the_lock_with_its_token_and_its_status_passes_through(
        gesmas, client):
    first = gesmas("lock", "cli-l1", *holder())
    env = first.env()
    token = int(env["GESMAS_LOCK_TOKEN"])
    assert env["GESMAS_LOCK_NAME"] == "cli-l1" and token > 0
    holding = client.lock("cli-l1").invoke("holder")
    assert holding["fence"] == token

    second = gesmas("lock", "cli-l1", *holder())      # waits while the first command runs
    wait_for(lambda: client.lock("cli-l1").invoke("waiters") == 1, what="a second waiter")
    assert second.proc.poll() is None and second.lines.empty()

    first.send("7")                                   # the first command exits with 7
    assert first.wait() == 7, first.err
    later = int(second.env()["GESMAS_LOCK_TOKEN"])
    assert later > token                              # the lock went on, with a new fence
    second.send("0")
    assert second.wait() == 0, second.err
    assert not client.lock("cli-l1").locked()         # released when the command ended


def test_a_lost_session_stops_the_command_and_says_why(gesmas, client):
    first = gesmas("lock", "cli-l2", "--ttl", "2", "--kill-after", "30", *holder())
    token = int(first.env()["GESMAS_LOCK_TOKEN"])
    os.kill(first.proc.pid, signal.SIGSTOP)           # no more keep-alives from it
    second = gesmas("lock", "cli-l2", *holder())
    later = int(second.env()["GESMAS_LOCK_TOKEN"])    # the cluster expired the first
    assert later > token
    os.kill(first.proc.pid, signal.SIGCONT)           # it finds its lease run out
    assert first.line() == "term"                     # the command got SIGTERM
    assert first.wait() == 1
    assert "the lock 'cli-l2' is no longer held" in first.err, first.err
    second.send("0")
    assert second.wait() == 0, second.err


def test_ctrl_c_goes_to_the_command_and_the_lock_is_released(gesmas, client):
    g = gesmas("lock", "cli-l3", *holder())
    g.env()
    os.kill(g.proc.pid, signal.SIGINT)
    assert g.line() == "int"                          # once, from gesmas
    assert g.wait() == 3, g.err
    assert not client.lock("cli-l3").locked()


def test_a_second_ctrl_c_kills_a_command_that_ignores_the_first(gesmas, client):
    stubborn = ("import signal, sys\n"
                "signal.signal(signal.SIGINT, lambda *a: print('int', flush=True))\n"
                "print('env', flush=True)\n"
                "sys.stdin.readline()\n")
    g = gesmas("lock", "cli-l7", "--", sys.executable, "-c", stubborn)
    assert g.line() == "env"
    os.kill(g.proc.pid, signal.SIGINT)
    assert g.line() == "int"                          # passed on, and ignored
    os.kill(g.proc.pid, signal.SIGINT)
    assert g.wait() == 128 + signal.SIGKILL, g.err
    assert not client.lock("cli-l7").locked()


def test_without_a_command_the_token_is_printed_and_held_until_sigterm(gesmas, client):
    g = gesmas("lock", "cli-l4")
    token = int(g.line())
    assert client.lock("cli-l4").invoke("holder")["fence"] == token
    os.kill(g.proc.pid, signal.SIGTERM)
    assert g.wait() == 0, g.err
    assert not client.lock("cli-l4").locked()


def test_a_lock_deleted_while_held_is_said_and_not_made_again(gesmas, client):
    g = gesmas("lock", "cli-l8", *holder())
    g.env()
    client.delete_object("cli-l8")
    g.send("0")
    assert g.wait() == 0                              # the command's status still
    assert "the lock 'cli-l8' was gone before the command ended" in g.err, g.err
    assert "cli-l8" not in [o["name"] for o in client.list_objects(prefix="cli-l8")]


# gesmas in the foreground of a terminal of its own (a pty): the session leader, as a shell
# would run it
IN_A_TERMINAL = ("import fcntl, os, sys, termios\n"
                 "os.setsid()\n"
                 "fcntl.ioctl(0, termios.TIOCSCTTY, 0)\n"
                 "os.execv(sys.executable, [sys.executable, '-m', 'gesmas.client.cli', "
                 "*sys.argv[1:]])\n")
READS_THEN_WAITS = ("import os, signal, sys\n"
                    "signal.signal(signal.SIGINT, lambda *a: (print('int', flush=True), "
                    "os._exit(3)))\n"
                    "print('stdin ' + repr(sys.stdin.readline()), flush=True)\n"
                    "signal.pause()\n")


def test_in_a_terminal_the_command_does_not_read_it_and_ctrl_c_reaches_it_once(
        cluster, client):
    master, slave = os.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-c", IN_A_TERMINAL, "lock", "cli-tty", "--", sys.executable, "-c",
         READS_THEN_WAITS], env=dict(os.environ, **cluster.client_env()),
        stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)
    lines: queue.SimpleQueue[str | None] = queue.SimpleQueue()

    def read() -> None:
        buf = b""
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:                            # EIO: the terminal's last user left
                data = b""
            if not data:
                lines.put(None)
                return
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                lines.put(line.decode(errors="replace").strip())

    threading.Thread(target=read, daemon=True).start()

    def line_with(text: str) -> str:
        while True:
            got = lines.get(timeout=LINE_WITHIN)
            assert got is not None, f"the terminal closed before {text!r}"
            if text in got:
                return got

    try:
        # a command in the background of the terminal would be stopped reading it: it
        # reads nothing instead, and holds the lock meanwhile
        assert line_with("stdin ") == "stdin ''"
        assert client.lock("cli-tty").locked()
        os.write(master, b"\x03")                      # Ctrl-C typed at the terminal
        line_with("int")
        assert proc.wait(timeout=LINE_WITHIN) == 3
        assert not client.lock("cli-tty").locked()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        os.close(master)


def test_a_command_that_cannot_run_is_an_error_and_releases(gesmas, client):
    g = gesmas("lock", "cli-l5", "--", "/nonexistent/gesmas-cmd")
    assert g.wait() == 1
    assert "cannot run '/nonexistent/gesmas-cmd'" in g.err, g.err
    assert not client.lock("cli-l5").locked()


def test_a_name_taken_by_another_class_and_a_timeout_are_clear_errors(gesmas, client):
    client.counter("cli-taken")
    g = gesmas("lock", "cli-taken", "--", "true")
    assert g.wait() == 1 and "cli-taken" in g.err and "Counter" in g.err, g.err
    held = gesmas("lock", "cli-l6")
    held.line()
    g = gesmas("lock", "cli-l6", "--timeout", "0", "--", "true")
    assert g.wait() == 1
    assert "lock 'cli-l6' not acquired within 0 s" in g.err, g.err


# --- elect ---------------------------------------------------------------------------------


def test_elect_runs_the_command_as_leader_and_listen_prints_each_change(gesmas, client):
    listener = gesmas("elect", "cli-e1", "--listen")
    assert listener.line() == "null"                  # nobody leads yet
    leader = gesmas("elect", "cli-e1", "alpha", *holder())
    env = leader.env()
    term = int(env["GESMAS_ELECTION_TERM"])
    assert env["GESMAS_ELECTION_NAME"] == "cli-e1" and env["GESMAS_ELECTION_VALUE"] == "alpha"
    seen = json.loads(listener.line())
    assert seen["value"] == "alpha" and seen["term"] == term

    second = gesmas("elect", "cli-e1", "beta")        # no command: prints the term, holds
    wait_for(lambda: waiters(client, "cli-e1") == 1, what="a second candidate")
    leader.send("0")                                  # the leader's command ends: it resigns
    assert leader.wait() == 0, leader.err
    later = int(second.line())
    assert later > term
    seen = json.loads(listener.line())
    assert seen["value"] == "beta" and seen["term"] == later
    os.kill(second.proc.pid, signal.SIGINT)
    assert second.wait() == 0, second.err
    assert listener.line() == "null"                  # a vacancy, and it waits past it
    os.kill(listener.proc.pid, signal.SIGTERM)
    assert listener.wait() == 0, listener.err


# --- delete --------------------------------------------------------------------------------


def test_delete_removes_an_object_and_a_missing_one_is_named(gesmas, client):
    client.counter("cli-d1").add(3)
    g = gesmas("delete", "cli-d1")
    assert g.line() == "deleted cli-d1"
    assert g.wait() == 0, g.err
    assert "cli-d1" not in [o["name"] for o in client.list_objects(prefix="cli-d")]
    g = gesmas("delete", "cli-d1")
    assert g.wait() == 1
    assert "cli-d1" in g.err, g.err


# --- usage mistakes, without a cluster -----------------------------------------------------


@pytest.mark.parametrize("argv, says", [
    (["lock", "x", "echo", "hi"], "put -- before the command to run"),
    (["lock", "x", "--"], "-- but no command after it"),
    (["lock", "x", "--ttl", "0"], "--ttl must be more than 0"),
    (["lock", "x", "--ttl", "7200", "--", "true"], "at most 3600 seconds"),
    (["lock", "x", "--ttl", "nan"], "--ttl: must be a number of seconds"),
    (["elect", "x"], "give a PROPOSAL"),
    (["elect", "x", "p", "--listen"], "--listen takes no PROPOSAL"),
    (["delete"], "the following arguments are required: NAME"),
])
def test_usage_mistakes_are_named(capsys, argv, says):
    # an address nobody serves: each mistake must be found before any call
    cut = argv.index("--") if "--" in argv else len(argv)
    assert cli.main([*argv[:cut], "--cluster", "127.0.0.1:1", *argv[cut:]]) == 2
    assert says in capsys.readouterr().err


def test_the_command_after_dashes_keeps_its_own_options():
    from gesmas.client.cli_hold import split_command
    assert split_command(["lock", "n", "--ttl", "3", "--", "ls", "--ttl", "--", "x"]) == \
        (["lock", "n", "--ttl", "3"], ["ls", "--ttl", "--", "x"])
    assert split_command(["call", "C", "o", "m", "--", "x"]) == \
        (["call", "C", "o", "m", "--", "x"], None)
    assert split_command(["lock", "n"]) == (["lock", "n"], None)

"""`gesmas up`: a local cluster in the foreground, supervised (a node that fails is reported
and restarted on its data dir while the others serve; one stopped on purpose, exit status
0, stays down), until Ctrl-C.

Stopping must win every race with the supervision. A Ctrl-C in a terminal (or `kill -INT --
-PGID`) reaches the supervisor and its nodes at once, so the nodes may exit before the
supervisor has acted on its own copy of the signal. Hence:

- the signal handlers raise nothing: they record the request, and the C-level handler also
  writes the signal number to a wake-up pipe (`signal.set_wakeup_fd`) the moment the signal
  arrives, in whatever thread. A raised KeyboardInterrupt can be lost (a handler that runs
  inside a finalizer or a C callback has its exception printed and dropped), a recorded
  request cannot;
- the supervisor asks `StopSignals.requested()` before each restart, and waits for a stop
  (not a sleep) for RESTART_PAUSE before restarting a node: a node that died of the same
  Ctrl-C is never restarted, since the supervisor's copy of the signal arrives with it;
- stopping sends SIGTERM to each node by pid and waits at most STOP_GRACE seconds, then
  SIGKILLs what is left; a second stop signal meanwhile SIGKILLs at once.
"""
from __future__ import annotations

import os
import select
import signal
import sys
import time
from typing import Any, Callable

from .cluster import LocalCluster, PortInUse, StartInterrupted


def stop_on_signals() -> None:
    """SIGTERM (and SIGINT, even where a shell started us with it ignored) end the foreground
    wait with KeyboardInterrupt, so that the nodes are stopped on every way out (the demo)."""
    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)


RESTART_PAUSE = 1.0          # seconds before `gesmas up` restarts a node that exited
GIVE_UP_AFTER = 5            # restarts within GIVE_UP_WINDOW after which a node stays down
GIVE_UP_WINDOW = 60.0
STOP_GRACE = 10.0            # seconds the nodes have to exit on SIGTERM before SIGKILL

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class StopSignals:
    """SIGINT, SIGTERM and SIGHUP as a stop request that cannot be lost.

    `install()` sets the handlers (also where a shell started us with SIGINT ignored) and a
    wake-up pipe. The Python handler only records the signal; the pipe receives a byte from
    the C-level handler as soon as a signal arrives, even while the main thread is busy or
    blocked, so `requested()` (which reads the pipe) is true from that moment on, whether or
    not the Python handler has run yet. `wait(t)` returns as soon as a stop is requested."""

    def __init__(self) -> None:
        self.signum: int | None = None     # the first stop signal
        self.count = 0                     # stop signals seen in the pipe
        self._r = self._w = -1
        self._saved: dict[int, Any] = {}
        self._saved_fd = -1

    def install(self) -> StopSignals:
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        self._saved_fd = signal.set_wakeup_fd(self._w, warn_on_full_buffer=False)
        for s in STOP_SIGNALS:
            self._saved[s] = signal.signal(s, self._handler)
        return self

    def uninstall(self) -> None:
        for s, old in self._saved.items():
            signal.signal(s, old)
        self._saved.clear()
        if self._w >= 0:
            signal.set_wakeup_fd(self._saved_fd)
            os.close(self._r)
            os.close(self._w)
            self._r = self._w = -1

    def _handler(self, signum: int, frame: Any) -> None:
        # nothing that can block or raise: an assignment
        if self.signum is None:
            self.signum = signum

    def _drain(self) -> None:
        if self._r < 0:
            return
        while True:
            try:
                data = os.read(self._r, 512)
            except (BlockingIOError, InterruptedError):
                return
            if not data:
                return
            for b in data:
                if b in STOP_SIGNALS:
                    self.count += 1
                    if self.signum is None:
                        self.signum = b

    def requested(self) -> bool:
        self._drain()
        return self.signum is not None

    def wait(self, timeout: float, beyond: int | None = None) -> bool:
        """Wait up to `timeout` seconds for a stop request, or, with `beyond`, for more than
        `beyond` stop signals in all (a second Ctrl-C); True if it came."""
        def came() -> bool:
            self._drain()
            return self.signum is not None if beyond is None else self.count > beyond
        deadline = time.monotonic() + max(0.0, timeout)
        while not came():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if self._r < 0:
                time.sleep(min(left, 0.05))
                continue
            select.select([self._r], [], [], left)
        return True


def supervise(cluster: LocalCluster, poll: float = 0.5,
              stop: Callable[[], bool] | None = None,
              wait: Callable[[float], Any] = time.sleep) -> None:
    """Keep `cluster` running: a node that exits (kill -9, a crash, a replica that stopped
    applying) is reported and restarted on its data dir while the others go on serving; a
    node that keeps dying (GIVE_UP_AFTER times in GIVE_UP_WINDOW) stays down, and so does
    one that exits with status 0 (a SIGTERM or SIGINT to it alone: stopped on purpose,
    which a restart would undo). Returns when
    every node is down for good, or when `stop()` is true. `wait(t)` pauses between polls
    and before a restart; `StopSignals.wait` returns early when a stop is asked, and no node
    is restarted once `stop()` is true."""
    stopping = stop or (lambda: False)
    restarts: dict[int, list[float]] = {m.node_id: [] for m in cluster.members}
    down: set[int] = set()
    while not stopping():
        for m in cluster.members:
            if m.node_id in down or m.proc is None or m.proc.poll() is None:
                continue
            code = m.proc.returncode
            # A node that exited with the signal that stops us too: our copy of it arrives
            # with its, so wait for it (returns early on a stop) before restarting anything.
            wait(RESTART_PAUSE)
            if stopping():
                return
            if code == 0:
                down.add(m.node_id)
                print(f"node {m.node_id} stopped (exit status 0): left down, as asked; the "
                      f"others keep serving (log: {m.log_path})", file=sys.stderr, flush=True)
                continue
            now = time.monotonic()
            recent = [t for t in restarts[m.node_id] if now - t < GIVE_UP_WINDOW]
            if len(recent) >= GIVE_UP_AFTER:
                down.add(m.node_id)
                print(f"node {m.node_id} exited with {code} {len(recent)} times in "
                      f"{GIVE_UP_WINDOW:g} s; leaving it down (log: {m.log_path})",
                      file=sys.stderr, flush=True)
                continue
            print(f"node {m.node_id} exited with {code}; the others keep serving; restarting "
                  f"it on {m.data_dir} (log: {m.log_path})", file=sys.stderr, flush=True)
            restarts[m.node_id] = recent + [time.monotonic()]
            cluster.start_member(m)
        if len(down) == len(cluster.members):
            return
        wait(poll)


def stop_nodes(cluster: LocalCluster, signals: StopSignals | None = None,
               grace: float | None = None) -> None:
    """SIGCONT + SIGTERM each node still running (by the pid `gesmas up` started it with), wait
    up to `grace` seconds for all of them, then SIGKILL the rest. A stop signal that arrives
    meanwhile (a second Ctrl-C) ends the wait at once."""
    grace = STOP_GRACE if grace is None else grace
    procs = [m.proc for m in cluster.members if m.proc is not None]
    for p in procs:
        if p.poll() is None:
            try:
                os.kill(p.pid, signal.SIGCONT)
                os.kill(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    seen = 0
    if signals is not None:
        signals.requested()                 # count what arrived so far: only a later one
        seen = signals.count                # is a second Ctrl-C
    deadline = time.monotonic() + grace
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        if signals is None:
            time.sleep(0.05)
        elif signals.wait(0.05, beyond=seen):
            print("stopping at once (SIGKILL) ...", flush=True)
            break
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        try:
            p.wait(timeout=10)
        except Exception:   # a process in uninterruptible sleep: reaped by init later
            pass


def port_plan_problem(nodes: int, base: int | None, raft: int | None,
                      metrics: int | None) -> str | None:
    """What is wrong with the port bases of `gesmas up` (node i takes BASE+i of each; 0 or
    None: free ports, except Raft, which follows --base-port by default), or None."""
    if raft is None and base:
        raft_flag, raft = f"--base-port {base} (Raft: BASE+100+i)", base + 100
    else:
        raft_flag = f"--raft-port {raft}"
    ranges: list[tuple[str, int]] = []
    for flag, b in ((f"--base-port {base}", base), (raft_flag, raft),
                    (f"--metrics-port {metrics}", metrics)):
        if b is None or b == 0:
            continue
        if b < 0 or b + nodes > 65535:
            return (f"{flag}: node i takes BASE+i, so BASE must be from 1 to "
                    f"{65535 - nodes} for {nodes} nodes (0: free ports)")
        for other, lo in ranges:
            if lo < b + nodes and b < lo + nodes:
                return f"{flag} and {other}: the nodes' ports would overlap"
        ranges.append((flag, b))
    return None


def run_up(args: Any) -> int:
    """`gesmas up`: a local cluster in the foreground until Ctrl-C (or SIGTERM, SIGHUP)."""
    problem = port_plan_problem(args.nodes, args.base_port, getattr(args, "raft_port", None),
                                getattr(args, "metrics_port", None))
    if problem:
        print(f"gesmas up: {problem}", file=sys.stderr)
        return 2
    signals = StopSignals().install()
    cluster = LocalCluster(nodes=args.nodes, base_port=args.base_port or None,
                           raft_base=getattr(args, "raft_port", None),
                           metrics_base=getattr(args, "metrics_port", None),
                           data_dir=args.data_dir,
                           fsync=not getattr(args, "unsafe_no_fsync", False),
                           secure=bool(getattr(args, "tls", False)))
    if os.environ.get("GESMAS_METRICS_ADDR"):
        print("gesmas up: GESMAS_METRICS_ADDR is not passed to the nodes (each would bind "
              "it): --metrics-port BASE gives node i a metrics port of its own, BASE+i",
              file=sys.stderr, flush=True)
    print(f"starting {cluster.nodes} gesmas nodes (data in {cluster.data_dir}) ...", flush=True)
    try:
        try:
            cluster.start(stop=signals.requested)
        except StartInterrupted:
            pass
        except PortInUse as e:
            print(f"gesmas up: {e}: stop what uses it, or choose other ports with "
                  "--base-port, --raft-port, --metrics-port", file=sys.stderr)
            return 1
        except (RuntimeError, TimeoutError) as e:
            if not signals.requested():
                print(f"gesmas up: the cluster did not start: {e}", file=sys.stderr)
                return 1
        if not signals.requested():
            print("cluster ready. Client addresses:", flush=True)
            for m in cluster.members:
                metrics = f", metrics http://{m.metrics_addr}/metrics" if m.metrics_addr else ""
                print(f"  node {m.node_id}: {m.client_addr}   (raft {m.raft_addr}{metrics}, "
                      f"log {m.log_path})")
            print("\n" + "".join(f"  export {k}={v}\n" for k, v in cluster.client_env().items())
                  + "\nCtrl-C stops every node.", flush=True)
            supervise(cluster, stop=signals.requested, wait=signals.wait)
            if not signals.requested():     # every node is down for good
                print("gesmas up: every node is down; stopping", file=sys.stderr, flush=True)
                return 1
        print("\nstopping ...", flush=True)
        return 0
    finally:
        stop_nodes(cluster, signals)
        cluster.stop()                      # nothing left to stop; removes a temporary dir
        signals.uninstall()

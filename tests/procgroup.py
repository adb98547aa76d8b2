"""Running a program that starts servers of its own (a bench script's cluster) so that they
are stopped whatever happens to the test: `run_in_group` is ``subprocess.run`` with the
program in a process group of its own, which it stops whole on a timeout or any exception
(the test failing, or interrupted). ``subprocess.run`` alone kills only the program on a
timeout, with SIGKILL, and the cluster it had started ran on."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Any, Sequence

#: seconds the group has to stop after SIGTERM (a cluster tears itself down) before SIGKILL
GRACE = 10.0


def run_in_group(cmd: Sequence[str], timeout: float, grace: float = GRACE,
                 **kw: Any) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True, stdin=DEVNULL, timeout=...,
    **kw)``, the program and everything it starts in a new process group (its session)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True, start_new_session=True, **kw)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        stop_group(proc, grace)
        raise
    finally:
        stop_group(proc, grace)       # what it left running after it ended, if anything
    return subprocess.CompletedProcess(list(cmd), proc.returncode, out, err)


def stop_group(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM to `proc`'s process group, then SIGKILL to what is left after `grace` s;
    `proc` is reaped and its pipes closed (nothing is done to a group already gone)."""
    group = proc.pid                  # start_new_session: the group's id is the leader's pid
    if _alive(group):
        _signal(group, signal.SIGTERM)
        end = time.monotonic() + grace
        while _alive(group) and time.monotonic() < end:
            if proc.poll() is None:
                try:
                    proc.wait(0.05)
                except subprocess.TimeoutExpired:
                    pass
            else:
                time.sleep(0.05)
        _signal(group, signal.SIGKILL)
    proc.wait()
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None and not pipe.closed:
            pipe.close()


def _alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:           # a member we may not signal: still there
        return True
    return True


def _signal(group: int, sig: int) -> None:
    try:
        os.killpg(group, sig)
    except ProcessLookupError:
        pass

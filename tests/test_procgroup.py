"""tests/procgroup.py: a program run for a test is stopped with everything it started, on a
timeout as on success (the bench smoke tests start clusters this way)."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from procgroup import run_in_group

# a program that starts a child which would outlive it (writing elsewhere, as a cluster's
# servers write their logs to files), prints the child's pid and waits
_PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(child.pid, flush=True)
time.sleep(float(sys.argv[1]))
"""


def _gone(pid: int, within: float = 5.0) -> bool:
    end = time.monotonic() + within
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        with open(f"/proc/{pid}/stat") as f:       # a zombie waiting for init counts as gone
            if f.read().split(") ")[-1].startswith("Z"):
                return True
        time.sleep(0.05)
    return False


def test_a_timeout_stops_the_program_and_what_it_started(tmp_path):
    out = tmp_path / "pid"
    with pytest.raises(subprocess.TimeoutExpired):
        run_in_group([sys.executable, "-c", _PARENT.replace(
            "print(child.pid, flush=True)", f"open({str(out)!r}, 'w').write(str(child.pid))"),
            "60"], timeout=2.0, grace=2.0)
    assert _gone(int(out.read_text()))


def test_a_program_that_ends_leaves_nothing_running():
    done = run_in_group([sys.executable, "-c", _PARENT, "0"], timeout=30)
    assert done.returncode == 0
    assert _gone(int(done.stdout.split()[0]))

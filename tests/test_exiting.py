"""client/exiting.py: the threads that are ending when a program exits are let finish (a
daemon thread stopped at exit inside grpc's RPC condition left a collected RPC waiting for
it for ever: `gesmas lock -- CMD` hung once at its exit)."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

from gesmas.client import exiting

# A program whose daemon thread is ending (named by `ending`) when the main thread returns:
# it writes its file only if the exit waits for it.
PROGRAM = textwrap.dedent("""
    import sys, threading, time
    from gesmas.client import exiting
    path, named = sys.argv[1], sys.argv[2] == "named"
    started = threading.Event()
    def finishing():
        if named:
            exiting.ending()
        started.set()
        time.sleep(0.3)                 # the work left before it ends
        open(path, "w").write("done")
    threading.Thread(target=finishing, daemon=True).start()
    started.wait()
""")


def test_the_exit_waits_for_a_thread_that_is_ending_and_not_for_others(tmp_path):
    for how, finished in (("named", True), ("unnamed", False)):
        path = tmp_path / how
        done = subprocess.run([sys.executable, "-c", PROGRAM, str(path), how],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert path.exists() is finished, how


def test_the_wait_is_bounded_and_skips_the_calling_thread():
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, daemon=True)
    t.start()
    exiting.ending(t)
    exiting.ending()                            # the calling thread: not joined
    try:
        assert exiting.let_finish(0.05) == [t]  # still alive after the bound
    finally:
        stop.set()
        t.join(10)
    assert exiting.let_finish(0.05) == []

"""Type hints are checked: mypy over the client, the protocol, the server (kernel included) and
the objects, straight from the source roots (settings in pyproject.toml, [tool.mypy])."""
from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_mypy_finds_no_type_errors(tmp_path):
    cmd = [sys.executable, "-m", "mypy", "--config-file", os.path.join(ROOT, "pyproject.toml"),
           "--cache-dir", str(tmp_path / "cache"), "-p", "gesmas.client", "-p", "gesmas.protocol",
           "-p", "gesmas.server", "-p", "gesmas.objects", "-p", "gesmas.aio"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no issues found" in done.stdout

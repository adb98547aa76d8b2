"""Type hints are checked: mypy over the client, the server (kernel included) and the objects.

The source folders are mapped into the `gesmas` namespace by pyproject's package-dir table,
which mypy cannot follow, so the check runs on a `gesmas/` tree of links to them. Settings are
in pyproject.toml ([tool.mypy])."""
from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINKS = {"client": "client", "server": "server", "objects": "objects", "protocol": "protocol",
         "v1": "protos/gesmas/v1"}


def test_mypy_finds_no_type_errors(tmp_path):
    pkg = tmp_path / "gesmas"
    pkg.mkdir()
    for name, src in LINKS.items():
        os.symlink(os.path.join(ROOT, src), pkg / name)
    cmd = [sys.executable, "-m", "mypy", "--config-file", os.path.join(ROOT, "pyproject.toml"),
           "--cache-dir", str(tmp_path / "cache"),
           "-p", "gesmas.client", "-p", "gesmas.server", "-p", "gesmas.objects"]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no issues found" in done.stdout

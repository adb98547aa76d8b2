"""The status page on a replica's metrics port, checked in a real headless browser (Debian's
chromium): the script fetches /status.json and fills the tables."""
from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import urllib.request

from gesmas.client import Client
from gesmas.server.cluster import LocalCluster


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read()


def test_the_status_page_shows_members_objects_and_sessions(tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "the status page test needs Debian's chromium (apt-get install chromium)"
    with LocalCluster(metrics=True) as cl:
        with Client(cl.addresses) as c:
            c.queue("status-jobs").produce("x")
            c.queue("status-jobs").consume(timeout=1)
            blocked = threading.Thread(target=lambda: c.queue("status-jobs").consume(timeout=30))
            blocked.start()
            leader = cl.find_leader()
            m = leader
            base = f"http://{m.metrics_addr}"
            deadline = time.monotonic() + 30
            while True:
                data = json.loads(get(base + "/status.json"))
                if data.get("waiter_count") == 1 and \
                        all(n["connected"] for n in data.get("nodes", [])):
                    break
                assert time.monotonic() < deadline, data
                time.sleep(0.1)
            assert data["is_leader"] and data["object_count"] >= 1
            assert data["rejoining"] is False          # a new cluster's replica votes
            [obj] = [o for o in data["objects"] if o["name"] == "status-jobs"]
            assert (obj["class"], obj["waiters"]) == ("Queue", 1)
            assert any(s["id"] == c.session and s["age"] is not None and s["waiting"] == 1
                       for s in data["sessions"])
            assert len(data["nodes"]) == 3 and all(n["connected"] for n in data["nodes"])
            shot = tmp_path / "status.png"
            common = [chromium, "--headless", "--no-sandbox", "--disable-gpu",
                      "--virtual-time-budget=4000", "--window-size=1100,800"]
            dom = subprocess.run(common + ["--dump-dom", base + "/status"],
                                 capture_output=True, text=True, timeout=60).stdout
            assert "status-jobs" in dom and ">leader<" in dom and ">Queue<" in dom, dom[-2000:]
            assert f"node {m.node_id}" in dom
            subprocess.run(common + [f"--screenshot={shot}", base + "/status"],
                           capture_output=True, timeout=60)
            assert shot.exists() and shot.stat().st_size > 5000
            c.queue("status-jobs").produce("release")
            blocked.join(30)

"""The status page on a replica's metrics port, checked in a real headless browser (Debian's
chromium): the script fetches /status.json and fills the tables."""
from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import urllib.request
from types import SimpleNamespace

from gesmas.client import Client
from gesmas.server import statuspage
from gesmas.server.cluster import LocalCluster
from gesmas.server.duties import LeaderDuties

from test_objects import OH


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
            fence = int(c.lock("status-lock").acquire())
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
            assert f">session {c.session} (fence {fence})<" in dom       # the holder column
            subprocess.run(common + [f"--screenshot={shot}", base + "/status"],
                           capture_output=True, timeout=60)
            assert shot.exists() and shot.stat().st_size > 5000
            c.queue("status-jobs").produce("release")
            blocked.join(30)


class _Replica:
    """read_applied as a replica between two entries runs it, or never (`busy`)."""

    def __init__(self, kernel, busy: bool = False) -> None:
        self.kernel, self.busy, self.handles = kernel, busy, []

    def read_applied(self, need, fn, done):
        handle = SimpleNamespace(cancelled=False)
        self.handles.append(handle)
        if not self.busy:
            done(fn(SimpleNamespace(kernel=self.kernel)), self.kernel.index, None)
        return handle


def _node(kernel, busy: bool = False, duties=None):
    if duties is None:
        duties = LeaderDuties(1000, 10.0, lambda: [])
    return SimpleNamespace(config=SimpleNamespace(node_id=1, client_addr="127.0.0.1:1"),
                           status=lambda: {"is_leader": True}, kernel=kernel,
                           replica=_Replica(kernel, busy), leader_duties=duties)


def test_the_page_lists_the_first_objects_by_name_and_counts_them_all(monkeypatch):
    """Past MAX_ROWS objects the page shows the first ones in name order (from the sorted
    names, not a sort) and the full count; while the replica applies a long entry, the
    counts alone, saying why."""
    monkeypatch.setattr(statuspage, "MAX_ROWS", 5)
    h = OH()
    names = [f"q{i:02d}" for i in range(12)]
    for n in reversed(names):
        h.make("Queue", n)
    s = h.open_session()
    h.call(s, "q03", "consume")
    data = statuspage.snapshot(_node(h.kernel))
    assert [o["name"] for o in data["objects"]] == names[:5]
    assert data["objects"][3] == {"name": "q03", "class": "Queue", "version": 1,
                                  "waiters": 1, "owner": "", "holder": ""}
    assert (data["object_count"], data["session_count"], data["waiter_count"]) == (12, 1, 1)
    assert [x["id"] for x in data["sessions"]] == [s] and data["sessions"][0]["waiting"] == 1
    assert "rows_note" not in data
    monkeypatch.setattr(statuspage, "READ_WAIT", 0.01)
    node = _node(h.kernel, busy=True)
    data = statuspage.snapshot(node)
    assert "objects" not in data and data["object_count"] == 12
    assert "applying an entry" in data["rows_note"]
    assert [hd.cancelled for hd in node.replica.handles] == [True]   # not run later


def test_session_ages_and_silences_grow_by_the_replicas_clock(monkeypatch):
    """No entry is applied between two looks (an idle cluster): the ages still grow, by this
    replica's clock. The leader also shows how long since it heard from each session, which
    a keep-alive resets; a follower, which hears no keep-alives, shows none."""
    h = OH()
    h.ts = 1.7e9                                # a wall time, as a replica's commands carry
    s = h.open_session()
    opened = h.kernel.sessions[s].opened
    duties = LeaderDuties(1000, 10.0, lambda: [])
    duties.reset(h.kernel, 100.0)
    node = _node(h.kernel, duties=duties)
    clock = {"wall": opened + 5.0, "mono": 100.0}
    monkeypatch.setattr(statuspage, "wall", lambda: clock["wall"])
    monkeypatch.setattr(statuspage, "monotonic", lambda: clock["mono"])

    def row():
        [x] = statuspage.snapshot(node)["sessions"]
        return x["age"], x["silent"]
    assert row() == (5.0, None)                 # not leading: no keep-alives heard here
    duties.step(100.0, clock["wall"], leader=True)
    clock["wall"] += 7.0
    clock["mono"] += 7.0
    assert row() == (12.0, 7.0)
    duties.keep_alive(s, h.kernel.sessions[s].secret, clock["mono"] - 2.0)
    assert row() == (12.0, 2.0)


def test_objects_show_their_holder_apart_from_who_created_them():
    """"created by" is the user that made the object; "holder" is who holds it now, read
    through the class's declared read-only method (Lock.holder, LeaderElection.leader, ...)."""
    h = OH()
    a, b = h.sessions(2)
    for cls, name in (("Lock", "l"), ("LeaderElection", "e"), ("Semaphore", "s"),
                      ("ReadWriteLock", "rw"), ("Counter", "c")):
        h.make(cls, name, **({"permits": 3} if cls == "Semaphore" else {}))
    fence = h.ok(a, "l", "acquire")
    h.ok(b, "e", "campaign", "b's value")
    h.ok(a, "s", "acquire")
    h.ok(a, "s", "acquire")
    h.ok(b, "rw", "acquire_write")
    rows = {o["name"]: o for o in statuspage.snapshot(_node(h.kernel))["objects"]}
    assert rows["l"]["holder"] == f"session {a} (fence {fence})"
    assert rows["e"]["holder"].startswith(f"session {b} (term ")
    assert rows["s"]["holder"] == f"session {a}: 2"
    assert rows["rw"]["holder"] == f"writer: session {b}"
    assert rows["c"]["holder"] == ""            # a class without a holder
    h.ok(a, "l", "release")
    rows = {o["name"]: o for o in statuspage.snapshot(_node(h.kernel))["objects"]}
    assert rows["l"]["holder"] == ""
    assert "<th>holder</th><th>created by</th>" in statuspage.PAGE

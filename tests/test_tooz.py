"""The tooz driver (gesmas.client.tooz_driver) against a local 3-node cluster.

The cluster is conftest's `cluster` fixture (3 replicas on 127.0.0.1, stopped by pid).

- test_tooz_coordination_suite runs tooz's own functional suite (tooz.tests.test_coordination)
  in a subprocess with TOOZ_TEST_URL=gesmas://<the cluster>: it must pass, and it may skip
  only the tests in EXPECTED_SKIPS (see the README's tooz section).
- The other tests cover what that suite cannot: the one test tooz skips for us, and that the
  waits happen server-side (blocking lock acquire with a timeout, run_watchers(timeout)).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

tooz = pytest.importorskip("tooz")
pytest.importorskip("testtools")
pytest.importorskip("fixtures")

import tooz.coordination  # noqa: E402

from gesmas.server.cluster import LocalCluster  # noqa: E402

pytestmark = [pytest.mark.cluster]

#: test name -> the reason tooz's suite gives when it skips it for the gesmas driver.
EXPECTED_SKIPS = {
    # An isinstance() allow-list in tooz (etcd3gw, memcached, redis drivers only); the
    # same scenario is test_watch_join_group_disappear below, which passes.
    "test_watch_join_group_disappear":
        "This test only works with coordinators that have the ability to destroy groups.",
}


def _uid() -> bytes:
    return uuid.uuid4().hex.encode()


@pytest.fixture(scope="module")
def url(cluster: LocalCluster) -> Iterator[str]:
    saved = {k: os.environ.get(k) for k in cluster.client_env()}
    os.environ.update(cluster.client_env())       # TLS / credentials when GESMAS_TEST_SECURE
    yield f"gesmas://{cluster.addresses}"
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture
def coords(url: str) -> Iterator[Any]:
    made: list[Any] = []

    def make(member: bytes | None = None, suffix: str = "") -> Any:
        c = tooz.coordination.get_coordinator(url + suffix, member or _uid())
        c.start()
        made.append(c)
        return c

    yield make
    for c in made:
        if c.is_started:
            c.stop()


def test_tooz_coordination_suite(cluster: LocalCluster, url: str, tmp_path: Any) -> None:
    try:        # it imports every tooz driver, hence their client libraries
        import tooz.tests.test_coordination  # noqa: F401
    except ImportError as e:
        pytest.fail(f"tooz's test suite cannot be imported ({e}): "
                    "pip install -e '.[tooz-test]'")
    env = dict(os.environ, **cluster.client_env(), TOOZ_TEST_URL=url)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--pyargs", "tooz.tests.test_coordination",
         "-p", "no:cacheprovider", "-q", "-rs", "-o", "addopts=", "--rootdir", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=900, cwd=str(tmp_path))
    out = proc.stdout + proc.stderr
    summary = out.strip().splitlines()[-1]
    assert proc.returncode == 0, out[-20000:]
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|error)",
                                                     summary)}
    assert counts.get("failed", 0) == 0 and counts.get("error", 0) == 0, summary
    reasons = re.findall(r"^SKIPPED \[\d+\] [^\n]*?:\d+: (.*)$", out, re.M)
    assert sorted(reasons) == sorted(EXPECTED_SKIPS.values()), out[-5000:]
    assert counts.get("passed", 0) + len(reasons) >= 83, summary


def test_watch_join_group_disappear(coords: Any) -> None:
    """tooz's test of the same name, which its suite skips for drivers not on its list."""
    coord, client2 = coords(), coords()
    group, events = _uid(), []
    coord.create_group(group).get()
    coord.watch_join_group(group, events.append)
    coord.watch_leave_group(group, events.append)
    client2.join_group(group).get()
    while not coord.run_watchers():
        pass
    assert [type(e) for e in events] == [tooz.coordination.MemberJoinedGroup]
    events.clear()
    coord._destroy_group(group)
    while not coord.run_watchers():
        pass
    assert [type(e) for e in events] == [tooz.coordination.MemberLeftGroup]


def test_blocking_acquire_waits_server_side(coords: Any) -> None:
    a, b = coords(), coords()
    name = _uid()
    la, lb = a.get_lock(name), b.get_lock(name)
    assert la.acquire()
    start = time.monotonic()
    assert lb.acquire(blocking=0.5) is False
    assert 0.4 < time.monotonic() - start < 5
    got: list[bool] = []
    t = threading.Thread(target=lambda: got.append(lb.acquire(blocking=10)))
    t.start()
    time.sleep(0.3)
    assert la.release()
    t.join(10)
    assert got == [True] and lb.heartbeat() and not la.heartbeat()
    assert lb.release()


def test_lock_freed_when_the_session_expires(coords: Any) -> None:
    a = coords(suffix="?timeout=2")
    b = coords()
    name = _uid()
    assert a.get_lock(name).acquire()
    assert not b.get_lock(name).acquire(blocking=False)
    # a never heart-beats: its session ends after its 2 s lease and the lock passes to b
    assert b.get_lock(name).acquire(blocking=15)


def test_run_watchers_timeout_long_polls(coords: Any) -> None:
    coord, other = coords(), coords()
    group, events = _uid(), []
    coord.create_group(group).get()
    coord.watch_join_group(group, events.append)
    start = time.monotonic()
    assert coord.run_watchers(timeout=0.5) == []
    assert time.monotonic() - start >= 0.4
    threading.Timer(0.3, lambda: other.join_group(group).get()).start()
    start = time.monotonic()
    while not events and time.monotonic() - start < 10:
        coord.run_watchers(timeout=5)
    assert [e.member_id for e in events] == [other._member_id]


def test_blocking_campaign_on_run_watchers(coords: Any) -> None:
    a, b = coords(), coords()
    group, elected = _uid(), []
    a.create_group(group).get()
    a.watch_elected_as_leader(group, elected.append)
    a.run_watchers()
    b.watch_elected_as_leader(group, elected.append)
    start = time.monotonic()
    assert b.run_watchers(timeout=0.5) == []       # waits server-side as a candidate
    assert time.monotonic() - start >= 0.4
    threading.Timer(0.3, lambda: a.stand_down_group_leader(group)).start()
    b.run_watchers(timeout=10)
    assert [e.member_id for e in elected] == [a._member_id, b._member_id]
    assert b.get_leader(group).get() == b._member_id


def test_url_credentials_and_tls_options(monkeypatch: Any) -> None:
    """What the URL says (issue 26, point 11); the end-to-end run over TLS with a login is
    tests/test_security_cluster.py::test_tooz_takes_tls_and_the_login_from_the_url."""
    from gesmas.client import TLS
    from gesmas.client.tooz_driver import url_login, url_tls
    assert url_login("h:1,h:2") == ("h:1,h:2", None, None)
    assert url_login("alice@h:1") == ("h:1", "alice", None)
    assert url_login("a%3Ab:p%40ss:w@h:1,h:2") == ("h:1,h:2", "a:b", "p@ss:w")
    with pytest.raises(ValueError, match="without a user"):
        url_login(":pw@h:1")
    assert url_tls({}) is None
    assert url_tls({"tls": ["TRUE"]}) is True and url_tls({"tls": ["0"]}) is False
    assert url_tls({"tls_ca": ["ca.pem"], "tls_cert": ["c.pem"], "tls_key": ["k.pem"]}) == \
        TLS(ca="ca.pem", cert="c.pem", key="k.pem")
    with pytest.raises(ValueError, match="tls='maybe'"):
        url_tls({"tls": ["maybe"]})
    with pytest.raises(ValueError, match="tls=false with"):
        url_tls({"tls": ["false"], "tls_ca": ["ca.pem"]})
    monkeypatch.delenv("GESMAS_PASSWORD", raising=False)
    with pytest.raises(ValueError, match="user 'alice' without a password"):
        tooz.coordination.get_coordinator("gesmas://alice@127.0.0.1:1", b"m")
    monkeypatch.setenv("GESMAS_PASSWORD", "from-env")
    coord = tooz.coordination.get_coordinator("gesmas://alice@127.0.0.1:1", b"m")
    assert (coord._cluster, coord._user, coord._password) == ("127.0.0.1:1", "alice", "from-env")


def test_sequential_reads_through_the_url(coords: Any) -> None:
    """`?consistency=sequential` is that of the driver's reads (get_members, get_leader
    are declared readers: served without a log entry, by any replica); a bad value is
    refused when the coordinator is made, naming it."""
    writer = coords()
    reader = coords(suffix="?consistency=sequential")
    assert reader._client._consistency == "sequential"
    group = _uid()
    writer.create_group(group).get()
    writer.join_group(group).get()
    # a sequential read may come from a replica behind the write: never from before the
    # reader's own view, so poll until the join shows (each poll is a read)
    members: set[bytes] = set()
    for _ in range(200):
        members = reader.get_members(group).get()
        if members:
            break
    assert members == {writer._member_id}
    with pytest.raises(ValueError, match="consistency must be 'linearizable' or "
                                         "'sequential', not 'eventual'"):
        tooz.coordination.get_coordinator("gesmas://127.0.0.1:1?consistency=eventual", b"m")

"""Backup and restore (README "Backup and restore"; issue 26, point 18).

A backup is taken with `gesmas backup FILE` while a producer keeps adding items to a queue and
a short-lived session holds a lock and waits on an empty queue; a NEW 3-replica cluster is
started from the file (`gesmas server --restore FILE` on every replica). The new cluster
reports the digest the backup was taken with, holds every item acknowledged before the backup
was asked for (and only a prefix of what was produced, in order), continues the log past K (a
lock's fencing token is above it), re-runs the call that was waiting, and lets the old
sessions expire (the lock the old session held is granted to a new client once that
session's TTL has passed, and its waiting call ends); its replicas restart from their data.
Damaged files, a non-empty data dir and callers without the admin permission are refused
with the reason.
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from gesmas.client import Client, PermissionDenied, Unauthenticated
from gesmas.client.cli import main as cli
from gesmas.protocol import backups
from gesmas.server import backup
from gesmas.server.cluster import LocalCluster, free_ports
from gesmas.server.kernel import Kernel
from gesmas.server.config import HASH_SEED

pytestmark = pytest.mark.cluster

BEFORE = 40          # items acknowledged before the backup is asked for (at least)
AFTER = 20           # ... and after it is taken (at least)
HOLDER_TTL = 4.0     # the old session holding the lock: it expires that long after restore


@pytest.fixture(scope="module")
def taken(cluster, tmp_path_factory):
    """A backup of `cluster` taken while a producer runs: (path, items acknowledged before
    the backup was asked for, every item acknowledged)."""
    path = str(tmp_path_factory.mktemp("backup") / "cluster.bak")
    acked: list[int] = []
    progress = threading.Condition()
    stop = threading.Event()
    failed: list[BaseException] = []

    def produce() -> None:
        try:
            with Client(cluster.addresses, **cluster.client_options()) as p:
                q = p.queue("backup/jobs")
                while not stop.is_set():
                    q.produce(len(acked))
                    with progress:
                        acked.append(len(acked))
                        progress.notify_all()
        except BaseException as e:        # seen by the fixture, which then fails
            with progress:
                failed.append(e)
                progress.notify_all()

    def wait_for(n: int) -> None:
        with progress:
            assert progress.wait_for(lambda: len(acked) >= n or failed, 60) and not failed, \
                failed

    def wait_idle() -> None:           # blocks until the holder's session ends
        try:
            holder.queue("backup/idle").consume(timeout=600)
        except Exception:
            pass

    holder = Client(cluster.addresses, session_ttl=HOLDER_TTL, **cluster.client_options())
    producer = threading.Thread(target=produce, daemon=True)
    waiter = threading.Thread(target=wait_idle, daemon=True)
    try:
        holder.lock("backup/lock").acquire()
        waiter.start()
        producer.start()
        wait_for(BEFORE)
        with Client(cluster.addresses, connect=False, **cluster.client_options()) as probe:
            while probe.status()["waiter_count"] < 1:      # the consume waits in the server
                time.sleep(0.05)
        before = len(acked)
        assert cli(["backup", path, "--cluster", cluster.addresses]) == 0
        wait_for(len(acked) + AFTER)
    finally:
        stop.set()
        producer.join(30)
        holder.close()
        waiter.join(30)
    return path, before, list(acked)


@pytest.fixture(scope="module")
def restored(taken):
    """A new 3-replica cluster started from the backup."""
    with LocalCluster(nodes=3, restore=taken[0]) as c:
        yield c


def test_backup_file_says_what_it_holds(cluster, taken):
    head, blob = backups.read(taken[0])
    assert head.size == len(blob) > 0
    # the blob's own format (a backup's checkpoint is written as format 4), not the newest
    # this gesmas writes: a gesmas that reads format 4 can restore it
    assert head.checkpoint_format == 4 and Kernel.restore(blob).checkpoint_format == 4
    assert sorted(head.members) == sorted(m.raft_addr for m in cluster.members)
    assert head.node_id in head.members
    with Client(cluster.addresses, connect=False, **cluster.client_options()) as c:
        assert c.status()["commit_index"] > head.index


def test_restored_cluster_has_the_digest_taken_at_k(taken, restored, capsys):
    head, _ = backups.read(taken[0])
    # first thing, before any session of this test changes the state
    assert cli(["status", "--digest", "--json", "--cluster", restored.addresses]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["state_digest"] == head.state_digest
    assert shown["session_count"] == 2          # the producer's and the holder's, kept
    assert shown["waiter_count"] == 1           # the holder's consume, waiting again


def test_every_item_acknowledged_before_the_backup_is_restored(taken, restored):
    _, before, produced = taken
    with Client(restored.addresses) as c:
        q = c.queue("backup/jobs")
        n = q.size()
        assert before <= n <= len(produced)
        assert [q.consume(timeout=10) for _ in range(n)] == produced[:n]
        assert q.try_consume() is None


def test_log_goes_on_past_k_and_old_sessions_expire(taken, restored):
    head, _ = backups.read(taken[0])
    with Client(restored.addresses) as c:
        # held by the old cluster's session, released when it expires on the new one
        fence = c.lock("backup/lock").acquire(timeout=60)
        assert fence > head.index
        assert c.session > head.index
        assert c.status()["waiter_count"] == 0  # its waiting consume ended with it


def test_a_restored_replica_restarts_from_its_data_and_refuses_restore_again(taken, restored):
    """Later starts go on from the data dir (the seeded snapshot and the log since); one
    started with --restore again exits 2 without touching its data."""
    m = restored.members[0]
    restored.kill(m, signal.SIGTERM)
    env = dict(os.environ, PYTHONHASHSEED=HASH_SEED, GESMAS_CLUSTER_SECRET=restored.secret)
    before = sorted(os.listdir(m.data_dir))
    again = subprocess.run(restored.command(m) + ["--restore", taken[0]], env=env,
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and "is not empty" in again.stderr, again.stderr
    assert sorted(os.listdir(m.data_dir)) == before
    restored.start_member(m)
    with Client(restored.addresses) as c:
        c.counter("backup/after-restart").add(1)
    for other in restored.members:
        restored.wait_caught_up(other)
    digests = {restored.member_status(o, timeout=10, digest=True)["state_digest"]
               for o in restored.members}
    assert len(digests) == 1            # the restarted replica holds what the others hold


def test_restore_refuses_a_damaged_file(taken, tmp_path):
    data = open(taken[0], "rb").read()
    start = len(backups.MAGIC) + 4
    cases = {
        "truncated": data[:-1],
        "trailing bytes": data + b"\0",
        "not a gesmas backup": b"PK\3\4" + data[4:],
        "CRC does not match": data[:start + 2] + bytes([data[start + 2] ^ 1]) + data[start + 3:],
        "SHA-256 does not match": data[:-5] + bytes([data[-5] ^ 0x40]) + data[-4:],
        "ends inside its header": data[:start + 3],
    }
    for reason, damaged in cases.items():
        path = tmp_path / "damaged.bak"
        path.write_bytes(damaged)
        with pytest.raises(backups.BadBackup, match=reason):
            backups.read(str(path))
        with pytest.raises(backups.BadBackup, match=reason):
            backup.restore(str(path), str(tmp_path / "data"), ["127.0.0.1:1"], fsync=False)
        assert not (tmp_path / "data").exists()


def test_restore_refuses_a_data_dir_that_is_not_empty(taken, tmp_path):
    (tmp_path / "journal.bin").write_bytes(b"x")
    with pytest.raises(backups.BadBackup, match="not empty"):
        backup.restore(taken[0], str(tmp_path), ["127.0.0.1:1"], fsync=False)
    assert os.listdir(tmp_path) == ["journal.bin"]


def test_server_refuses_a_backup_whose_state_has_another_digest(taken, tmp_path):
    """Intact bytes, a header that lies: the server loads the checkpoint, hashes it, exits 2."""
    head, blob = backups.read(taken[0])
    lying = str(tmp_path / "lying.bak")
    backups.write(lying, dataclasses.replace(head, state_digest="0" * 64), blob, fsync=False)
    client, raft = free_ports(2)
    data = tmp_path / "data"
    env = dict(os.environ, PYTHONHASHSEED=HASH_SEED, GESMAS_CLUSTER_SECRET="s" * 32)
    run = subprocess.run(
        [sys.executable, "-m", "gesmas.client.cli", "server", "--id", "1",
         "--client-addr", f"127.0.0.1:{client}", "--raft-addr", f"127.0.0.1:{raft}",
         "--data-dir", str(data), "--restore", lying],
        env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2, run.stderr
    assert "digest" in run.stderr and "lying.bak" in run.stderr
    assert not data.exists() or not os.listdir(data)


def test_restore_only_seeds_the_data_dir_and_exits(taken, tmp_path):
    """For a unit or an init container: seed, exit 0; the replica starts later, as usual."""
    client, raft = free_ports(2)
    data = tmp_path / "data"
    env = dict(os.environ, PYTHONHASHSEED=HASH_SEED, GESMAS_CLUSTER_SECRET="s" * 32)
    cmd = [sys.executable, "-m", "gesmas.client.cli", "server", "--id", "1",
           "--client-addr", f"127.0.0.1:{client}", "--raft-addr", f"127.0.0.1:{raft}",
           "--data-dir", str(data), "--restore", taken[0], "--restore-only"]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    head, _ = backups.read(taken[0])
    assert f"restored log index {head.index}" in run.stdout
    assert os.listdir(data) == ["snapshot.bin"]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "is not empty" in run.stderr


def test_backup_needs_the_admin_permission(restored, tmp_path):
    """Last in this module: it turns auth on in the restored cluster."""
    password = "backup-root-pw"
    with Client(restored.addresses) as c:
        c.auth("user_add", name="root", password=password)
        c.auth("user_grant", name="root", role="root")
        c.auth("user_add", name="bob", password="bob-password")
        c.auth("auth_enable")
    path = str(tmp_path / "b.bak")
    with Client(restored.addresses, connect=False) as anonymous:
        with pytest.raises(Unauthenticated):
            anonymous.backup()
    with Client(restored.addresses, connect=False, user="bob",
                password="bob-password") as bob:
        with pytest.raises(PermissionDenied):
            bob.backup()
    with Client(restored.addresses, connect=False, user="root", password=password) as root:
        head, blob = root.backup()
        backups.write(path, head, blob, fsync=False)
    assert backups.read(path)[0].index == head.index

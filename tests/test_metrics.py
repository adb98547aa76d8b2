"""Prometheus metrics (issue "Operate it"): each replica serves its own on --metrics-addr."""
from __future__ import annotations

import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from gesmas.client import Client, Timeout
from gesmas.server.cluster import LocalCluster

import pytest


def scrape(addr: str) -> dict[str, list]:
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def value(families: dict, name: str, **labels: str) -> float:
    for samples in families.values():
        for s in samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    raise KeyError((name, labels))


def test_each_replica_serves_its_metrics():
    with LocalCluster(metrics=True) as cl:
        with Client(cl.addresses) as c:
            c.queue("m").produce(1)
            with pytest.raises(Timeout):
                c.queue("m2").consume(timeout=0)
            for _ in range(20):    # an election on a loaded host may fall between the reads
                leader = cl.find_leader()
                for m in cl.members:
                    cl.wait_caught_up(m)
                all_metrics = {m.node_id: scrape(m.metrics_addr) for m in cl.members}
                leaders = [n for n, f in all_metrics.items()
                           if value(f, "gesmas_raft_is_leader") == 1.0]
                if cl.find_leader().node_id == leader.node_id and leaders == [leader.node_id]:
                    break
        for node_id, f in all_metrics.items():
            for name in ("gesmas_raft_is_leader", "gesmas_raft_term", "gesmas_raft_commit_index",
                         "gesmas_raft_applied_index", "gesmas_sessions", "gesmas_objects",
                         "gesmas_waiters", "gesmas_pending_calls", "gesmas_checkpoint_bytes",
                         "gesmas_rpc_duration_seconds", "gesmas_rpc_errors",
                         "gesmas_invocation_duration_seconds", "gesmas_proposal_apply_seconds",
                         "gesmas_journal_fsync_seconds", "gesmas_journal_bytes",
                         "gesmas_checkpoint_seconds", "gesmas_raft_role_changes",
                         "gesmas_sessions_expired", "gesmas_gc_pause_seconds",
                         "gesmas_rejoining", "gesmas_snapshot_bytes", "gesmas_data_dir_bytes",
                         "gesmas_waiting_readers", "gesmas_reader_wakes",
                         "gesmas_raft_snapshot_chunks_paced"):
                assert name in f, (node_id, name)
            assert value(f, "gesmas_raft_snapshot_chunks_paced_total") == 0   # none was sent
            assert value(f, "gesmas_data_dir_bytes") >= value(f, "gesmas_journal_bytes") > 0
            assert value(f, "gesmas_rejoining") == 0.0   # a new cluster's replicas vote
            assert value(f, "gesmas_raft_is_leader") == (1.0 if node_id == leader.node_id
                                                         else 0.0)
            assert value(f, "gesmas_objects") >= 2 and value(f, "gesmas_raft_term") >= 1
        lf = all_metrics[leader.node_id]
        assert value(lf, "gesmas_rpc_duration_seconds_count", method="invoke") >= 2
        assert value(lf, "gesmas_rpc_errors_total", method="invoke", code="TIMEOUT") == 1
        assert value(lf, "gesmas_raft_peers_connected") == 2
        assert value(lf, "gesmas_invocation_duration_seconds_count", class_name="Queue",
                     method="produce") == 1
        assert value(lf, "gesmas_proposal_apply_seconds_count") >= 2
        assert value(lf, "gesmas_journal_fsync_seconds_count") >= 1
        assert value(lf, "gesmas_journal_bytes") > 0
        assert value(lf, "gesmas_raft_role_changes_total") >= 1


def test_a_silent_connection_to_the_metrics_port_is_dropped():
    """A peer that connects and sends nothing does not hold a thread of the metrics server
    for ever (a replica's serve() uses 10 s; 0.5 s here); the port still serves after."""
    import socket
    import time

    from gesmas.server.metrics import Metrics

    m = Metrics(node=None)  # type: ignore[arg-type]
    server = m.serve("127.0.0.1:0", idle_timeout=0.5)
    try:
        host, port = server.server_address[:2]
        with socket.create_connection((host, port), timeout=30) as s:
            started = time.monotonic()
            assert s.recv(1) == b""                  # closed by the server, not by us
            assert time.monotonic() - started < 29
        with pytest.raises(urllib.error.HTTPError) as err:     # (no node behind this one)
            urllib.request.urlopen(f"http://{host}:{port}/elsewhere", timeout=10)
        assert err.value.code == 404 and b"/metrics" in err.value.read()
    finally:
        server.shutdown()
        server.server_close()
        m.close()


def test_the_garbage_collectors_pauses_are_observed_until_closed():
    import gc

    from gesmas.server.metrics import Metrics

    m = Metrics(node=None)  # type: ignore[arg-type]

    def full() -> float:
        return sum(x.value for f in m.gc_pause.collect() for x in f.samples
                   if x.name.endswith("_count") and x.labels.get("generation") == "2")
    before = full()
    gc.collect()
    assert full() >= before + 1        # (an automatic full pass may come on top)
    m.close()
    closed = full()
    gc.collect()
    assert full() == closed and m._on_gc not in gc.callbacks


def test_the_disk_gauges_count_the_whole_journal_the_snapshot_and_the_data_dir(tmp_path):
    """gesmas_journal_bytes is the log (buffered records too) and the meta file;
    gesmas_snapshot_bytes the snapshot; gesmas_data_dir_bytes every file, a snapshot being
    received and files in sub-directories included: what `du` would add up."""
    import os
    from types import SimpleNamespace

    from gesmas.server.metrics import NodeCollector
    from gesmas.server.replication.journal import DurableJournal
    from gesmas.server.replication.replica import SNAPSHOT_NAME

    journal = DurableJournal(str(tmp_path), fsync=False)
    try:
        for i in range(1, 101):
            journal.add(b"x" * 100, i, 1)
        journal.setCurrentTerm(1, "a")                    # syncs, writes the meta file
        journal.add(b"y" * 1000, 101, 1)                  # buffered, not yet written
        (tmp_path / SNAPSHOT_NAME).write_bytes(b"s" * 50_000)
        (tmp_path / (SNAPSHOT_NAME + ".1.tmp")).write_bytes(b"r" * 7_000)
        (tmp_path / "sub").mkdir()
        (tmp_path / "sub" / SNAPSHOT_NAME).write_bytes(b"n" * 300)  # not the snapshot
        node = SimpleNamespace(replica=SimpleNamespace(status=lambda: {}, _journal=journal,
                                                       data_dir=str(tmp_path)),
                               kernel=None, calls={})
        got = {f.name: f.samples[0].value for f in NodeCollector(node).collect()}
        log = os.path.getsize(tmp_path / "raft.log")
        meta = os.path.getsize(tmp_path / "raft.meta")
        assert log > 100 * 100 and meta > 0
        assert got["gesmas_journal_bytes"] == log + meta + 1000 + 24 == journal.files_size()
        assert got["gesmas_snapshot_bytes"] == 50_000
        on_disk = sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file())
        assert got["gesmas_data_dir_bytes"] == on_disk
        assert on_disk >= log + meta + 50_000 + 7_000 + 300
    finally:
        journal._destroy()

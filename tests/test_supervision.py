"""Supervision (issue "Operate it"): a replica that can no longer apply the log exits
non-zero instead of serving errors, and `gesmas up` keeps the cluster serving when a node
dies, says so, and restarts that node on its data dir."""
from __future__ import annotations

import threading
import time


from gesmas.client import Client
from gesmas.server import up as cluster_mod
from gesmas.server import main as server_main
from gesmas.server.cluster import LocalCluster, free_ports


class FailingReplica:
    """Stands in for replication.Replica: reports a fatal error shortly after it starts."""

    def __init__(self, **kw):
        self.fatal = None
        self._on_fatal = kw["on_fatal"]
        threading.Timer(0.2, self._fail).start()

    def _fail(self):
        self.fatal = OSError("journal write failed (test)")
        self._on_fatal(self.fatal)

    def is_leader(self):
        return False

    def leader(self):
        return None

    def status(self):
        return {}

    def destroy(self):
        pass


def test_a_replica_that_cannot_apply_exits_with_3(monkeypatch, tmp_path, capsys):
    import gesmas.server.replication as replication
    monkeypatch.setattr(replication, "Replica", FailingReplica)
    monkeypatch.setattr(server_main, "ensure_hash_seed", lambda: None)
    client, raft = free_ports(2)
    args = server_main_args(tmp_path, client, raft)
    assert server_main.run_server(args) == 3
    assert "can no longer apply the log" in capsys.readouterr().err


def server_main_args(tmp_path, client, raft):
    from gesmas.client import cli
    return cli.build_parser().parse_args([
        "server", "--id", "1", "--client-addr", f"127.0.0.1:{client}",
        "--raft-addr", f"127.0.0.1:{raft}", "--data-dir", str(tmp_path / "d"),
        "--secret", "s"])


def test_gesmas_up_restarts_a_killed_node_while_the_others_serve(monkeypatch, capfd):
    monkeypatch.setattr(cluster_mod, "RESTART_PAUSE", 0.1)
    with LocalCluster() as cl:
        done = threading.Event()
        t = threading.Thread(target=cluster_mod.supervise, args=(cl, 0.1, done.is_set))
        t.start()
        try:
            victim = cl.members[1]
            old = victim.proc.pid
            with Client(cl.addresses, retry_timeout=30) as c:
                cl.kill(victim)
                c.queue("sup").produce("while one is down")     # the others serve
                deadline = time.monotonic() + 30
                while not (cl.alive(victim) and victim.proc.pid != old):
                    assert time.monotonic() < deadline, "the node was not restarted"
                    time.sleep(0.05)
                cl.wait_caught_up(victim)
                assert c.queue("sup").consume(timeout=5) == "while one is down"
        finally:
            done.set()
            t.join(10)
    assert f"node {victim.node_id} exited with -9; the others keep serving; restarting" \
        in capfd.readouterr().err


def test_a_stop_signal_while_the_replica_starts_is_a_clean_stop(monkeypatch, tmp_path):
    """SIGINT before the event loop handles it (during the imports and the configuration) is
    recorded, not raised: a KeyboardInterrupt there could be swallowed by a bare `except:`
    in an import and turn into a misleading failure (exit 1). The replica exits 0 at once."""
    import os
    import signal

    import gesmas.server.node as node_mod
    monkeypatch.setattr(server_main, "ensure_hash_seed", lambda: None)
    real_load = server_main.load_config

    def load_and_interrupt(flags):
        os.kill(os.getpid(), signal.SIGINT)       # a Ctrl-C while the replica starts
        return real_load(flags)

    def no_node(*a, **kw):
        raise AssertionError("a replica asked to stop while starting must not serve")

    monkeypatch.setattr(server_main, "load_config", load_and_interrupt)
    monkeypatch.setattr(node_mod, "Node", no_node)
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        client, raft = free_ports(2)
        assert server_main.run_server(server_main_args(tmp_path, client, raft)) == 0
    finally:
        for s, h in saved.items():
            signal.signal(s, h)

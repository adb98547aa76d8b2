"""The server's configuration: flags, the --config file and the environment are merged in
one place (gesmas.server.config), with one precedence order."""
from __future__ import annotations

import json

import pytest

from gesmas.client import cli
from gesmas.server import config as server_config
from gesmas.server.config import ConfigError, load
from gesmas.server.node import Node


def flags(argv: list[str]) -> dict:
    return vars(cli.build_parser().parse_args(["server", *argv]))


def write(tmp_path, data) -> str:
    path = tmp_path / "node.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_flags_override_the_file_which_overrides_the_environment(tmp_path):
    path = write(tmp_path, {"id": 2, "client_addr": "h:7102", "raft-addr": "127.0.0.1:7202",
                            "peers": ["127.0.0.1:7201=h:7101", "127.0.0.1:7203"],
                            "data-dir": "/d", "checkpoint_every": 500})
    cfg = load(flags(["--config", path, "--client-addr", "0.0.0.0:9", "--insecure"]),
               {"GESMAS_CLUSTER_SECRET": "s3cret", "GESMAS_CHECKPOINT_EVERY": "7"})
    assert (cfg.node_id, cfg.client_addr, cfg.raft_addr, cfg.data_dir, cfg.secret, cfg.fsync,
            cfg.checkpoint_every) == (2, "0.0.0.0:9", "127.0.0.1:7202", "/d", "s3cret", True,
                                      500)
    assert cfg.peers == (("127.0.0.1:7201", "h:7101"), ("127.0.0.1:7203", ""))
    cfg = load(flags(["--id", "1", "--client-addr", "127.0.0.1:1", "--raft-addr", "127.0.0.1:2",
                      "--peers", "127.0.0.1:3,127.0.0.1:4", "--unsafe-no-fsync", "--secret",
                      "s4"]), {"GESMAS_CHECKPOINT_EVERY": "7", "GESMAS_CLUSTER_SECRET": "env"})
    assert cfg.peers == (("127.0.0.1:3", ""), ("127.0.0.1:4", ""))
    assert (cfg.checkpoint_every, cfg.fsync, cfg.secret, cfg.data_dir) == (
        7, False, "s4", "gesmas-data-1")
    assert cfg.snapshot_every == 20_000
    cfg = load(flags(["--id", "1", "--client-addr", "127.0.0.1:1", "--raft-addr", "127.0.0.1:2",
                      "--secret", "s", "--snapshot-every", "500"]),
               {"GESMAS_SNAPSHOT_EVERY": "9000"})
    assert cfg.snapshot_every == 500
    assert load(flags(["--id", "1", "--client-addr", "127.0.0.1:1", "--raft-addr",
                       "127.0.0.1:2", "--secret", "s"]),
                {"GESMAS_SNAPSHOT_EVERY": "9000"}).snapshot_every == 9000


def test_skip_entries_from_flags_and_config_file_reach_the_kernel(tmp_path):
    base = ["--id", "1", "--client-addr", "127.0.0.1:1", "--raft-addr", "127.0.0.1:2",
            "--secret", "s"]
    cfg = load(flags([*base, "--skip-entry", "7", "--skip-entry", "9"]), {})
    assert cfg.skip_entries == frozenset({7, 9})
    path = write(tmp_path, {"skip_entries": [12]})
    assert load(flags([*base, "--config", path]), {}).skip_entries == frozenset({12})
    assert load(flags(base), {}).skip_entries == frozenset()
    kernel = Node(cfg).make_state_machine().kernel
    assert kernel.config.skip_entries == frozenset({7, 9})


@pytest.mark.parametrize("data,message", [
    ({"colour": "red"}, "unknown key 'colour'"),
    ([1, 2], "expected a JSON object"),
    ({"id": "two", "client_addr": "h:1", "raft_addr": "127.0.0.1:2"}, "id must be an integer"),
    ({"id": 1, "client_addr": "h:1"}, "are required"),
    ({"id": 1, "client_addr": "h:1", "raft_addr": "10.0.0.1:2"}, "secret"),
    ({"id": 1, "client_addr": "127.0.0.1:1", "raft_addr": "127.0.0.1:2"}, "secret"),
    ({"id": 1, "client_addr": "127.0.0.1:1", "raft_addr": "127.0.0.1:2", "secret": "s",
      "skip_entries": 5}, "skip_entries"),
    ({"id": 1, "client_addr": "127.0.0.1:1", "raft_addr": "127.0.0.1:2", "peers": 5}, "peers"),
    ({"id": 1, "client_addr": "10.1.1.1:1", "raft_addr": "127.0.0.1:2", "secret": "s"},
     "not loopback: give it TLS"),
    ({"id": 1, "client_addr": "127.0.0.1:1", "raft_addr": "127.0.0.1:2", "secret": "s",
      "tls_cert": "/nonexistent.pem"}, "both --tls-cert and --tls-key"),
    ({"id": 1, "client_addr": "127.0.0.1:1", "raft_addr": "127.0.0.1:2", "secret": "s",
      "tls_cert": "/nonexistent.pem", "tls_key": "/nonexistent.key"}, "no such file"),
    ({"id": 1, "client_addr": "127.0.0.1:1", "raft_addr": "127.0.0.1:2", "secret": "s",
      "root_password_file": "/nonexistent"}, "root_password_file"),
    ({"id": 1, "client_addr": "127.0.0.1:1", "raft_addr": "127.0.0.1:2", "secret": "s",
      "snapshot_every": 5}, "snapshot_every must be at least 100, not 5"),
    ({"id": 1, "client_addr": "127.0.0.1:1", "raft_addr": "127.0.0.1:2", "secret": "s",
      "snapshot_every": "often"}, "snapshot_every must be an integer"),
])
def test_bad_configurations_are_refused_naming_the_setting(tmp_path, data, message):
    with pytest.raises(ConfigError, match=message):
        load(flags(["--config", write(tmp_path, data)]), {})


def test_the_cli_reports_a_bad_configuration_as_a_usage_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("gesmas.server.main.ensure_hash_seed", lambda: None)
    rc = cli.main(["server", "--config", write(tmp_path, {"colour": "red"})])
    err = capsys.readouterr().err
    assert rc == 2 and "unknown key 'colour'" in err and err.startswith("gesmas: ")


def test_loopback_addresses():
    assert all(server_config.is_loopback(a) for a in
               ["127.0.0.1:1", "127.9.9.9:2", "localhost:3", "[::1]:4"])
    assert not any(server_config.is_loopback(a) for a in
                   ["10.0.0.1:1", "127.example.com:2", "0.0.0.0:3", "[::]:4"])


def test_a_public_client_port_needs_tls_and_a_root_password_or_insecure(tmp_path):
    from gesmas.server.certs import make_pki
    pki = make_pki(str(tmp_path / "pki"))
    short, good = tmp_path / "short", tmp_path / "root-password"
    short.write_text("abc\n")
    good.write_text("a-long-root-password\n")
    base = ["--id", "1", "--client-addr", "10.1.1.1:7101", "--raft-addr", "10.1.1.1:7201"]
    env = {"GESMAS_CLUSTER_SECRET": "s"}
    with pytest.raises(ConfigError, match="not loopback"):
        load(flags(base), env)
    with pytest.raises(ConfigError, match="not loopback"):   # TLS alone is not enough
        load(flags([*base, "--tls-cert", pki.server_cert, "--tls-key", pki.server_key]), env)
    with pytest.raises(ConfigError, match="at least 8"):
        load(flags([*base, "--root-password-file", str(short)]), env)
    cfg = load(flags([*base, "--root-password-file", str(good)]),
               {**env, "GESMAS_TLS_CERT": pki.server_cert, "GESMAS_TLS_KEY": pki.server_key,
                "GESMAS_TLS_CLIENT_CA": pki.ca_cert})
    assert (cfg.root_password, cfg.tls_cert, cfg.tls_client_ca, cfg.insecure) == (
        "a-long-root-password", pki.server_cert, pki.ca_cert, False)
    assert load(flags([*base, "--insecure"]), env).insecure
    assert load(flags(base), {**env, "GESMAS_INSECURE": "1"}).insecure
    assert Node(cfg).requires_auth()              # until the cluster has auth enabled


def test_status_gives_a_replica_its_own_log_end_as_its_match_index():
    """The leader counts a follower's match index up to the end of the follower's log: its
    own row counts the same (its log end), not its applied index, which lags while entries
    are committed and applied, so that `gesmas status` never shows the leader behind the
    followers it replicates to."""
    from types import SimpleNamespace
    peers = (("127.0.0.1:4", "127.0.0.1:3"),)
    node = Node(server_config.NodeConfig(1, "127.0.0.1:1", "127.0.0.1:2", peers, "/tmp/x", "s"))
    raft = {"term": 2, "commit_index": 41, "last_applied": 40, "log_last_index": 42,
            "leader": "127.0.0.1:2",
            "peers": {"127.0.0.1:4": {"connected": True, "match_index": 42}}}
    node.replica = SimpleNamespace(status=lambda: raft, is_leader=lambda: True,
                                   leader=lambda: "127.0.0.1:2")
    me, peer = node.status()["nodes"]
    assert (me["node_id"], me["match_index"]) == ("127.0.0.1:2", 42)
    assert (peer["node_id"], peer["match_index"]) == ("127.0.0.1:4", 42)
    raft["log_last_index"] = None          # compacted under the read: the applied index
    assert node.status()["nodes"][0]["match_index"] == 40


@pytest.mark.parametrize("value", ["0", "-3", "abc", "inf", "nan", "1e9"])
def test_a_bad_switch_interval_is_a_usage_error_and_a_good_one_is_applied(
        tmp_path, capsys, monkeypatch, value):
    """GESMAS_SWITCH_INTERVAL_MS (main.tune_switching): a value that is not a number of
    milliseconds from 0.01 to 1000 stops the server with a usage error naming it, before
    anything starts; unset, replicas take 1 ms; a good value is applied as it is."""
    import sys

    from gesmas.server import main
    monkeypatch.setattr("gesmas.server.main.ensure_hash_seed", lambda: None)
    before = sys.getswitchinterval()
    try:
        monkeypatch.setenv("GESMAS_SWITCH_INTERVAL_MS", value)
        good = {"id": 1, "client_addr": "127.0.0.1:1", "raft_addr": "127.0.0.1:2",
                "data_dir": str(tmp_path / "d"), "insecure": True,
                "secret": "s3cret-for-tests"}
        rc = cli.main(["server", "--config", write(tmp_path, good)])
        err = capsys.readouterr().err
        assert rc == 2 and "GESMAS_SWITCH_INTERVAL_MS" in err and repr(value) in err, err
        assert sys.getswitchinterval() == before
        monkeypatch.setenv("GESMAS_SWITCH_INTERVAL_MS", "2.5")
        main.tune_switching()
        assert sys.getswitchinterval() == pytest.approx(0.0025)
        monkeypatch.delenv("GESMAS_SWITCH_INTERVAL_MS")
        main.tune_switching()
        assert sys.getswitchinterval() == pytest.approx(main.SWITCH_INTERVAL_MS / 1000)
    finally:
        sys.setswitchinterval(before)


@pytest.mark.parametrize("name,value", [
    ("GESMAS_CAPTURE_SHARE", "0"), ("GESMAS_CAPTURE_SHARE", "1.5"),
    ("GESMAS_CAPTURE_SHARE", "half"), ("GESMAS_CAPTURE_SHARE", "nan"),
    ("GESMAS_SNAPSHOT_RATE", "-1"), ("GESMAS_SNAPSHOT_RATE", "fast"),
    ("GESMAS_SNAPSHOT_STAGGER", "-2"), ("GESMAS_SNAPSHOT_STAGGER", "later")])
def test_a_bad_tuning_variable_is_a_usage_error(tmp_path, capsys, monkeypatch, name, value):
    """GESMAS_CAPTURE_SHARE (replication/apply_thread.py), GESMAS_SNAPSHOT_RATE and
    GESMAS_SNAPSHOT_STAGGER (replication/catchup.py): refused by name before anything starts, as the switch
    interval is, rather than by the replica as it starts."""
    monkeypatch.setattr("gesmas.server.main.ensure_hash_seed", lambda: None)
    monkeypatch.setenv(name, value)
    good = {"id": 1, "client_addr": "127.0.0.1:1", "raft_addr": "127.0.0.1:2",
            "data_dir": str(tmp_path / "d"), "insecure": True, "secret": "s3cret-for-tests"}
    rc = cli.main(["server", "--config", write(tmp_path, good)])
    err = capsys.readouterr().err
    assert rc == 2 and name in err and repr(value) in err, err
    assert not (tmp_path / "d").exists()

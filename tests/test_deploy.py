"""The files in deploy/ use only commands, flags, config keys and environment variables that
exist (no container runtime needed), and the environment they give a node loads into the
configuration they mean."""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from gesmas.client import cli
from gesmas.server import config as server_config
from gesmas.server.certs import make_pki

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
FILES = ["Dockerfile", "compose.yaml", "k8s/gesmas.yaml", "gesmas.service"]
CLIENT_ENV = {"GESMAS_CLUSTER", "GESMAS_TLS_CA", "GESMAS_TLS_CERT", "GESMAS_TLS_KEY",
              "GESMAS_USER", "GESMAS_PASSWORD", "GESMAS_LOG", "GESMAS_LOG_FORMAT"}


def text(name: str) -> str:
    return (DEPLOY / name).read_text(encoding="utf-8")


@pytest.mark.parametrize("name", FILES)
def test_every_environment_variable_exists(name):
    known = set(server_config.ENV.values()) | CLIENT_ENV
    used = set(re.findall(r"\bGESMAS_[A-Z_]+\b", text(name)))
    assert used <= known, sorted(used - known)


@pytest.mark.parametrize("name", FILES)
def test_every_gesmas_command_line_parses(name):
    """Commands in the files (and in their comments) are accepted by the real CLI parser."""
    parser = cli.build_parser()
    found = 0
    for line in text(name).splitlines():
        # a command: at the start of a (comment) line, or after a path (bin/gesmas)
        m = re.search(r"(?:^#?\s*|/)(gesmas (server|certs|user|role|auth|status|up)\b"
                      r"[^\n\"']*)", line)
        if not m or "gesmas server --config" in line and name != "gesmas.service":
            continue
        argv = shlex.split(m.group(1).replace("$(cat", "x #"), comments=True)[1:]
        argv = [a for a in argv if not a.startswith("$")]
        parser.parse_args(argv)                  # raises UsageError on an unknown flag
        found += 1
    if name in ("Dockerfile",):
        entry = json.loads(re.search(r"ENTRYPOINT (\[.*\])", text(name)).group(1))
        assert entry[:2] == ["tini", "--"]     # PID 1 that the watchdog's SIGKILL can reach
        entry = entry[2:]
        assert entry[0] == "gesmas"
        parser.parse_args(entry[1:] + ["--id", "1"])
        found += 1
    if name == "k8s/gesmas.yaml":
        args = json.loads(re.search(r"args: (\[.*\])", text(name)).group(1))
        parser.parse_args(["server", *args])
        found += 1
    assert found or name == "compose.yaml", f"no gesmas command found in {name}"


def test_the_sample_config_file_has_only_known_keys():
    data = json.loads(text("node1.json"))
    assert set(k.replace("-", "_") for k in data) <= set(server_config.KEYS)


def compose_env(node: str) -> dict[str, str]:
    """The environment compose.yaml gives `node` (the shared block, then its own)."""
    src = text("compose.yaml")
    shared = dict(re.findall(r"^    (GESMAS_[A-Z_]+): (.+)$", src, re.M))
    own = re.search(rf"^  {node}:\n(?:.*\n)*?    environment: \{{(.*)\}}", src, re.M)
    assert own, node
    env = dict(shared)
    for key, value in re.findall(r"(GESMAS_[A-Z_]+): \"?([^\",}]+)\"?", own.group(1)):
        env[key] = value
    return {k: v.strip().strip('"') for k, v in env.items()}


def test_the_compose_environment_loads_as_a_secure_node(tmp_path):
    pki = make_pki(str(tmp_path), hosts=["node1", "node2", "node3"])
    (tmp_path / "secret").write_text("0123456789abcdef0123\n")
    (tmp_path / "root").write_text("a-long-root-password\n")
    env = compose_env("node2")
    env.update(GESMAS_SECRET_FILE=str(tmp_path / "secret"),
               GESMAS_ROOT_PASSWORD_FILE=str(tmp_path / "root"),
               GESMAS_TLS_CERT=pki.server_cert, GESMAS_TLS_KEY=pki.server_key,
               GESMAS_DATA_DIR=str(tmp_path / "data"))
    flags = vars(cli.build_parser().parse_args(["server"]))
    c = server_config.load(flags, env)
    assert (c.node_id, c.client_addr, c.raft_addr) == (2, "node2:7101", "node2:7201")
    assert c.peers == (("node1:7201", "node1:7101"), ("node3:7201", "node3:7101"))
    assert c.secret == "0123456789abcdef0123" and c.root_password == "a-long-root-password"
    assert (c.metrics_addr, c.log_format, c.insecure) == ("0.0.0.0:9100", "json", False)


def test_the_statefulset_derives_the_node_id_from_the_pod_ordinal(tmp_path, monkeypatch):
    import socket
    monkeypatch.setattr(socket, "gethostname", lambda: "gesmas-2")
    flags = vars(cli.build_parser().parse_args(["server", "--id", "from-hostname"]))
    env = {"GESMAS_CLIENT_ADDR": "127.0.0.1:7101", "GESMAS_RAFT_ADDR": "127.0.0.1:7201",
           "GESMAS_CLUSTER_SECRET": "s", "GESMAS_PEERS": "127.0.0.1:7201=127.0.0.1:7101,"
                                                        "127.0.0.2:7201=127.0.0.2:7101"}
    c = server_config.load(flags, env)
    assert c.node_id == 3 and c.peers == (("127.0.0.2:7201", "127.0.0.2:7101"),)
    monkeypatch.setattr(socket, "gethostname", lambda: "gesmas")
    with pytest.raises(server_config.ConfigError, match="ordinal"):
        server_config.load(flags, env)


def test_the_grafana_dashboard_uses_only_metrics_a_replica_serves():
    import gesmas.server.metrics as metrics_mod
    dash = json.loads(text("grafana-dashboard.json"))
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    used = {re.sub(r"_(bucket|count|sum)$", "", m)
            for e in exprs for m in re.findall(r"\bgesmas_[a-z_]+\b", e)}
    served = set(re.findall(r"\"(gesmas_[a-z_]+)\"", Path(metrics_mod.__file__).read_text()))
    served = {re.sub(r"_total$", "", s) for s in served} | served
    assert used and used <= served, sorted(used - served)

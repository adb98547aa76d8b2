"""The files in deploy/ use only commands, flags, config keys and environment variables that
exist (no container runtime needed), and the environment they give a node loads into the
configuration they mean."""
from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from gesmas.client import cli
from gesmas.server import config as server_config
from gesmas.server.certs import make_pki

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
FILES = ["Dockerfile", "compose.yaml", "k8s/gesmas.yaml", "gesmas.service"]
CLIENT_ENV = {"GESMAS_CLUSTER", "GESMAS_TLS_CA", "GESMAS_TLS_CERT", "GESMAS_TLS_KEY",
              "GESMAS_USER", "GESMAS_PASSWORD", "GESMAS_LOG", "GESMAS_LOG_FORMAT",
              "GESMAS_HEALTH_ADDR"}        # read by `gesmas health`


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


# --- properties of the deploy files (issue 26: probes, restart policy, health, context) -----

def _yaml(name: str):
    import yaml                             # a dev dependency (pyproject.toml)
    return list(yaml.safe_load_all(text(name)))


def _statefulset_container() -> dict:
    [sts] = [d for d in _yaml("k8s/gesmas.yaml") if d and d.get("kind") == "StatefulSet"]
    [container] = sts["spec"]["template"]["spec"]["containers"]
    return container


def _health_args(command: list[str]) -> list[str]:
    """The argv of a `gesmas health` probe command, parsed by the real CLI parser."""
    assert command[:2] == ["gesmas", "health"], command
    args = cli.build_parser().parse_args(command[1:])
    assert args.func is cli.cmd_health
    return command[2:]


def test_the_k8s_probes_run_gesmas_health_and_liveness_is_local():
    c = _statefulset_container()
    ready, live = c["readinessProbe"], c["livenessProbe"]
    # the kubelet's grpc probe speaks no TLS: both are exec probes of the TLS-aware command
    assert "grpc" not in ready and "grpc" not in live
    assert "--live" not in _health_args(ready["exec"]["command"])     # readiness: SERVING
    assert "--live" in _health_args(live["exec"]["command"])          # liveness: it answers
    # the probe commands take what they need from the container's environment (the kubelet
    # does not expand $(VAR) in exec probes): the CA, the pod's address, the certificate name
    env = {e["name"]: e for e in c["env"]}
    assert env["GESMAS_TLS_CA"]["value"].startswith("/etc/gesmas/")
    assert env["GESMAS_HEALTH_ADDR"]["value"] == "$(POD_IP):7101"
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert env["GESMAS_CLIENT_ADDR"]["value"].startswith("$(POD_NAME).gesmas:")
    names = list(env)
    assert names.index("POD_IP") < names.index("GESMAS_HEALTH_ADDR")   # defined before use
    # every probe gives the command time to answer (its own --timeout is shorter)
    for probe in (ready, live):
        cmd = probe["exec"]["command"]
        assert float(cmd[cmd.index("--timeout") + 1]) < probe["timeoutSeconds"]
    assert "--from-file=ca.pem" in text("k8s/gesmas.yaml")


def test_the_compose_nodes_have_a_health_check_and_the_secrets_it_needs():
    [compose] = _yaml("compose.yaml")
    for name, service in compose["services"].items():
        check = service["healthcheck"]
        test = check["test"]
        assert test[0] == "CMD" and "--live" not in _health_args(test[1:]), name
        env = service["environment"]
        assert env["GESMAS_TLS_CA"] == "/run/secrets/ca-cert"
        assert env["GESMAS_CLIENT_ADDR"].startswith(f"{name}:")   # what `health` dials
        assert "ca-cert" in service["secrets"]
    assert compose["secrets"]["ca-cert"] == {"file": "./secrets/ca.pem"}
    # the image's user (uid 10001) reads the server key through a file secret: the documented
    # `gesmas certs` makes it readable (and parses: test_every_gesmas_command_line_parses)
    certs = re.search(r"^#\s*(gesmas certs .*)$", text("compose.yaml"), re.M).group(1)
    assert "--server-key-mode 0644" in certs
    assert "USER gesmas" in text("Dockerfile") and "--uid 10001" in text("Dockerfile")
    assert "chmod 0644 deploy/secrets/cluster-secret deploy/secrets/root-password" in \
        text("compose.yaml")


def test_the_server_key_mode_option_makes_a_key_a_container_can_read(tmp_path):
    import os
    import stat
    d = tmp_path / "secrets"
    args = cli.build_parser().parse_args(["certs", str(d), "--hosts", "node1",
                                          "--server-key-mode", "0644"])
    assert args.func(args) == 0
    mode = lambda p: stat.S_IMODE(os.stat(p).st_mode)      # noqa: E731
    assert mode(d / "server.key") == 0o644
    assert mode(d) == 0o700                                 # only its owner gets in
    assert mode(d / "ca.key") == 0o600 and mode(d / "client-root.key") == 0o600
    plain = tmp_path / "plain"
    args = cli.build_parser().parse_args(["certs", str(plain)])
    assert args.func(args) == 0 and mode(plain / "server.key") == 0o600
    with pytest.raises(cli.UsageError):
        cli.build_parser().parse_args(["certs", str(d), "--server-key-mode", "0200"])


def test_the_systemd_unit_does_not_restart_a_replica_that_stopped_on_purpose():
    import configparser
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str                                  # keys are case-sensitive
    unit.read_string(text("gesmas.service"))
    service = unit["Service"]
    assert service["Restart"] == "on-failure"
    assert service["RestartPreventExitStatus"].split() == ["3"]
    # 3 is what gesmas server returns when it stops on purpose (server/main.py)
    src = (Path(server_config.__file__).parent / "main.py").read_text()
    assert src.count("return 3") >= 2 and "RestartPreventExitStatus=3" in \
        (DEPLOY / "README.md").read_text()
    # the data dir in node.json is the one systemd makes for the unit's user
    assert service["StateDirectory"] == "gesmas" and service["User"] == "gesmas"
    assert json.loads(text("node1.json"))["data_dir"] == "/var/lib/gesmas"
    assert "--new-cluster" not in service["ExecStart"]
    readme = (DEPLOY / "README.md").read_text()
    assert "python3 -m venv /opt/gesmas/.venv" in readme and "useradd" in readme


def test_the_dockerignore_keeps_the_build_context_small_and_secret_free():
    path = DEPLOY.parent / ".dockerignore"
    entries = {line.strip() for line in path.read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert {".venv", ".git", "**/__pycache__", ".pytest_cache", ".mypy_cache",
            "deploy/secrets", "data"} <= entries
    # nothing the Dockerfile copies is left out
    copied = {w for line in text("Dockerfile").splitlines() if line.startswith("COPY ")
              and "--from" not in line for w in line.split()[1:-1]}
    assert copied and not copied & entries, copied & entries


def test_make_run_installs_the_runtime_only_and_make_test_the_test_tools(tmp_path):
    """`make run` from a fresh clone installs gesmas and its runtime dependencies (70 MB
    measured, against 373 MB with the test and benchmark extras); `make test` adds the
    extras, and says why before it installs chromium (dry runs: nothing is installed)."""
    root = DEPLOY.parent
    venv = str(tmp_path / "venv")

    def dry(*goal: str) -> str:
        return subprocess.run(["make", "-n", "-s", "--no-print-directory", "-C", str(root),
                               f"VENV={venv}", *goal],
                              capture_output=True, text=True, check=True).stdout
    run = dry("run")
    assert "pip install -q -e .\n" in run and "[dev" not in run and "chromium" not in run
    assert "-m gesmas.server.demo --base-port 7100" in run
    test = dry("test")
    assert "pip install -q -e .\n" in test and "'.[dev,bench,tooz-test]'" in test
    assert "needs a headless browser" in test and "INSTALL_CHROMIUM=no" in test
    # without chromium on the PATH and told not to install it: says so, installs nothing
    shown = subprocess.run([shutil.which("make") or "make", "-s", "-C", str(root), "chromium",
                            "INSTALL_CHROMIUM=no"], env={"PATH": str(tmp_path)},
                           capture_output=True, text=True, check=True).stdout
    assert "needs a headless browser and chromium is missing" in shown
    assert "not installing it" in shown and "installing Debian" not in shown

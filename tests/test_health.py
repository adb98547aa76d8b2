"""gRPC health checking and server reflection on a replica's client port (issue "Operate
it"): SERVING only while the replica knows a leader and keeps up with the log, so that a load
balancer or a Kubernetes probe routes around a replica cut off from the others."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase)

from gesmas.server.cluster import LocalCluster

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def check(address: str, service: str = "") -> int:
    with grpc.insecure_channel(address) as ch:
        return health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=5).status


def wait_status(address: str, want: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while check(address) != want:
        assert time.monotonic() < deadline, f"{address} never became {want}"
        time.sleep(0.1)


def test_serving_while_a_quorum_is_reachable_and_reflection_lists_the_service():
    with LocalCluster() as cl:
        for m in cl.members:
            wait_status(m.client_addr, SERVING)
            assert check(m.client_addr, "gesmas.v1.Gesmas") == SERVING
        with grpc.insecure_channel(cl.members[0].client_addr) as ch:
            services = set(ProtoReflectionDescriptorDatabase(ch).get_services())
        assert {"gesmas.v1.Gesmas", "grpc.health.v1.Health"} <= services
        survivor = cl.members[0]
        for m in cl.members[1:]:
            cl.kill(m)                      # alone, it loses the leader: route around it
        wait_status(survivor.client_addr, NOT_SERVING)
        for m in cl.members[1:]:
            cl.start_member(m)
        wait_status(survivor.client_addr, SERVING, 60)


# --- `gesmas health`: the container probes (deploy/k8s, deploy/compose.yaml) ----------------

def probe(env: dict[str, str], *args: str) -> tuple[int, str]:
    """Run `gesmas health ARGS` as a probe runs it: a fresh process with the container's
    environment (no flags but ARGS); (exit status, stdout + stderr)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("GESMAS_")}
    done = subprocess.run([sys.executable, "-m", "gesmas.client.cli", "health", *args],
                          env={**base, **env}, capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout + done.stderr


def wait_probe(env: dict[str, str], args: tuple[str, ...], want: int,
               timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        code, out = probe(env, *args)
        if code == want:
            return out
        assert time.monotonic() < deadline, f"gesmas health {args} never exited {want}: {out}"
        time.sleep(0.2)


def test_the_probe_command_speaks_tls_and_liveness_is_local():
    """The kubelet's gRPC probe has no TLS, so deploy/k8s runs `gesmas health` (readiness) and
    `gesmas health --live` (liveness) in the container. As there: the replica's certificate is
    for the host of GESMAS_CLIENT_ADDR (here `localhost`), the probe dials GESMAS_HEALTH_ADDR
    (the pod's IP: here 127.0.0.1) and trusts GESMAS_TLS_CA. Readiness needs a leader;
    liveness only needs the process to answer, so a quorum loss does not get every survivor
    restarted, while a hung replica fails it."""
    with LocalCluster(secure=True) as cl:
        m = cl.members[0]
        port = m.client_addr.rsplit(":", 1)[1]
        pod = {"GESMAS_CLIENT_ADDR": f"localhost:{port}",
               "GESMAS_HEALTH_ADDR": f"127.0.0.1:{port}", "GESMAS_TLS_CA": cl.pki.ca_cert}
        out = wait_probe(pod, (), 0)
        assert f"127.0.0.1:{port}: SERVING" in out
        assert probe(pod, "--live")[0] == 0
        # what the kubelet's own gRPC probe does: plain text against the TLS port
        code, out = probe({"GESMAS_HEALTH_ADDR": f"127.0.0.1:{port}"}, "--live")
        assert code == 1 and "no answer" in out
        # a certificate for another name is refused, TLS is really checked
        code, out = probe(dict(pod, GESMAS_CLIENT_ADDR=f"gesmas-7.elsewhere:{port}"), "--live")
        assert code == 1 and "no answer" in out
        for other in cl.members[1:]:
            cl.kill(other)                    # quorum lost: not ready, but alive
        out = wait_probe(pod, (), 1)
        assert "NOT_SERVING" in out
        code, out = probe(pod, "--live")
        assert code == 0 and "NOT_SERVING" in out
        os.kill(m.proc.pid, signal.SIGSTOP)   # a hung replica: not alive either
        try:
            code, out = probe(pod, "--live", "--timeout", "2")
            assert code == 1 and "DEADLINE_EXCEEDED" in out
        finally:
            os.kill(m.proc.pid, signal.SIGCONT)

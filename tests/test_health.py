"""gRPC health checking and server reflection on a replica's client port (issue "Operate
it"): SERVING only while the replica knows a leader and keeps up with the log, so that a load
balancer or a Kubernetes probe routes around a replica cut off from the others."""
from __future__ import annotations

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

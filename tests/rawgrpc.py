"""Raw gRPC channels for tests that bypass the client, secured like the cluster under test:
with GESMAS_TEST_SECURE=1 (LocalCluster exports GESMAS_TLS_CA, GESMAS_USER, GESMAS_PASSWORD)
they use TLS and a token; otherwise plain text and no credentials."""
from __future__ import annotations

import os
from typing import Any

import grpc

from gesmas.client.security import resolve_tls
from gesmas.v1 import gesmas_pb2 as pb
from gesmas.v1 import gesmas_pb2_grpc as pb_grpc


def channel(address: str, options: Any = None) -> grpc.Channel:
    tls = resolve_tls(None)
    if tls is None:
        return grpc.insecure_channel(address, options=options)
    return grpc.secure_channel(address, tls.credentials(), options=options)


def metadata(ch: grpc.Channel) -> tuple[tuple[str, str], ...]:
    user, password = os.environ.get("GESMAS_USER"), os.environ.get("GESMAS_PASSWORD")
    if not user or password is None:
        return ()
    token = pb_grpc.GesmasStub(ch).Authenticate(
        pb.AuthenticateRequest(user=user, password=password), timeout=10).token
    return (("authorization", f"Bearer {token}"),)

"""Kernel errors -> what a gRPC servicer aborts with.

``error_to_status`` turns a kernel ``Error`` into a status code (the one table is
``gesmas.protocol.errors.GRPC_STATUS``), a details string, and trailing metadata carrying the
serialized ``ErrorDetail`` under ``ERROR_METADATA_KEY``; the client reads it back in
``gesmas.client.errors``. Values are converted by ``gesmas.protocol.values``, shared with the
client. Besides the gateway this is the only server module that imports the generated
protobuf code (STYLE.md point 6).
"""
from __future__ import annotations

from typing import cast

import grpc

from gesmas.protocol.errors import ERROR_METADATA_KEY, GRPC_STATUS
from gesmas.server.kernel.errors import Code, Error
from gesmas.v1 import gesmas_pb2 as pb

__all__ = ["ERROR_METADATA_KEY", "GRPC_STATUS", "error_detail", "error_to_status"]

# --- errors -----------------------------------------------------------------------------

def error_detail(error: Error, leader_hint: str = "") -> pb.ErrorDetail:
    """The wire form of ``error``; ``leader_hint`` is the leader's client address, if known."""
    return pb.ErrorDetail(
        code=cast("pb.ErrorCode", int(error.code)), message=error.message, type=error.type, leader_hint=leader_hint
    )


def error_to_status(
    error: Error, leader_hint: str = ""
) -> tuple[grpc.StatusCode, str, tuple[tuple[str, bytes], ...]]:
    """What a servicer aborts with for ``error``: (gRPC status code, details string,
    trailing metadata holding the serialized ErrorDetail). Use as::

        code, details, metadata = error_to_status(err)
        context.set_trailing_metadata(metadata)   # grpc.aio: await context.abort(code,
        context.abort(code, details)              #   details, metadata)
    """
    if error.code == Code.OK:
        raise ValueError("error_to_status: Code.OK is not an error")
    detail = error_detail(error, leader_hint).SerializeToString()
    return GRPC_STATUS[error.code], str(error), ((ERROR_METADATA_KEY, detail),)

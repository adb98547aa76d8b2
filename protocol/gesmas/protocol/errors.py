"""How an error travels: the gRPC status code of each error code, and the trailing metadata
that carries the full ``gesmas.v1.ErrorDetail`` (code, message, type, leader hint).

The codes are ``gesmas.v1.ErrorCode`` numbers; the server's kernel names them with its
``Code`` enum (same numbers), the client with one exception class per code.
"""
from __future__ import annotations

import grpc

from gesmas.v1 import gesmas_pb2 as pb

#: Trailing-metadata key of the serialized ``ErrorDetail`` (``-bin``: binary value).
ERROR_METADATA_KEY = "gesmas-error-bin"

#: ErrorDetail.type of an ABORTED error caused by the end of the caller's session.
SESSION_EXPIRED_TYPE = "SessionExpired"

#: The one table from error codes to gRPC status codes (DESIGN.md §8).
GRPC_STATUS: dict[int, grpc.StatusCode] = {
    pb.ERROR_CODE_OK: grpc.StatusCode.OK,
    pb.ERROR_CODE_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    pb.ERROR_CODE_INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    pb.ERROR_CODE_TIMEOUT: grpc.StatusCode.DEADLINE_EXCEEDED,
    pb.ERROR_CODE_ABORTED: grpc.StatusCode.ABORTED,
    pb.ERROR_CODE_APPLICATION: grpc.StatusCode.FAILED_PRECONDITION,
    pb.ERROR_CODE_UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    pb.ERROR_CODE_RESOURCE_EXHAUSTED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    pb.ERROR_CODE_ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    pb.ERROR_CODE_INTERNAL: grpc.StatusCode.INTERNAL,
    pb.ERROR_CODE_UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    pb.ERROR_CODE_PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
}

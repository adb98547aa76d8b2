"""The error taxonomy of gesmas, defined once.

Every failure a caller can see has one of these codes. The wire layer maps a code to a gRPC
status code with one table (``gesmas.server.wire.GRPC_STATUS``) and the client mirrors it with
one exception class per code (``gesmas.client.errors``). The numeric values are part of the
wire contract (``protos/gesmas/v1/gesmas.proto``, enum ``ErrorCode``): never renumber.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass


class Code(enum.IntEnum):
    OK = 0
    NOT_FOUND = 1            # unknown class, object, method or session
    INVALID_ARGUMENT = 2     # bad arguments, bad class source, malformed request
    TIMEOUT = 3              # a wait reached its deadline (gRPC DEADLINE_EXCEEDED)
    ABORTED = 4              # interrupted: session ended, object deleted
    APPLICATION = 5          # the method raised: type and message in the detail (FAILED_PRECONDITION)
    UNAVAILABLE = 6          # no leader / replica not ready; retry elsewhere
    RESOURCE_EXHAUSTED = 7   # step budget, payload size, waiter or result limits
    ALREADY_EXISTS = 8       # object exists with another class
    INTERNAL = 9             # a bug in gesmas itself
    UNAUTHENTICATED = 10     # no valid credentials, while the cluster has auth enabled
    PERMISSION_DENIED = 11   # the authenticated user may not do this (or the session is not its)


@dataclass(frozen=True)
class Error:
    """An error result: the code, a one-line message, and for APPLICATION errors the type
    name of the exception the method raised."""

    code: Code
    message: str
    type: str = ""

    def __str__(self) -> str:
        head = f"{self.code.name}"
        if self.type:
            head += f" ({self.type})"
        return f"{head}: {self.message}"


class KernelError(Exception):
    """Raised inside the kernel to turn into an error completion."""

    def __init__(self, code: Code, message: str, type: str = "") -> None:
        super().__init__(message)
        self.error = Error(code, message, type)

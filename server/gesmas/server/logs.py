"""A replica's log lines: one line per event, with the time, the level and the node id; plain
text, or JSON objects (`--log-format json` / GESMAS_LOG_FORMAT=json) for log shippers. The
level comes from GESMAS_LOG (default WARNING). A failed call is logged (INFO) by the gateway
with its method, session and seq (gateway.py `_abort`)."""
from __future__ import annotations

import asyncio
import json
import logging
import sys
from typing import Any

FORMATS = ("text", "json")
GRPC_LOGGER = "grpc._cython.cygrpc"      # grpc.aio's server logs under this name


class _NodeFilter(logging.Filter):
    def __init__(self, node_id: int) -> None:
        super().__init__()
        self.node_id = node_id

    def filter(self, record: logging.LogRecord) -> bool:
        record.node = self.node_id
        return True


class _CancelledBeforeStart(logging.Filter):
    """grpc.aio logs "Exception not handled by _handle_exceptions" at ERROR, with a
    traceback, when a call's task was cancelled before its servicer ran (grpc catches and
    logs at DEBUG a CancelledError once the servicer runs): a Calls stream its client ended
    as soon as it had opened it, or one the server's stop cancelled. Seen once in a replica
    stopped by SIGINT just after it was elected, its clients failing over. No code of ours
    ran, nothing failed, the client retries: such a record is DEBUG. The same record with
    any other exception stays an ERROR."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if (isinstance(exc, asyncio.CancelledError)
                and str(record.msg).startswith("Exception not handled by _handle_exceptions")):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger().isEnabledFor(logging.DEBUG)
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts (ISO 8601, UTC), level, node, logger, msg, and the
    exception's text when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname, "node": getattr(record, "node", None),
            "logger": record.name, "msg": record.getMessage()}
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def setup(node_id: int, level: str = "WARNING", fmt: str = "text",
          stream: Any = None) -> logging.Handler:
    """Route every gesmas (and pysyncobj) log record of this process to one handler."""
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.addFilter(_NodeFilter(node_id))
    if fmt == "json":
        formatter: logging.Formatter = JsonFormatter()
    else:
        formatter = logging.Formatter(
            "%(asctime)s %(levelname)s node=%(node)s %(name)s: %(message)s")
    formatter.converter = __import__("time").gmtime
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    grpc_log = logging.getLogger(GRPC_LOGGER)
    if not any(isinstance(f, _CancelledBeforeStart) for f in grpc_log.filters):
        grpc_log.addFilter(_CancelledBeforeStart())
    return handler

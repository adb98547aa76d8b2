"""A replica's log lines (server/logs.py): one line per event with level and node id, as text
or JSON; a failed call names its session and seq."""
from __future__ import annotations

import asyncio
import io
import json
import logging

import pytest

from gesmas.server import logs
from gesmas.server.cluster import LocalCluster
from gesmas.client import Client, Timeout


@pytest.fixture
def restore_logging():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in list(root.handlers):
        root.removeHandler(h)
    for h in handlers:
        root.addHandler(h)
    root.setLevel(level)


def test_text_and_json_lines_carry_level_and_node(restore_logging):
    out = io.StringIO()
    logs.setup(7, "INFO", "text", out)
    logging.getLogger("gesmas.test").info("hello %s", "there")
    line = out.getvalue().strip()
    assert line.endswith("INFO node=7 gesmas.test: hello there") and "\n" not in line
    out = io.StringIO()
    logs.setup(7, "INFO", "json", out)
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("gesmas.test").exception("failed\nbadly")
    record = json.loads(out.getvalue())          # one line, even with newlines inside
    assert out.getvalue().count("\n") == 1
    assert (record["level"], record["node"], record["logger"], record["msg"]) == (
        "ERROR", 7, "gesmas.test", "failed\nbadly")
    assert "ValueError: boom" in record["exc"] and record["ts"].endswith("Z")
    with pytest.raises(ValueError):
        logs.setup(1, "INFO", "xml")


def test_a_failed_call_is_logged_with_its_session_and_seq():
    cl = LocalCluster(env={"GESMAS_LOG": "INFO", "GESMAS_LOG_FORMAT": "json"})
    with cl:
        with Client(cl.addresses) as c:
            with pytest.raises(Timeout):
                c.queue("logged").consume(timeout=0)
            session = c.session
        lines = []
        for m in cl.members:
            with open(m.log_path, encoding="utf-8") as f:
                lines += [json.loads(x) for x in f if x.startswith("{")]
    failed = [r for r in lines if r["msg"].startswith("call failed: InvokeRequest")]
    assert failed and f"session={session} seq=" in failed[0]["msg"]
    assert "TIMEOUT" in failed[0]["msg"] and failed[0]["level"] == "INFO"
    assert {r["node"] for r in lines} <= {1, 2, 3}


def test_a_call_grpc_cancelled_before_its_servicer_ran_is_not_an_error(restore_logging):
    out = io.StringIO()
    logs.setup(3, "INFO", "text", out)
    grpc_log = logging.getLogger(logs.GRPC_LOGGER)
    said = "Exception not handled by _handle_exceptions in servicer method [%s]"

    def record(exc: BaseException) -> None:
        try:
            raise exc
        except BaseException:
            grpc_log.exception(said, "/gesmas.v1.Gesmas/Calls")

    record(asyncio.CancelledError())
    assert out.getvalue() == ""                  # DEBUG, under the INFO asked for
    record(RuntimeError("a real one"))           # any other exception stays an ERROR
    assert " ERROR node=3 grpc._cython.cygrpc: Exception not handled" in out.getvalue()
    assert "RuntimeError: a real one" in out.getvalue()
    grpc_log.error("Exception not handled elsewhere", exc_info=asyncio.CancelledError())
    assert "elsewhere" in out.getvalue()         # only that one record
    out = io.StringIO()
    logs.setup(3, "DEBUG", "text", out)          # asked for: kept, as DEBUG, once
    record(asyncio.CancelledError())
    assert out.getvalue().count("DEBUG node=3 grpc._cython.cygrpc: Exception not") == 1
    assert len(grpc_log.filters) == 1            # a second setup adds no second filter

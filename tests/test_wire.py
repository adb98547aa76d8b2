"""The wire contract: Value conversions, the error table, and errors through gRPC metadata."""
from __future__ import annotations

import ast
import enum
import math
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import grpc
import pytest

from gesmas.client import errors as client_errors
from gesmas.protocol import errors as protocol_errors
from gesmas.protocol import values
from gesmas.server import wire
from gesmas.server.kernel.errors import Code, Error
from gesmas.v1 import gesmas_pb2 as pb

ROOT = Path(__file__).resolve().parent.parent


def roundtrip(x):
    v = values.to_value(x)
    again = pb.Value.FromString(v.SerializeToString())  # through the bytes, as on the wire
    return values.from_value(again)


# --- values -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "x",
    [
        None,
        True,
        False,
        0,
        -1,
        42,
        1.5,
        -0.0,
        float("inf"),
        "",
        "héllo ✓",
        b"",
        b"\x00\xff",
        [],
        {},
        [1, "a", None, [2, [3, []]], {"k": b"v"}],
        {"a": {"b": {"c": [True, 1, 1.0, "1", b"1"]}}, "": None},
    ],
    ids=repr,
)
def test_round_trip(x):
    assert roundtrip(x) == x
    assert _types(roundtrip(x)) == _types(x)


def _types(x):
    """A structure of the exact types, so True == 1 and 'a' vs b'a' cannot hide."""
    if isinstance(x, list):
        return [_types(i) for i in x]
    if isinstance(x, dict):
        return {k: _types(i) for k, i in x.items()}
    return type(x)


def test_nan_round_trips():
    assert math.isnan(roundtrip(float("nan")))


def test_bool_and_int_stay_distinct():
    assert values.to_value(True).WhichOneof("kind") == "bool_value"
    assert values.to_value(1).WhichOneof("kind") == "int_value"
    assert type(roundtrip(True)) is bool
    assert type(roundtrip(1)) is int
    assert roundtrip([True, 1, False, 0]) == [True, 1, False, 0]
    assert [type(i) for i in roundtrip([True, 1])] == [bool, int]


def test_bytes_and_str_stay_distinct():
    assert values.to_value("a").WhichOneof("kind") == "string_value"
    assert values.to_value(b"a").WhichOneof("kind") == "bytes_value"
    assert type(roundtrip("a")) is str
    assert type(roundtrip(b"a")) is bytes


def test_empty_containers_are_not_null():
    assert values.to_value([]).WhichOneof("kind") == "list_value"
    assert values.to_value({}).WhichOneof("kind") == "map_value"
    assert values.to_value(None).WhichOneof("kind") == "null_value"


def test_unset_value_reads_as_none():
    assert values.from_value(pb.Value()) is None


def test_tuple_becomes_list():
    assert roundtrip((1, (2, 3))) == [1, [2, 3]]


def test_plain_type_subclasses_are_sent_as_base_type():
    class Color(enum.IntEnum):
        RED = 1

    class Name(str):
        pass

    out = roundtrip(OrderedDict([(Name("k"), Color.RED), ("s", Name("x"))]))
    assert out == {"k": 1, "s": "x"}
    assert type(out["k"]) is int and type(out["s"]) is str
    assert [type(k) for k in out] == [str, str]


def test_map_keys_come_back_sorted():
    keys = [f"k{i}" for i in range(50, 0, -1)]
    assert list(roundtrip(dict.fromkeys(keys, 1))) == sorted(keys)


@pytest.mark.parametrize("n", [-(2**63), 2**63 - 1, -(2**31) - 1, 2**32])
def test_int64_limits_round_trip(n):
    assert roundtrip(n) == n


@pytest.mark.parametrize("n", [2**63, -(2**63) - 1, 10**30])
def test_ints_outside_int64_are_rejected(n):
    with pytest.raises(ValueError, match=r"^value: int .* outside the int64 range"):
        values.to_value(n)


@pytest.mark.parametrize(
    "x, message",
    [
        ({1, 2}, "value: type set is not a plain value"),
        (object(), "value: type object is not a plain value"),
        (bytearray(b"x"), "value: type bytearray is not a plain value"),
        ([1, [2, 3, {"x": {1}}]], "value[1][2]['x']: type set is not a plain value"),
        ({"a": {1: "b"}}, "value['a']: key 1 of type int is not a str"),
        ({"a": [0, 2**64]}, "value['a'][1]: int 18446744073709551616 is outside the int64"),
        (["ok", "\ud800"], "value[1]: str is not valid Unicode text"),
    ],
    ids=["set", "object", "bytearray", "nested", "key", "bigint", "surrogate"],
)
def test_rejected_values_name_their_path(x, message):
    with pytest.raises(ValueError) as info:
        values.to_value(x)
    assert str(info.value).startswith(message)


def test_args_and_kwargs_helpers_name_their_path():
    request = pb.InvokeRequest()
    with pytest.raises(ValueError, match=r"^args\[1\]\['x'\]: type set is not a plain value$"):
        values.to_values([0, {"x": set()}], request.args)
    with pytest.raises(ValueError, match=r"^kwargs\['k'\]\[0\]: type frozenset"):
        values.to_value_map({"k": [frozenset()]}, request.kwargs)
    with pytest.raises(ValueError, match=r"^ctor_kwargs: key 3 of type int is not a str"):
        values.to_value_map({3: 1}, path="ctor_kwargs")


def test_args_and_kwargs_helpers_round_trip():
    request = pb.InvokeRequest()
    values.to_values([1, "a", [None]], request.args)
    values.to_value_map({"b": {"c": b"d"}, "a": True}, request.kwargs)
    request = pb.InvokeRequest.FromString(request.SerializeToString())
    assert values.from_values(request.args) == [1, "a", [None]]
    assert values.from_value_map(request.kwargs) == {"a": True, "b": {"c": b"d"}}
    built = pb.CreateObjectRequest(args=values.to_values((1, 2)), kwargs=values.to_value_map({"x": 3}))
    assert values.from_values(built.args) == [1, 2]
    assert values.from_value_map(built.kwargs) == {"x": 3}



def test_a_huge_int_is_refused_by_its_size():
    """str() refuses an int past 4,300 digits: the message names its bits instead."""
    with pytest.raises(ValueError, match=r"^args\[0\]: int of 16610 bits is outside"):
        values.to_values([10**5000])


def nested(kind, levels):
    x = [] if kind == "list" else {}
    for _ in range(levels - 1):
        x = [x] if kind == "list" else {"k": x}
    return x


@pytest.mark.parametrize("kind", ["list", "dict"])
def test_the_deepest_values_parse_in_every_message_that_carries_them(kind):
    """protobuf's parser refuses a message nested past 100 (three a dict level): the deepest
    argument in a Call and the deepest answer in a CallAnswer parse, and so does the deepest
    argument three containers down in an answer (a Map's watch answer, a txn's results)
    and four (a page of items)."""
    deep_arg, deep = nested(kind, values.MAX_ARG_DEPTH), nested(kind, values.MAX_DEPTH)
    call = pb.Call(id=1, invoke=pb.InvokeRequest(seq=1))
    values.to_values([deep_arg], call.invoke.args)
    values.to_value_map({"k": deep_arg}, call.invoke.kwargs)
    values.to_values([deep_arg], call.invoke.ctor_args)
    again = pb.Call.FromString(call.SerializeToString())
    assert values.from_values(again.invoke.args) == [deep_arg]
    assert values.from_value_map(again.invoke.kwargs) == {"k": deep_arg}
    watch = {"events": [{"key": "k", "value": deep_arg}], "revision": 1}
    page = {"items": [["k", {"value": deep_arg}]], "revision": 1}
    for answer in (deep, watch, page):
        a = pb.CallAnswer(id=1, response=pb.InvokeResponse(result=values.to_value(answer)))
        assert values.from_value(pb.CallAnswer.FromString(a.SerializeToString())
                                 .response.result) == answer


@pytest.mark.parametrize("kind", ["list", "dict"])
def test_values_nested_past_the_limit_are_refused_by_path(kind):
    """One level more is refused on either side, naming where; so is a structure that holds
    itself, or one 100,000 deep, without a RecursionError."""
    step = "[0]" if kind == "list" else "['k']"
    with pytest.raises(ValueError) as info:
        values.to_value(nested(kind, values.MAX_DEPTH + 1), "result")
    message = str(info.value)           # a long path is shortened in the middle
    assert message.startswith(f"result{step * 10}") and len(message) < 150
    assert message.endswith(f"{step * 5}: nested more than {values.MAX_DEPTH} lists and "
                            "dicts deep")
    with pytest.raises(ValueError, match=r"^args\[0\].*: nested more than 24 lists"):
        values.to_values([nested(kind, values.MAX_ARG_DEPTH + 1)])
    wire_value = values.to_value(nested(kind, values.MAX_ARG_DEPTH + 1))   # a raw client's
    with pytest.raises(ValueError, match=r"^args\[1\].*: nested more than 24 lists"):
        values.from_values([values.to_value(0), wire_value])
    with pytest.raises(ValueError, match=r"^kwargs\['x'\].*: nested more than 24 lists"):
        values.from_value_map({"x": wire_value})
    assert values.from_value(wire_value) == nested(kind, values.MAX_ARG_DEPTH + 1)
    selfish: list = []
    selfish.append(selfish)
    for x in (selfish, nested(kind, 100_000)):
        with pytest.raises(ValueError, match="nested more than 30 lists and dicts deep$"):
            values.to_value(x)


# --- errors -----------------------------------------------------------------------------


def test_error_codes_match_the_proto():
    proto_codes = {
        name.removeprefix("ERROR_CODE_"): number for name, number in pb.ErrorCode.items()
    }
    assert proto_codes == {c.name: c.value for c in Code}


def test_every_code_has_a_grpc_status():
    assert set(protocol_errors.GRPC_STATUS) == set(Code)
    assert protocol_errors.GRPC_STATUS[Code.TIMEOUT] is grpc.StatusCode.DEADLINE_EXCEEDED
    assert protocol_errors.GRPC_STATUS[Code.APPLICATION] is grpc.StatusCode.FAILED_PRECONDITION
    failures = [c for c in Code if c is not Code.OK]
    assert grpc.StatusCode.OK not in {protocol_errors.GRPC_STATUS[c] for c in failures}
    assert len({protocol_errors.GRPC_STATUS[c] for c in failures}) == len(failures)  # invertible


def test_every_code_has_a_client_exception():
    for code in Code:
        if code is Code.OK:
            assert code.value not in client_errors.ERROR_CLASSES
            continue
        cls = client_errors.ERROR_CLASSES[code.value]
        assert issubclass(cls, client_errors.GesmasError)
        assert cls.code == code.value
        assert cls(message="m").code_name == code.name


def test_metadata_key_is_shared():
    assert client_errors.ERROR_METADATA_KEY == wire.ERROR_METADATA_KEY
    assert wire.ERROR_METADATA_KEY.endswith("-bin")


def test_ok_is_not_an_error():
    with pytest.raises(ValueError):
        wire.error_to_status(Error(Code.OK, "fine"))


class FakeRpcError(grpc.RpcError, grpc.Call):
    """What a failed unary call raises on the client, built from a server's abort."""

    def __init__(self, code, details, trailing=()):
        self._code, self._details, self._trailing = code, details, tuple(trailing)

    def code(self):
        return self._code

    def details(self):
        return self._details

    def trailing_metadata(self):
        return self._trailing

    def initial_metadata(self):
        return ()

    def is_active(self):
        return False

    def time_remaining(self):
        return None

    def cancel(self):
        return False

    def add_callback(self, callback):
        return False


def through_grpc(error, leader_hint=""):
    status, details, metadata = wire.error_to_status(error, leader_hint)
    return status, client_errors.error_from_rpc(FakeRpcError(status, details, metadata))


EXPECTED_CLASS = {
    Code.NOT_FOUND: client_errors.NotFound,
    Code.INVALID_ARGUMENT: client_errors.InvalidArgument,
    Code.TIMEOUT: client_errors.Timeout,
    Code.ABORTED: client_errors.Aborted,
    Code.APPLICATION: client_errors.ApplicationError,
    Code.UNAVAILABLE: client_errors.Unavailable,
    Code.RESOURCE_EXHAUSTED: client_errors.ResourceExhausted,
    Code.ALREADY_EXISTS: client_errors.AlreadyExists,
    Code.INTERNAL: client_errors.Internal,
}


@pytest.mark.parametrize("code", list(EXPECTED_CLASS), ids=lambda c: c.name)
def test_error_detail_round_trip(code):
    status, exc = through_grpc(Error(code, "went wrong", "SomeType"), leader_hint="h:1")
    assert status is protocol_errors.GRPC_STATUS[code]
    assert type(exc) is EXPECTED_CLASS[code]
    assert (exc.code, exc.message, exc.type, exc.leader_hint) == (
        code.value,
        "went wrong",
        "SomeType",
        "h:1",
    )


def test_application_error_carries_remote_type():
    _, exc = through_grpc(Error(Code.APPLICATION, "not the owner", "LockNotOwned"))
    assert isinstance(exc, client_errors.ApplicationError)
    assert exc.type == "LockNotOwned"
    assert str(exc) == "APPLICATION (LockNotOwned): not the owner"


def test_session_expired_is_an_aborted_with_that_type():
    _, exc = through_grpc(Error(Code.ABORTED, "session 7 expired", "SessionExpired"))
    assert type(exc) is client_errors.SessionExpired
    assert isinstance(exc, client_errors.Aborted)
    _, exc = through_grpc(Error(Code.ABORTED, "object deleted", "ObjectDeleted"))
    assert type(exc) is client_errors.Aborted
    # the rule is the code and the type together
    _, exc = through_grpc(Error(Code.NOT_FOUND, "no session", "SessionExpired"))
    assert type(exc) is client_errors.NotFound


def test_unavailable_carries_leader_hint():
    _, exc = through_grpc(Error(Code.UNAVAILABLE, "not the leader"), leader_hint="10.0.0.2:7000")
    assert isinstance(exc, client_errors.Unavailable)
    assert exc.leader_hint == "10.0.0.2:7000"
    assert "10.0.0.2:7000" in str(exc)


@pytest.mark.parametrize(
    "status, cls",
    [
        (grpc.StatusCode.UNAVAILABLE, client_errors.Unavailable),
        (grpc.StatusCode.DEADLINE_EXCEEDED, client_errors.Timeout),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, client_errors.ResourceExhausted),
        (grpc.StatusCode.CANCELLED, client_errors.Aborted),
        (grpc.StatusCode.UNKNOWN, client_errors.Internal),
        (grpc.StatusCode.UNIMPLEMENTED, client_errors.Internal),
    ],
    ids=lambda x: getattr(x, "name", ""),
)
def test_without_detail_the_status_code_decides(status, cls):
    exc = client_errors.error_from_rpc(FakeRpcError(status, "failed to connect"))
    assert type(exc) is cls
    assert exc.message == "failed to connect"


def test_corrupt_or_empty_detail_falls_back_to_status():
    for raw in (b"\xff\xff\xff", pb.ErrorDetail().SerializeToString()):
        metadata = ((wire.ERROR_METADATA_KEY, raw),)
        exc = client_errors.error_from_rpc(FakeRpcError(grpc.StatusCode.NOT_FOUND, "x", metadata))
        assert type(exc) is client_errors.NotFound


def test_bare_rpc_error_is_unavailable():
    assert type(client_errors.error_from_rpc(grpc.RpcError())) is client_errors.Unavailable


def test_client_errors_pickle():
    import pickle

    exc = client_errors.SessionExpired("gone", "SessionExpired", "h:1")
    again = pickle.loads(pickle.dumps(exc))
    assert type(again) is client_errors.SessionExpired
    assert (again.message, again.type, again.leader_hint) == ("gone", "SessionExpired", "h:1")


def test_timeouts_are_python_timeouts():
    """A Timeout is a TimeoutError; a Queue's are also queue.Empty / queue.Full, and keep
    their attributes through pickling."""
    import pickle
    import queue

    exc = client_errors.error_from_detail(pb.ErrorDetail(code=pb.ERROR_CODE_TIMEOUT,
                                                         message="waited 1 s"))
    assert isinstance(exc, TimeoutError) and not isinstance(exc, queue.Empty)
    for method, cls in [("consume", queue.Empty), ("reserve", queue.Empty),
                        ("produce", queue.Full)]:
        made = client_errors.queue_timeout(method, exc)
        assert isinstance(made, cls) and isinstance(made, client_errors.Timeout)
        again = pickle.loads(pickle.dumps(made))
        assert type(again) is type(made) and again.message == "waited 1 s"
        assert str(again) == "TIMEOUT: waited 1 s"
    assert client_errors.queue_timeout("size", exc) is exc


@pytest.mark.parametrize("path", sorted((ROOT / "client" / "gesmas" / "client").glob("*.py"))
                         + sorted((ROOT / "protocol" / "gesmas" / "protocol").glob("*.py")),
                         ids=lambda p: p.name)
def test_the_client_and_the_protocol_do_not_import_the_server(path):
    """Dependencies point one way: client <- protocol -> server. (The CLI's server commands
    load the server by name, at run time, only when asked to run one.)"""
    tree = ast.parse(path.read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module or "")
    assert not {m for m in imported if m.startswith("gesmas.server")}, imported


# --- generated code ---------------------------------------------------------------------


def test_generated_code_is_up_to_date():
    result = subprocess.run(
        [sys.executable, str(ROOT / "protos" / "generate.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_error_through_a_real_grpc_call():
    """One end-to-end check that the metadata survives a real server's abort."""
    from concurrent import futures

    from gesmas.v1 import gesmas_pb2_grpc as pb_grpc

    class Servicer(pb_grpc.GesmasServicer):
        def Status(self, request, context):
            status, details, metadata = wire.error_to_status(
                Error(Code.UNAVAILABLE, "no leader"), leader_hint="127.0.0.1:9"
            )
            context.set_trailing_metadata(metadata)
            context.abort(status, details)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    pb_grpc.add_GesmasServicer_to_server(Servicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            with pytest.raises(grpc.RpcError) as info:
                pb_grpc.GesmasStub(channel).Status(pb.StatusRequest(), timeout=10)
        exc = client_errors.error_from_rpc(info.value)
        assert type(exc) is client_errors.Unavailable
        assert (exc.message, exc.leader_hint) == ("no leader", "127.0.0.1:9")
    finally:
        server.stop(None)

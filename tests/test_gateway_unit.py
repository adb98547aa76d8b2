"""The gateway's decisions that need no cluster: what it does before proposing anything."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from gesmas.server.calls import CallFailed
from gesmas.server.gateway import Gateway
from gesmas.server.kernel.errors import Code


class Node:
    """What the gateway asks a node about auth: a replica that lags until `catch_up` runs
    `caught_up` times."""

    def __init__(self, auth_on_after_catch_up: bool, catches_up: bool) -> None:
        self.config = SimpleNamespace(secret="s" * 32, insecure=True, tls_client_ca=None)
        self._auth = False
        self._current = False
        self.catch_ups = 0
        self._after = (auth_on_after_catch_up, catches_up)

    def auth_enabled(self) -> bool:
        return self._auth

    def caught_up_once(self) -> bool:
        return self._current

    def requires_auth(self) -> bool:
        return False

    async def catch_up(self) -> None:
        self.catch_ups += 1
        self._auth, self._current = self._after


class Context:
    def invocation_metadata(self):
        return ()

    def auth_context(self):
        return {}


def _user(node: Node) -> str:
    async def main() -> str:
        return await Gateway(node)._user(Context())
    return asyncio.run(main())


def test_a_lagging_replica_proposes_nothing_for_a_caller_without_a_login():
    """A replica that has not applied `auth_enable` yet must not take a request without a
    login as an auth-off cluster's: it catches up first, then knows, or says UNAVAILABLE."""
    with pytest.raises(CallFailed) as failed:
        _user(Node(auth_on_after_catch_up=False, catches_up=False))
    assert failed.value.error.code == Code.UNAVAILABLE
    assert "caught up" in failed.value.error.message
    with pytest.raises(CallFailed) as failed:            # it learns auth is on: a login
        _user(Node(auth_on_after_catch_up=True, catches_up=True))
    assert failed.value.error.code == Code.UNAUTHENTICATED
    node = Node(auth_on_after_catch_up=False, catches_up=True)
    assert _user(node) == "" and node.catch_ups == 1     # auth off, and it knows it
    assert _user(node) == "" and node.catch_ups == 1     # current: no wait at all


# -- identical reader calls at one state share a run (node_reads.ReadMemo) --------------------

def _invoke_request(user_args=(1, "a"), kwargs=None, method="watch", name="m", ctor=None):
    from gesmas.protocol import values
    from gesmas.v1 import gesmas_pb2 as pb
    req = pb.InvokeRequest(object_name=name, method=method, class_name="Map")
    if ctor is not None:
        req.create = True
        req.ctor_args.extend(values.to_value(a, "arg") for a in ctor)
    req.args.extend(values.to_value(a, "arg") for a in user_args)
    for k, v in (kwargs or {}).items():
        req.kwargs[k].CopyFrom(values.to_value(v, "kwarg"))
    return req


def test_the_read_key_names_everything_an_answer_depends_on():
    from gesmas.server.reader_calls import read_key as _read_key
    base = _read_key(_invoke_request(), "alice")
    assert base == _read_key(_invoke_request(), "alice")
    assert base != _read_key(_invoke_request(), "bob")                   # rights differ
    assert base != _read_key(_invoke_request(user_args=(2, "a")), "alice")
    assert base != _read_key(_invoke_request(user_args=(1, "a", 0)), "alice")
    assert base != _read_key(_invoke_request(method="get"), "alice")
    assert base != _read_key(_invoke_request(name="n"), "alice")
    assert base != _read_key(_invoke_request(kwargs={"limit": 5}), "alice")
    created = _read_key(_invoke_request(ctor=[100]), "alice")    # a get-or-create
    assert created != base and created == _read_key(_invoke_request(ctor=[100]), "alice")
    assert created != _read_key(_invoke_request(ctor=[200]), "alice")
    a = _read_key(_invoke_request(kwargs={"x": 1, "y": {"b": 1, "a": 2}}), "alice")
    assert a == _read_key(_invoke_request(kwargs={"y": {"a": 2, "b": 1}, "x": 1}), "alice")


def test_large_arguments_are_not_memoized():
    """A key is kept with its answer: a caller sending large arguments to a reader must not
    make the replica hold them (up to the memo's size) beside the answers."""
    from gesmas.server.reader_calls import MEMO_KEY_BYTES
    from gesmas.server.reader_calls import read_key as _read_key
    assert _read_key(_invoke_request(user_args=("x" * (MEMO_KEY_BYTES - 64),)), "a") is not None
    assert _read_key(_invoke_request(user_args=("x" * (MEMO_KEY_BYTES + 1),)), "a") is None
    assert _read_key(_invoke_request(kwargs={"k": "x" * (MEMO_KEY_BYTES + 1)}), "a") is None
    assert _read_key(_invoke_request(ctor=["x" * (MEMO_KEY_BYTES + 1)]), "a") is None


def test_the_read_memo_answers_at_the_state_it_was_filled_at_only():
    from gesmas.server.node_reads import ReadMemo

    class K:
        index = 5
    k, other = K(), K()
    memo = ReadMemo()
    assert memo.get(k, "key") is None
    memo.put(k, "key", (True, {"v": 1}))
    assert memo.get(k, "key") == (True, {"v": 1}) and memo.hits == 1
    assert memo.get(other, "key") is None             # another kernel (a snapshot loaded)
    assert memo.get(k, "other") is None
    k.index = 6                                       # an entry applied since
    assert memo.get(k, "key") is None
    memo.put(k, "new", (False, "topic"))
    k.index = 5
    assert memo.get(k, "key") is None                 # the old state's answers are gone
    k.index = 6
    for i in range(ReadMemo.SIZE + 5):
        memo.put(k, i, (True, i))
    assert len(memo._answers) == ReadMemo.SIZE and memo.get(k, ReadMemo.SIZE + 4) == \
        (True, ReadMemo.SIZE + 4)


# -- what the gateway proposes -------------------------------------------------------------

def test_a_create_is_proposed_measured_and_a_plain_call_is_not():
    """Every command that can make an object asks the kernel to measure it as it is made
    (`measured`, command version 8: lifecycle.py); an Invoke without `create` stays a
    version-2 command, which a replica of an earlier gesmas still reads."""
    from gesmas.protocol import values
    from gesmas.server.kernel import codec
    from gesmas.v1 import gesmas_pb2 as pb

    proposed: list = []
    node = Node(auth_on_after_catch_up=False, catches_up=True)
    node.kernel, node.metrics = None, None
    node.new_tag = lambda: f"t{len(proposed)}"
    gw = Gateway(node)

    async def user(context):
        return ""

    async def answer(context, cmd):
        proposed.append(cmd)
        return {"created": True, "version": 1} if isinstance(cmd, codec.CreateObject) else 7

    gw._user, gw._answer = user, answer

    async def main() -> None:
        await gw._create_object(pb.CreateObjectRequest(class_name="Queue", object_name="q"),
                                Context())
        plain = pb.InvokeRequest(object_name="q", method="size", seq=1)
        await gw._invoke(plain, Context())
        made = pb.InvokeRequest(object_name="c", method="add", seq=2, ack=1,
                                class_name="Counter", create=True)
        made.ctor_args.append(values.to_value(5, "arg"))
        await gw._invoke(made, Context())

    asyncio.run(main())
    create, plain, made = proposed
    assert type(create) is codec.CreateObject and create.measured is True
    assert type(plain) is codec.Invoke and plain.measured is False
    assert type(made) is codec.Invoke and made.create is True and made.measured is True
    assert [codec.encode(c)[0] for c in proposed] == [8, 2, 8]

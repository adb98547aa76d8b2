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

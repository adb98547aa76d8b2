"""Followed calls of a process on one Calls RPC per replica, their answers merged (the sync
client's default; GESMAS_FOLLOW_STREAM=own or shared sends them otherwise).

A hundred watches of one key, each on an RPC of its own (own_follow), cost the replica one
write and the watching process one message per watch and change: most of what a change
costs both (docs/performance.md, "Where the fan-out's cost goes"). The followers of one
shared run of a reader on the replica (the same call from the same state: one key's
watches) get the same answer, so when they travel on one stream and ask for it
(``Follow.merge``) the replica writes that answer once, with the other calls' ids
(``CallAnswer.also``), and the stream's reader thread hands it to each follower here.

Every Client of the process that follows calls at one replica with the same login and TLS
settings sends them on one ``Hub``: a ``streams.CallStream`` on a channel of the hub's own
(a client that closes does not end the others' follows), which lives while it carries a
follow and is finished with its last. Sessions stay each client's: each call carries its
own (session, seq), checked by the replica per call.

The rules of a followed call do not change (``streams.FollowedAnswers``): answers in order,
a failure ends the follow and the client follows again (elsewhere if need be) from the last
cursor, a deadline on each answer. A client that closes, or finds the replica unresponsive,
ends its own follows on the hub (``MergedFollowing.cancel``), not the hub.
"""
from __future__ import annotations

import threading
from typing import Any, Callable

import grpc

from gesmas.client.security import TLS, Login
from gesmas.client.streams import CALLS_PER_STREAM, CallStream, Following
from gesmas.v1 import gesmas_pb2_grpc as pb_grpc

__all__ = ["HUBS", "Hub", "Hubs", "MergedFollowing", "PER_HUB"]

#: Follows on one hub at most: they stay in flight, and a replica stops reading a stream
#: with 1,000 calls in flight (gesmas.server.streams.MAX_IN_FLIGHT), cancels included.
PER_HUB = CALLS_PER_STREAM


class Hub:
    """One stream for the merged follows of the process at one replica, with one login
    and TLS settings (``key``); ``users``: the follows it carries (under ``Hubs``' lock)."""

    def __init__(self, key: Any, channel: grpc.Channel, stream: CallStream) -> None:
        self.key = key
        self.channel = channel
        self.stream = stream
        self.users = 0


class MergedFollowing(Following):
    """A followed call on a ``Hub``: its answers come from the hub's reader thread, merged
    or not; it holds its hub until it ends, and ``on_end`` is told then, once."""

    def __init__(self, hub: Hub, deadline: float | None, release: Callable[[Hub], None],
                 on_end: Callable[[Any], None]) -> None:
        super().__init__(hub.stream, deadline)
        self.address = hub.stream.address
        self._hub = hub
        self._release = release
        self._on_end = on_end
        self._ended = False
        self._end_lock = threading.Lock()

    def close(self) -> None:
        super().close()
        with self._end_lock:
            if self._ended:
                return
            self._ended = True
        self._release(self._hub)
        self._on_end(self)


class Hubs:
    """The process's hubs, by (replica address, call metadata, TLS settings): one, or more
    past ``PER_HUB`` follows."""

    def __init__(self, per_hub: int = PER_HUB) -> None:
        self.per_hub = per_hub
        self._lock = threading.Lock()
        self._hubs: dict[Any, list[Hub]] = {}

    def take(self, address: str, metadata: tuple[tuple[str, str], ...], tls: TLS | None,
             open_channel: Callable[[str], grpc.Channel], login: Login,
             max_message: int) -> Hub:
        """A hub for ``address``, ``metadata`` and ``tls`` with room for a follow, with one
        user more (a new one on a channel from ``open_channel(address)`` if none has room
        or their streams ended: those end with their last follow); ``release`` it when the
        follow ends (``MergedFollowing`` does)."""
        hkey = (address, metadata, tls)
        with self._lock:
            hubs = self._hubs.setdefault(hkey, [])
            hubs[:] = [h for h in hubs if h.stream.usable]
            hub = next((h for h in hubs if h.users < self.per_hub), None)
            if hub is None:
                channel = open_channel(address)
                stream = CallStream(pb_grpc.GesmasStub(channel), address, metadata, login,
                                    max_message)
                hub = Hub(hkey, channel, stream)
                hubs.append(hub)
            hub.users += 1
            return hub

    def release(self, hub: Hub) -> None:
        with self._lock:
            hub.users -= 1
            if hub.users:
                return
            hubs = self._hubs.get(hub.key, [])
            if hub in hubs:
                hubs.remove(hub)
            if not hubs:
                self._hubs.pop(hub.key, None)
        hub.stream.finish()
        hub.channel.close()

    def count(self) -> int:
        """The hubs open."""
        with self._lock:
            return sum(map(len, self._hubs.values()))


HUBS = Hubs()

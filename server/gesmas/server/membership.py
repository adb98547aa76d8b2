"""Raft membership changes (the admin RPCs AddNode / RemoveNode), a part of `Node`.

The Raft configuration lives in pysyncobj (replicated through the log); the raft -> client
address pairs used for leader hints and Status live in the node's config.peers, which is
node-local: the leader that performs a change updates its own copy, other replicas keep what
their --peers said until they are restarted with an updated --peers. A change needs an admin
(the gateway asks the log first), goes one at a time, and is refused when fewer members would
be reachable than a quorum of the new configuration.
"""
from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from .calls import CallFailed
from .kernel.errors import Code, Error

if TYPE_CHECKING:  # pragma: no cover
    from .config import NodeConfig

log = logging.getLogger(__name__)


class Membership:
    """Mixed into Node: uses its `replica`, `config`, `_loop`, `_leader_ready` and
    `leader_client_addr`."""

    config: NodeConfig
    replica: Any
    _loop: asyncio.AbstractEventLoop | None
    _leader_ready: bool
    _membership_busy: bool

    def leader_client_addr(self) -> str | None:   # defined by Node
        raise NotImplementedError

    def members(self) -> set[str]:
        """The Raft addresses of the other replicas in this replica's current configuration."""
        return set(self.replica.status().get("peers", {}))

    def remember_peer(self, raft_addr: str, client_addr: str) -> None:
        """Record (or update) the client address of the replica at `raft_addr`."""
        from dataclasses import replace
        peers = [(r, c) for r, c in self.config.peers if r != raft_addr]
        old = dict(self.config.peers).get(raft_addr, "")
        peers.append((raft_addr, client_addr or old))
        self.config = replace(self.config, peers=tuple(peers))

    def forget_peer(self, raft_addr: str) -> None:
        from dataclasses import replace
        self.config = replace(self.config, peers=tuple(
            (r, c) for r, c in self.config.peers if r != raft_addr))

    async def change_membership(self, add: bool, raft_addr: str, client_addr: str = "",
                                timeout: float = 10.0) -> bool:
        """Add or remove the replica `raft_addr` through pysyncobj, on the leader, and wait
        until the change is committed. Returns False when there was nothing to do (already a
        member / not a member). Raises CallFailed: UNAVAILABLE (not the leader, or the outcome
        is unknown), APPLICATION (the change was refused, or is unsafe)."""
        if not (self._leader_ready and self.replica.is_leader()):
            raise CallFailed(Error(Code.UNAVAILABLE, "membership changes go to the leader",
                                   "NotLeader"), self.leader_client_addr() or "")
        if raft_addr == self.config.raft_addr:
            if add:
                return False
            raise CallFailed(Error(
                Code.APPLICATION, f"{raft_addr} is the leader and cannot remove itself: stop "
                "it (another replica takes over) and remove it through the new leader",
                "IsLeader"))
        members = self.members()
        if add and raft_addr in members:
            self.remember_peer(raft_addr, client_addr)
            return False
        if not add and raft_addr not in members:
            self.forget_peer(raft_addr)
            return False
        if self._membership_busy:
            raise CallFailed(Error(
                Code.APPLICATION, "another membership change is in progress on this leader; "
                "one change at a time: retry when it is done", "MembershipChangeDenied"))
        self._membership_busy = True
        try:
            await self._check_quorum(add, raft_addr)
            return await self._change(add, raft_addr, client_addr, timeout)
        finally:
            self._membership_busy = False

    async def _check_quorum(self, add: bool, raft_addr: str) -> None:
        """Refuse a change after which fewer members are reachable than a quorum of the new
        configuration (etcd's strict reconfiguration check): adding replicas nobody started,
        or removing a live one while others are down, would leave the cluster unable to
        elect a leader or commit, and then unable to undo the change."""
        peers = self.replica.status().get("peers", {})
        up = 1 + sum(1 for r, p in peers.items() if p.get("connected") and r != raft_addr)
        if add:
            size = len(peers) + 2
            if await _listening(raft_addr):
                up += 1
        else:
            size = len(peers)
        quorum = size // 2 + 1
        if up < quorum:
            what = "adding" if add else "removing"
            raise CallFailed(Error(
                Code.APPLICATION, f"{what} {raft_addr} would leave {up} reachable member(s) of "
                f"{size}, fewer than a quorum of {quorum}: the cluster could no longer commit. "
                + ("Start the new replica first (it must be reachable at its Raft address), "
                   "or bring failed members back" if add else
                   "Bring failed members back first"), "UnsafeMembershipChange"))

    async def _change(self, add: bool, raft_addr: str, client_addr: str,
                      timeout: float) -> bool:
        from .replication import ReplicaStopped
        assert self._loop is not None
        loop = self._loop
        what = "add" if add else "remove"
        fut: asyncio.Future[tuple[bool, str]] = loop.create_future()

        def settle(ok: bool, reason: str) -> None:          # event loop
            if not fut.done():
                fut.set_result((ok, reason))

        def on_done(ok: bool, reason: str) -> None:         # pysyncobj's tick thread
            loop.call_soon_threadsafe(settle, ok, reason)

        change = self.replica.add_node if add else self.replica.remove_node
        try:
            change(raft_addr, on_done)
        except BlockingIOError:
            pass        # pysyncobj's wake-up pipe is full: the change is queued all the same
        except ReplicaStopped as e:
            raise CallFailed(Error(Code.UNAVAILABLE, f"replica cannot take commands: {e}",
                                   "ReplicaStopped")) from None
        try:
            ok, reason = await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            raise CallFailed(Error(
                Code.UNAVAILABLE, f"the {what} of {raft_addr} was not committed within "
                f"{timeout:g} s; it may still take effect: check `gesmas status` before "
                "retrying", "NotCommitted"), self.leader_client_addr() or "") from None
        if ok:
            if add:
                self.remember_peer(raft_addr, client_addr)
            else:
                self.forget_peer(raft_addr)
            log.warning("membership: %s %s committed", what, raft_addr)
            return True
        if reason == "denied":
            raise CallFailed(Error(
                Code.APPLICATION, f"pysyncobj refused to {what} {raft_addr} (denied): another "
                "membership change is still being committed, or this leader has not "
                "committed an entry of its term yet; retry in a moment",
                "MembershipChangeDenied"))
        raise CallFailed(Error(
            Code.UNAVAILABLE, f"the {what} of {raft_addr} was not committed ({reason}); "
            "check `gesmas status` before retrying", "NotCommitted"),
            self.leader_client_addr() or "")


async def _listening(addr: str, timeout: float = 1.0) -> bool:
    """Whether something accepts TCP connections at "host:port"."""
    host, _, port = addr.rpartition(":")
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host.strip("[]"), int(port)),
                                           timeout)
    except (OSError, asyncio.TimeoutError, ValueError):
        return False
    writer.close()
    return True

"""The synchronous client's calls that are not object calls: objects and classes listed,
cluster status, membership, users and roles. A base class of ``Client``; they go through
its retry rules (``_call``, ``_send``) like every call."""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator, TypedDict

from gesmas.client import convert, core
from gesmas.client.core import RPC_TIMEOUT
from gesmas.client.errors import GesmasError
from gesmas.protocol import backups
from gesmas.v1 import gesmas_pb2 as pb

if TYPE_CHECKING:  # pragma: no cover
    from gesmas.client.security import Login

__all__ = ["AdminCalls", "ClassSource", "NodeHealth", "ObjectInfo", "Status"]

log = logging.getLogger("gesmas.client.client")


# --- results of the admin calls (plain dicts, JSON-ready) ---------------------------------


class ObjectInfo(TypedDict):
    name: str
    class_name: str
    class_version: int
    waiters: int  # calls blocked on it


class ClassSource(TypedDict):
    name: str
    version: int
    source: str


class NodeHealth(TypedDict):
    node_id: str  # Raft address
    address: str  # client address
    connected: bool  # as the answering replica sees it
    match_index: int  # leader's view, else 0


class Status(TypedDict):
    address: str  # the client address of the replica that answered
    node_id: str
    leader_address: str
    is_leader: bool
    term: int
    commit_index: int
    last_applied: int
    object_count: int
    waiter_count: int
    session_count: int
    nodes: list[NodeHealth]
    rejoining: bool  # the answering replica has not caught up after an empty start
    applied_index: int  # the log index of the state the counts reflect


class AdminCalls:
    """Listing, status and administration calls of ``Client``."""

    if TYPE_CHECKING:  # provided by Client
        _consistency: str
        _seen: core.Seen
        _login: Login
        _routing: core.Routing
        _call: Callable[..., Any]
        _send: Callable[..., tuple[str, Any]]
        _attempt: Callable[..., Any]
        _authenticate: Callable[[str], Callable[[str, str], tuple[str, float]]]

    def _read_options(self, consistency: str | None) -> pb.ReadOptions:
        return core.read_options(core.consistency_setting(consistency, self._consistency),
                                 self._seen)

    def list_objects(self, *, prefix: str = "", class_name: str = "",
                     limit: int | None = None,
                     consistency: str | None = None) -> list[ObjectInfo]:
        """The live objects, in name order: [{"name", "class_name", "class_version",
        "waiters"}, ...]; those whose name starts with ``prefix`` and of class ``class_name``
        if given, at most ``limit`` of them if given (default: all, page after page, as
        ``iter_objects``). A read without a log entry; ``consistency`` ("linearizable" or
        "sequential") overrides the client's for this call (README "Reads")."""
        return list(self.iter_objects(prefix=prefix, class_name=class_name, limit=limit,
                                      consistency=consistency))

    def iter_objects(self, *, prefix: str = "", class_name: str = "",
                     limit: int | None = None, page_size: int = core.DEFAULT_PAGE,
                     consistency: str | None = None) -> Iterator[ObjectInfo]:
        """The objects ``list_objects`` gives, fetched one page (``page_size`` objects,
        default 1,000, at most 10,000) at a time as the iteration goes: each page is a read
        of its own, so objects created or deleted meanwhile may or may not appear, but
        names only go up and none appears twice."""
        size = core.page_size(limit, page_size)            # checked now, not at next()
        return self._pages(prefix, class_name, limit, size, consistency)

    def _pages(self, prefix: str, class_name: str, left: int | None, size: int,
               consistency: str | None) -> Iterator[ObjectInfo]:
        token = ""
        while left != 0:
            resp = self._call("ListObjects", pb.ListObjectsRequest(
                prefix=prefix, class_name=class_name, page_token=token,
                limit=size if left is None else min(size, left),
                read=self._read_options(consistency)))
            for o in resp.objects:
                if left is not None:
                    if left == 0:          # a server before paging answers every object
                        return
                    left -= 1
                yield ObjectInfo(name=o.name, class_name=o.class_name,
                                 class_version=o.class_version, waiters=o.waiters)
            token = resp.next_page_token
            if not token:
                return

    # --- classes -------------------------------------------------------------------------------

    def register_class(self, source: str) -> dict[str, int]:
        """Upload Python source defining classes; returns {class name: version}."""
        resp = self._call("RegisterClass", pb.RegisterClassRequest(source=source))
        return {c.name: c.version for c in resp.classes}

    def list_classes(self, *, consistency: str | None = None) -> dict[str, int]:
        """{class name: newest version}. A read, as ``list_objects``."""
        resp = self._call("ListClasses", pb.ListClassesRequest(
            read=self._read_options(consistency)))
        return {c.name: c.version for c in resp.classes}

    def get_class(self, name: str, version: int | None = None, *,
                  consistency: str | None = None) -> ClassSource:
        """{"name", "version", "source"} of a class (default: its newest version). A read,
        as ``list_objects``."""
        request = pb.GetClassRequest(name=name, read=self._read_options(consistency))
        if version is not None:
            request.version = version
        resp = self._call("GetClass", request)
        return ClassSource(name=resp.name, version=resp.version, source=resp.source)

    # --- cluster ---------------------------------------------------------------------------

    def status(self, *, consistency: str | None = None) -> Status:
        """The cluster as the leader sees it (or, without a known leader, any replica): a
        dict with the StatusResponse fields, ``address`` (who answered) and ``nodes``. A
        read, as ``list_objects``: "sequential" answers from a replica that has no leader
        too (what ``gesmas status`` asks)."""
        request = pb.StatusRequest(read=self._read_options(consistency))
        address, resp = self._send("Status", request)
        leader = resp.leader_address
        if not resp.is_leader and leader and leader != address:
            try:
                request.read.min_index = self._seen.index
                resp = self._attempt(leader, "Status", request, RPC_TIMEOUT)
                address = leader
            except (core.Failure, GesmasError) as e:
                log.debug("gesmas: status from leader %s failed: %s", leader, e)
        nodes = [NodeHealth(node_id=n.node_id, address=n.address, connected=n.connected,
                            match_index=n.match_index) for n in resp.nodes]
        return Status(
            address=address, node_id=resp.node_id, leader_address=resp.leader_address,
            is_leader=resp.is_leader, term=resp.term, commit_index=resp.commit_index,
            last_applied=resp.last_applied, object_count=resp.object_count,
            waiter_count=resp.waiter_count, session_count=resp.session_count, nodes=nodes,
            rejoining=resp.rejoining, applied_index=resp.applied_index,
        )

    def state_digest(self) -> str:
        """A hash of the replicated state as computed by the replica this client's calls go
        to (with ``route="replica"``: the replica it was given), at the point in the log
        where the request was applied. Replicas that agree give equal digests when nothing
        else changes the state in between. O(state) on every replica: for checks, not for
        polling."""
        _, resp = self._send("Status", pb.StatusRequest(
            with_digest=True, read=self._read_options(None)))
        return resp.state_digest

    # --- backups (administration) -------------------------------------------------------------

    def backup(self, timeout: float = 300.0) -> tuple[backups.Header, bytes]:
        """A backup of the replicated state (the Backup RPC): the header (log index K, the
        state digest at K, the members...) and the checkpoint's bytes, checked against the
        header's size and SHA-256. Needs the admin permission when auth is on. Write it with
        ``gesmas.protocol.backups.write`` (what ``gesmas backup FILE`` does)."""
        chunks = self._call("Backup", pb.BackupRequest(), rpc_timeout=timeout)
        if not chunks or not chunks[0].HasField("info"):
            raise GesmasError("the Backup answer has no header (an older server?)")
        info = chunks[0].info
        blob = b"".join(c.data for c in chunks)
        head = backups.Header(
            index=info.index, state_digest=info.state_digest, sha256=info.sha256,
            size=info.size, checkpoint_format=info.checkpoint_format,
            members=list(info.members), node_id=info.node_id, created=info.created)
        try:
            backups.check(head, blob)
        except backups.BadBackup as e:
            raise GesmasError(f"the backup received is not intact: {e}") from None
        return head, blob

    # --- membership (administration) ---------------------------------------------------------

    def add_node(self, raft_addr: str, client_addr: str = "") -> bool:
        """Add the replica with Raft address ``raft_addr`` ("host:port") to the cluster's Raft
        configuration; ``client_addr`` is its client address, for leader hints. Goes to the
        leader (followed through leader hints) and returns once the change is committed:
        True if it was added, False if it already was a member. Start the new replica
        afterwards (README "Replacing a node"). Raises ``ApplicationError`` (type
        "MembershipChangeDenied") if the Raft layer refuses the change, ``Unavailable`` if
        no leader could confirm it in time."""
        resp = self._call("AddNode", pb.AddNodeRequest(raft_addr=raft_addr,
                                                       client_addr=client_addr),
                          rpc_timeout=RPC_TIMEOUT + 5.0)
        return bool(resp.changed)

    # --- users, roles, auth (administration) ------------------------------------------------

    def auth(self, op: str, **args: Any) -> Any:
        """One operation on users, roles, quotas or the auth flag (AuthRequest in the proto:
        ``user_add``, ``user_grant``, ``role_grant``, ``auth_enable``, ...); returns its
        answer. Passwords go as ``password=`` and are hashed by the replica."""
        request = pb.AuthRequest(op=op)
        convert.fill_map(request.args, args)
        return convert.from_value(self._call("Auth", request).result)

    def authenticate(self) -> str:
        """Log in now (normally done on the first call) and return the token, e.g. to hand
        to another process as ``Client(token=...)``."""
        if not self._login.can_renew():
            raise ValueError("authenticate() needs user= and password=")
        address = self._routing.first(False, time.monotonic())
        meta = self._login.metadata(self._authenticate(address))
        return meta[0][1].partition(" ")[2]

    def remove_node(self, raft_addr: str) -> bool:
        """Remove the replica with Raft address ``raft_addr`` from the Raft configuration
        (e.g. a dead one). True if it was removed, False if it was not a member. The leader
        cannot remove itself (``ApplicationError``, type "IsLeader")."""
        resp = self._call("RemoveNode", pb.RemoveNodeRequest(raft_addr=raft_addr),
                          rpc_timeout=RPC_TIMEOUT + 5.0)
        return bool(resp.changed)

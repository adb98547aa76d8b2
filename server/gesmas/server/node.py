"""One replica = one process: a Raft node (replication.Replica), the kernel on its apply thread,
a grpc.aio gateway on the event loop, and the leader's duties.

Threads: pysyncobj's tick thread runs Raft and queues the committed commands; the replica's
apply thread applies them to the kernel (`StateMachine.apply`);
calls waiting here and the hand-off of their answers to the event loop are in calls.py; the
event loop runs the gateway and, every `duty_period`, the leader's duties (duties.py), which
are commands proposed through the log. Membership changes (AddNode / RemoveNode) go through
pysyncobj on the leader. A blocked call costs a pending future, no thread.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any, Callable

import grpc

from gesmas.objects import RESERVED_CLASSES, standard_sources
from gesmas.v1 import gesmas_pb2_grpc as pb_grpc

from . import grpclimits, tokens
from .backup import Backups
from .config import MAX_MESSAGE, NodeConfig, is_loopback
from .calls import STOPPING, CallFailed, PendingCalls
from .duties import LeaderDuties
from .gateway import Gateway
from .membership import Membership
from .node_reads import READ_WAIT, NodeReads
from .replication.reads import LINEARIZABLE
from .kernel import Config as KernelConfig
from .kernel import Kernel, codec
from .kernel.errors import Code, Error, KernelError
from .kernel.kernel import Completion

log = logging.getLogger(__name__)

class ReplicaFailed(RuntimeError):
    """The replica stopped applying the log (Replica.fatal); the process exits with 3."""


HEALTH_PERIOD = 0.5          # seconds between two health checks of this replica
#: A keep-alive is answered only by a leader that a majority answered within this many
#: seconds, so that an acknowledged keep-alive cannot predate a new leader's fresh grant
#: of the session's TTL by more than that (a leader paused, then resumed, has not stepped
#: down yet): the client's lease margin counts on it (gesmas.client.session.LEADER_LEASE).
KEEPALIVE_LEASE = 1.0
CATCH_UP = 1.0               # seconds a refusal decided on local users waits for the log


class StateMachine:
    """What the Replica drives: the kernel plus node-local bookkeeping on the apply thread."""

    def __init__(self, node: Node, kernel: Kernel) -> None:
        self.node = node
        self.kernel = kernel
        self.deliver = True

    @property
    def checkpoint_index(self) -> int | None:
        return self.kernel.checkpoint_index

    @property
    def checkpoint_blob(self) -> bytes | None:
        return self.kernel.checkpoint_blob

    @property
    def checkpoint_result(self) -> Any:
        """The last checkpoint's bytes, or a handle while it is captured (kernel/capture.py)."""
        return self.kernel.checkpoint_result

    def capture_some(self, limit: int) -> bool:
        return self.kernel.capture_some(limit)

    def close(self) -> None:
        """Replaced by another state machine (the replica's applier)."""
        self.kernel.close()

    def apply(self, index: int, data: bytes) -> list[Completion]:
        try:
            cmd = codec.decode(data)
        except codec.UnknownFormat:
            # written by a newer gesmas: skipping it would make this replica diverge. The
            # Replica stops (fatal), the process exits 3 (README "Rolling upgrades").
            raise
        except BaseException as e:       # DecodeError, RecursionError on deep nesting...
            log.error("log entry %d is not a command: %s", index, type(e).__name__)
            return []
        metrics = self.node.metrics
        if metrics is not None and isinstance(cmd, (codec.Checkpoint, codec.ExpireSession)):
            started = time.perf_counter()
            out = self.kernel.apply(index, cmd, data)
            if isinstance(cmd, codec.Checkpoint):
                metrics.checkpoint.observe(time.perf_counter() - started)
            elif not out or out[0].error is None:
                metrics.sessions_expired.inc()
            self.node._applied(index, cmd, out, self.kernel, self.deliver)
            return out
        out = self.kernel.apply(index, cmd, data)
        self.node._applied(index, cmd, out, self.kernel, self.deliver)
        return out

    def abort(self, index: int, data: bytes, message: str) -> list[Completion]:
        """The cluster aborted the entry at `index` (replication/applier.py)."""
        out = self.kernel.abort(index, data, message)
        self.node.leader_duties.applied(index, self.kernel, time.monotonic())
        if self.deliver:
            self.node.calls.applied(out, out[0].tag if out else "", index)
        return out

    @staticmethod
    def is_checkpoint(data: bytes) -> bool:
        return codec.is_checkpoint(data)


class Node(Membership):
    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self._loop: asyncio.AbstractEventLoop | None = None
        # Tags name a call on this replica. Calls from an earlier run of this node may still
        # wait in the replicated state under their tags, so each run gets its own prefix.
        self.calls = PendingCalls(f"{config.node_id}.{os.urandom(4).hex()}:")
        root_hash = tokens.hash_password(config.root_password) if config.root_password else None
        self.leader_duties = LeaderDuties(config.checkpoint_every, config.default_ttl,
                                          standard_sources, root_hash)
        self._leader_ready = False        # leader, and its state machine is up to date
        self.replica: Any = None
        self._kernel: Kernel | None = None  # the last state machine made, before the replica
        self.metrics: Any = None           # metrics.Metrics with --metrics-addr
        self._membership_busy = False
        self._catching_up: asyncio.Future[None] | None = None   # catch_up's shared poll
        self.reads = NodeReads(self)       # reads without a log entry
        self.backups = Backups()           # the Backup RPCs in flight here (backup.py)
        self.stopping = False              # serve() is ending: no new calls
        self._cancels: list[list[Any]] = []   # withdrawn waits not proposed yet

    # -- the state machine side (apply thread) --------------------------------------------------

    def make_state_machine(self, kernel: Kernel | None = None) -> StateMachine:
        kernel = kernel or Kernel(self._kernel_config())
        self.leader_duties.reset(kernel, time.monotonic())
        self.reads.changes.everything(kernel.index)      # waiting readers look again
        if self.replica is None:
            self._kernel = kernel
        return StateMachine(self, kernel)

    @property
    def kernel(self) -> Kernel | None:
        """The kernel of the state machine the replica applies to, for local reads (auth state,
        stats, metrics). A state machine being rebuilt from a snapshot is not it until the
        replica installs it: its auth state would be the checkpoint's, not the log's."""
        sm = getattr(self.replica, "_sm", None)
        return sm.kernel if isinstance(sm, StateMachine) else self._kernel

    def restore_state_machine(self, blob: bytes) -> StateMachine:
        return self.make_state_machine(Kernel.restore(blob, self._kernel_config()))

    def _kernel_config(self) -> KernelConfig:
        return KernelConfig(skip_entries=self.config.skip_entries,
                            reserved_classes=RESERVED_CLASSES,
                            failpoint_native_stall=self.config.failpoint_native_stall)

    def _applied(self, index: int, cmd: codec.Command, out: list[Completion], kernel: Kernel,
                 deliver: bool) -> None:
        self.leader_duties.applied(index, kernel, time.monotonic())
        self.reads.changes.applied(index, kernel.touched, kernel.topics)
        if deliver:
            self.backups.applied(index, cmd, kernel)
            self.calls.applied(out, cmd.tag, index)

    # -- the gateway side (event loop) ------------------------------------------------------

    def new_tag(self) -> str:
        return self.calls.new_tag()

    async def call(self, cmd: codec.Command) -> tuple[Completion, int]:
        """Propose `cmd` and wait for its completion on this replica: (the completion, the
        log index whose applying produced it, 0 when it failed without an answer)."""
        if self.stopping:
            raise CallFailed(STOPPING)
        proposed = time.monotonic()
        fut = self.calls.open(cmd.tag, proposed)
        try:
            self._propose(cmd)
            done = await fut
            if self.metrics is not None and not isinstance(cmd, codec.Query):
                self.metrics.proposal.observe(time.monotonic() - proposed)
            return done
        except asyncio.CancelledError:
            if isinstance(cmd, codec.Invoke):     # the caller went away: withdraw its wait
                self._withdraw([cmd.session, cmd.seq, cmd.tag, cmd.secret, cmd.user])
            raise
        finally:
            self.calls.close(cmd.tag)

    #: Cancels proposed in one log entry at most (Cancel.more; ~100 bytes each).
    CANCELS_PER_ENTRY = 512

    def _withdraw(self, call: list[Any]) -> None:
        """Propose a Cancel of `call` ([session, seq, call tag, secret, user]), with the
        others withdrawn in the same turn of the event loop: a stream that breaks with
        20,000 waiting calls cancels them in ~40 log entries, not 20,000 (which kept the
        loop from answering keep-alives for seconds)."""
        self._cancels.append(call)
        if len(self._cancels) == 1:
            asyncio.get_running_loop().call_soon(self._propose_cancels)

    def _propose_cancels(self) -> None:
        cancels, self._cancels = self._cancels, []
        now = time.time()
        for i in range(0, len(cancels), self.CANCELS_PER_ENTRY):
            (session, seq, tag, secret, user), *more = cancels[i:i + self.CANCELS_PER_ENTRY]
            try:
                self._propose(codec.Cancel(ts=now, session=session, seq=seq, call_tag=tag,
                                           secret=secret, user=user, more=more))
            except CallFailed:
                pass     # no leader, or stopping: the session's end withdraws the waits

    def _propose(self, cmd: codec.Command) -> None:
        from .replication import NotLeader, Overloaded, ReplicaStopped
        data = codec.encode(cmd)
        try:
            self.replica.propose(data, self._failed(cmd.tag) if cmd.tag else None)
        except NotLeader:
            raise CallFailed(Error(Code.UNAVAILABLE, "no leader is known; retry", "NoLeader"),
                             self.leader_client_addr() or "") from None
        except (Overloaded, ReplicaStopped) as e:
            raise CallFailed(Error(Code.UNAVAILABLE, f"replica cannot take commands: {e}",
                                   type(e).__name__), self.leader_client_addr() or "") from None
        except ValueError as e:
            raise CallFailed(Error(Code.RESOURCE_EXHAUSTED, f"request too large: {e}",
                                   "TooLarge")) from None

    def _failed(self, tag: str) -> Any:
        """on_failure for a proposal, called on the apply thread. The call fails at once with
        UNAVAILABLE even when the outcome is unknown (the leader changed): the client retries
        with the same (session, seq), which the kernel deduplicates, and the other commands are
        idempotent or harmless to repeat (a second OpenSession just expires unused)."""
        def on_failure(f: Any) -> None:
            self.calls.post([Completion(tag, None, Error(
                Code.UNAVAILABLE, f"the command was not committed ({f.reason}); retry",
                "NotCommitted"))], "")
        return on_failure

    def _role_changed(self, is_leader: bool, leader: str | None) -> None:
        self._leader_ready = is_leader
        if self.metrics is not None:
            self.metrics.leader_changes.inc()

    # -- reads without a log entry (node_reads.py) ---------------------------------------------

    async def read(self, fn: Callable[[Kernel], Any], consistency: str = LINEARIZABLE,
                   min_index: int = 0, wait: float = READ_WAIT) -> tuple[Any, int]:
        """``fn(kernel)`` on this replica's applied state, without a log entry: NodeReads.read."""
        return await self.reads.read(fn, consistency, min_index, wait)

    def _hint(self) -> str:
        """The leader's client address, unless it is this replica's."""
        hint = self.leader_client_addr() or ""
        return "" if hint == self.config.client_addr else hint

    def applied_index(self) -> int:
        """The log index of this replica's applied state (0 before it started)."""
        return self.replica.applied_index() if self.replica is not None else 0

    # -- sessions and leadership -----------------------------------------------------------

    # -- auth state, read locally (the kernel decides; these only spare useless proposals) -----

    def password_hash(self, user: str) -> str | None:
        """The stored password hash of `user` as this replica has applied it (None: no such
        user here, maybe not applied yet). Read on the event loop while the apply thread runs:
        one dict lookup and one read of a value the kernel only ever replaces whole."""
        k = self.kernel
        u = k.auth.users.get(user) if k is not None else None
        return None if u is None else u["hash"]

    def auth_enabled(self) -> bool:
        """Whether this replica has applied `auth_enable` (and not a later disable)."""
        k = self.kernel
        return k is not None and k.auth.enabled

    async def catch_up(self, timeout: float = CATCH_UP) -> None:
        """Wait, at most `timeout` seconds, until this replica has applied every entry it
        knows to be committed (its own commit index, or the leader's as last heard). Called
        before a refusal decided on the local users (gateway.py), so that a user added or a
        password changed a moment ago through another replica is not refused for lag alone.
        Concurrent callers share one poll."""
        task = self._catching_up
        if task is None or task.done():
            task = self._catching_up = asyncio.ensure_future(self._poll_applied(timeout))
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout)
        except TimeoutError:
            pass

    def caught_up_once(self) -> bool:
        """Whether this replica has applied the log up to its leader's commit once since it
        started (pysyncobj's onReady)."""
        return self.replica is not None and self.replica.wait_ready(0)

    def is_current(self) -> bool:
        """Whether this replica knows a leader, has caught up with it once, and has applied
        every entry it knows to be committed: its local reads of the users are the log's."""
        try:
            st = self.replica.status()
        except Exception:
            return False
        target = max(int(st.get("commit_index") or 0), int(st.get("leader_commit_index") or 0))
        return bool(st.get("leader") and st.get("ready")
                    and int(st.get("last_applied") or 0) >= target)

    async def _poll_applied(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        try:
            st = self.replica.status()
            target = max(int(st.get("commit_index") or 0),
                         int(st.get("leader_commit_index") or 0))
            while int(st.get("last_applied") or 0) < target and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
                st = self.replica.status()
        except Exception:              # stopped: nothing more will be applied
            return

    def requires_auth(self) -> bool:
        """A replica whose client port is not loopback and not --insecure serves no
        unauthenticated call until the cluster has auth enabled (bootstrap pending)."""
        c = self.config
        k = self.kernel
        return (not c.insecure and not is_loopback(c.client_addr)
                and not (k is not None and k.auth.enabled))

    def keep_alive(self, session: int, secret: str) -> float:
        if not self.replica.is_leader():
            raise CallFailed(Error(Code.UNAVAILABLE, "keep-alives go to the leader",
                                   "NotLeader"), self.leader_client_addr() or "")
        if not self.replica.leads_with_majority(KEEPALIVE_LEASE):
            raise CallFailed(Error(Code.UNAVAILABLE, "the leader has not heard from a "
                                   f"majority within {KEEPALIVE_LEASE:g} s", "NotLeader"))
        ttl = self.leader_duties.keep_alive(session, secret, time.monotonic())
        if ttl is None:
            raise CallFailed(Error(Code.NOT_FOUND,
                                   f"session {session} is not open (expired or closed)",
                                   "SessionExpired"))
        return ttl

    def leader_client_addr(self) -> str | None:
        leader = self.replica.leader() if self.replica else None
        if leader is None:
            return None
        if leader == self.config.raft_addr:
            return self.config.client_addr
        for raft, client in self.config.peers:
            if raft == leader:
                return client or None
        return None

    def status(self) -> dict[str, Any]:
        st = self.replica.status()
        # its own match index is the end of its own log, as the leader counts the others'
        # (its applied index lags that while entries are being committed and applied)
        own = max(int(st.get("log_last_index") or 0), int(st.get("last_applied") or 0))
        nodes = [{"node_id": self.config.raft_addr, "address": self.config.client_addr,
                  "connected": True, "match_index": own}]
        peer_state = st.get("peers", {})
        for raft, client in self.config.peers:
            p = peer_state.get(raft, {})
            nodes.append({"node_id": raft, "address": client,
                          "connected": bool(p.get("connected")),
                          "match_index": int(p.get("match_index") or 0)})
        return {"node_id": self.config.raft_addr, "leader_address": self.leader_client_addr(),
                "is_leader": self.replica.is_leader(), "term": int(st.get("term", 0)),
                "commit_index": int(st.get("commit_index", 0)),
                "last_applied": int(st.get("last_applied", 0)),
                "rejoining": bool(st.get("rejoining")),
                "nodes": _current_nodes(nodes, peer_state)}

    async def duties(self) -> None:
        """The leader's time-based work (duties.py), each done by proposing a command."""
        while True:
            await asyncio.sleep(self.config.duty_period)
            now = time.monotonic()
            self.calls.fail_stale(now, self.config.commit_timeout)
            leader = self._leader_ready and self.replica.is_leader()
            try:
                for cmd in self.leader_duties.step(now, time.time(), leader):
                    self._propose(cmd)
            except CallFailed:
                pass
            except Exception:
                log.exception("leader duty failed")

    # -- health (grpc.health.v1) ----------------------------------------------------------

    def serving(self, previous_commit: int) -> tuple[bool, int]:
        """(whether this replica should be routed to, the commit index it knows now): it
        knows a leader it can reach and has applied every entry committed at the previous
        check (a replica that keeps up has; a lagging or partitioned one has not)."""
        try:
            st = self.replica.status()
        except Exception:
            return False, previous_commit
        commit = int(st.get("commit_index") or 0)
        leader = st.get("leader")
        # an isolated follower keeps naming its old leader (pysyncobj starts no election
        # while it reaches nobody): the leader counts only while this replica reaches it
        reaches = leader == self.config.raft_addr or \
            bool(st.get("peers", {}).get(leader, {}).get("connected"))
        ok = leader is not None and reaches and \
            int(st.get("last_applied") or 0) >= previous_commit
        return ok, commit

    async def watch_health(self, period: float = HEALTH_PERIOD) -> None:
        from grpc_health.v1 import health_pb2
        statuses = health_pb2.HealthCheckResponse
        commit, last = 0, None
        while True:
            ok, commit = self.serving(commit)
            if ok != last:
                status = statuses.SERVING if ok else statuses.NOT_SERVING
                for service in ("", "gesmas.v1.Gesmas"):
                    await self.health.set(service, status)
                log.info("health: %s", "SERVING" if ok else "NOT_SERVING")
                last = ok
            await asyncio.sleep(period)

    # -- running ---------------------------------------------------------------------------

    def _fatal_handler(self, stop: asyncio.Event) -> Any:
        loop = self._loop
        assert loop is not None

        def on_fatal(exc: BaseException) -> None:      # the tick or the apply thread
            loop.call_soon_threadsafe(stop.set)
        return on_fatal

    def _watchdog(self) -> Any:
        """What starts the runaway watchdog (replication/watchdog.py), or None (limit 0)."""
        c = self.config
        if not c.runaway_limit:
            return None
        from .replication.watchdog import ApplyMonitor
        return lambda: ApplyMonitor(c.data_dir, c.runaway_limit, c.node_id, c.log_format)

    async def serve(self, stop: asyncio.Event) -> None:
        from .replication import RaftTuning, Replica
        self._loop = self.calls.loop = asyncio.get_running_loop()
        c = self.config
        if c.failpoint_native_stall:
            log.warning("test-only failpoint on: uploaded code may call native_stall(n), which "
                        "holds the GIL until the runaway watchdog kills this replica")
        self.replica = Replica(
            self_addr=c.raft_addr, peer_addrs=[p[0] for p in c.peers], data_dir=c.data_dir,
            fresh=self.make_state_machine, restore=self.restore_state_machine,
            on_completions=lambda out: None, on_role_change=self._role_changed,
            on_fatal=self._fatal_handler(stop), password=c.secret, fsync=c.fsync,
            new_cluster=c.new_cluster, watchdog=self._watchdog(),
            tuning=RaftTuning(log_compaction_min_entries=c.snapshot_every))
        if c.metrics_addr:
            from .metrics import Metrics
            self.metrics = Metrics(self)
            metrics_server = self.metrics.serve(c.metrics_addr)
            self.replica._journal.on_sync = self.metrics.fsync.observe
        server = grpc.aio.server(options=grpclimits.server_options(MAX_MESSAGE),
                                 maximum_concurrent_rpcs=grpclimits.maximum_concurrent_rpcs(),
                                 interceptors=[grpclimits.AnswerBudget.for_messages(MAX_MESSAGE)])
        gateway = Gateway(self)
        pb_grpc.add_GesmasServicer_to_server(gateway, server)
        from grpc_health.v1 import health, health_pb2_grpc
        from grpc_reflection.v1alpha import reflection
        from gesmas.v1 import gesmas_pb2
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection(
            (gesmas_pb2.DESCRIPTOR.services_by_name["Gesmas"].full_name,
             "grpc.health.v1.Health", reflection.SERVICE_NAME), server)
        if c.tls_cert and c.tls_key:
            server.add_secure_port(c.client_addr, _server_credentials(c))
        else:
            server.add_insecure_port(c.client_addr)
        await server.start()
        duties = asyncio.create_task(self.duties())
        watch_health = asyncio.create_task(self.watch_health())
        log.info("node %d serving clients on %s, raft on %s", c.node_id, c.client_addr,
                 c.raft_addr)
        print(f"gesmas node {c.node_id} ready: clients {c.client_addr}, raft {c.raft_addr}",
              flush=True)
        try:
            await stop.wait()
            if self.replica.fatal is not None:
                # a replica that can no longer apply the log must not keep answering: exit
                # 3, stopped on purpose (deploy/gesmas.service does not restart it, as a
                # restart would fail the same way; `gesmas up` tries a few times)
                raise ReplicaFailed(repr(self.replica.fatal))
        finally:
            duties.cancel()
            watch_health.cancel()
            if self.metrics is not None:
                metrics_server.shutdown()
                self.metrics.close()
            # answer the calls waiting here and end the Calls streams before the server
            # stops: grpc would cancel them after its grace and log each cancellation as an
            # unhandled error. Their callers retry on another replica.
            self.stopping = True
            self.calls.fail_all(STOPPING)
            gateway.stopping.set()
            await server.stop(grace=1.0)
            self.replica.destroy()


def _server_credentials(c: NodeConfig) -> grpc.ServerCredentials:
    def read(path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()
    assert c.tls_cert and c.tls_key
    ca = read(c.tls_client_ca) if c.tls_client_ca else None
    return grpc.ssl_server_credentials([(read(c.tls_key), read(c.tls_cert))],
                                       root_certificates=ca, require_client_auth=ca is not None)


def _current_nodes(nodes: list[dict[str, Any]],
                   peers: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Status nodes reconciled with the Raft configuration: members this replica knows only
    from pysyncobj (added while it ran, client address unknown here) are listed, removed ones
    (still in this replica's --peers) are not. nodes[0] is this replica."""
    if not peers:
        return nodes
    known = {n["node_id"] for n in nodes}
    out = [nodes[0]] + [n for n in nodes[1:] if n["node_id"] in peers]
    for raft in sorted(peers.keys() - known):
        p = peers[raft]
        out.append({"node_id": raft, "address": "", "connected": bool(p.get("connected")),
                    "match_index": int(p.get("match_index") or 0)})
    return out

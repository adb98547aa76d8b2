"""Replication: the one module that owns pysyncobj (Raft log, durable journal, snapshots).

Theory of operation
-------------------
``Replica`` wraps a pysyncobj ``SyncObj`` (``_RaftNode``) and drives a deterministic state
machine ``sm`` (the kernel) on pysyncobj's tick thread, which is also its apply thread:

* ``propose(data)`` enqueues the bytes as one replicated call of ``_RaftNode._gesmas_apply``;
  a follower forwards it to the leader (pysyncobj does this by itself). When the entry is
  committed every replica calls ``sm.apply(index, data)`` with the same Raft index (the entry
  being applied is always ``raftLastApplied + 1``: pysyncobj increments it after each entry)
  and this node passes the completions to ``on_completions``.
* Snapshots. pysyncobj's custom ``serializer``/``deserializer`` hooks write and read a file
  holding the state machine's last checkpoint (blob, index K) and the commands applied after K
  (DESIGN §5). Loading one = ``restore(blob)`` and re-applying those commands with completions
  suppressed. The state machine object is never pickled: with a custom serializer pysyncobj
  passes ``data=None`` for its own fields.
* Durability (DESIGN §7). pysyncobj internals are touched only here, each override small
  and explained where it is:
  1. ``DurableJournal`` (server/journal.py) replaces ``FileJournal``, plugged in through
     ``_install_journal_factory``; it fsyncs in groups and stores term/vote durably.
  2. ``_DurableTransport.send``/``flush`` queue every outgoing Raft message; ``flush`` syncs
     the journal once and then releases them: a follower acks, and votes go out, only once
     what they claim is on disk. A leader's append_entries (and forwarded commands) leave just
     before the sync, so followers write in parallel (``_early`` says why that is safe).
  3. ``_DurableTransport._onMessageReceived`` + ``filter_append_entries``: a follower
     truncates its log only on a real conflict.
  4. ``Replica._align_journal``: at start-up pysyncobj would discard the journal after a crash
     between writing a snapshot and compacting the log.
  5. ``_RaftNode._gesmas_submit`` encodes commands with pickle protocol 4, not 2.
  6. ``_install_wire``: ChaCha20-Poly1305 instead of Fernet and no zlib for small messages
     (server/raftwire.py); ``flush`` sends what it has for a node as one ``gesmas_batch``.

Measured with ``.venv/bin/python tests/replication_node.py bench --window 1000
[--pysyncobj-defaults] [--no-fsync]``: 3 local processes, ~100-byte commands, on the 2-core
VM while other work ran (load average ~5; one run each, figures vary run to run). Latency:
one command at a time until its completion. Throughput: 1000 in flight. All rows use this
module's durable journal and transport (overrides 1-6); only the timing knobs differ.

=====================  =====================  =====================  ====================
settings               latency on leader      latency via follower   throughput leader /
                       p50 (p99)              p50 (p99)              via follower, cmd/s
=====================  =====================  =====================  ====================
pysyncobj defaults     103 ms (107)           205 ms (209)           7.2k / 4.0k
``RaftTuning()``       0.84 ms (1.5)          1.36 ms (2.7)          29k / 16k
same, ``fsync=False``  0.43 ms (1.0)          0.75 ms (1.1)          21k / 16k
=====================  =====================  =====================  ====================

Group commit at work: the leader made 5302 records durable in 322 fsyncs. Before the early
append_entries (override 2) and override 6 existed, the same command (load 2-3.5) gave
1.3-2.4 ms on the leader and 6.5k-18.5k cmd/s with ``RaftTuning()``. Idle cost: ~1-1.6% of a core per node (0.6-0.8% with the
defaults' 0.1 s heartbeat).
"""
from __future__ import annotations

import itertools
import logging
import os
import pickle
import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import pysyncobj.syncobj as _ps
from pysyncobj import SyncObj, SyncObjConf, replicated
from pysyncobj import tcp_connection as _tcp_connection
from pysyncobj.config import FAIL_REASON
from pysyncobj.encryptor import HAS_CRYPTO
from pysyncobj.encryptor import SALT as _ENCRYPTOR_SALT
from pysyncobj.journal import Journal
from pysyncobj.node import TCPNode
from pysyncobj.transport import TCPTransport

from . import raftwire
from .config import is_loopback
from .journal import DurableJournal, fsync_dir

log = logging.getLogger(__name__)

SNAPSHOT_NAME = "snapshot.bin"
_SNAPSHOT_FORMAT = 1


# --------------------------------------------------------------------------- public types
class ReplicationError(Exception):
    """Base class of the errors ``Replica`` raises."""


class NotLeader(ReplicationError):
    """The command was not accepted: no leader is known (``leader`` None) or forwarding is off."""

    def __init__(self, leader: Optional[str]):
        super().__init__(f"not leader; leader is {leader or 'unknown'}")
        self.leader = leader


class Overloaded(ReplicationError):
    """pysyncobj's command queue is full."""


class ReplicaStopped(ReplicationError):
    """The replica was destroyed, or stopped itself after a fatal state-machine error."""


@dataclass(frozen=True)
class ProposeFailure:
    """Asynchronous outcome of a proposal that pysyncobj reports as not (known to be) applied.

    ``maybe_applied`` is True when the outcome is unknown (the command may still be committed
    and its completion delivered); False when it is certain the command will not be applied.
    """
    reason: str
    maybe_applied: bool
    leader: Optional[str]


_FAILURES = {  # pysyncobj FAIL_REASON -> (name, maybe_applied)
    FAIL_REASON.QUEUE_FULL: ("queue_full", False),
    FAIL_REASON.MISSING_LEADER: ("no_leader", False),
    FAIL_REASON.DISCARDED: ("discarded", False),
    FAIL_REASON.NOT_LEADER: ("not_leader", False),
    FAIL_REASON.LEADER_CHANGED: ("leader_changed", True),
    FAIL_REASON.REQUEST_DENIED: ("denied", False),
    FAIL_REASON.UNKNOWN_OUTCOME: ("unknown_outcome", True),
}


@dataclass(frozen=True)
class RaftTuning:
    """pysyncobj knobs. Defaults chosen from measurements (module docstring).

    ``use_batch=False`` makes pysyncobj wake its loop through a pipe on every proposal and ship
    entries at once; ``_DurableTransport`` still groups them: all entries added in one loop
    iteration share one fsync and travel in one append_entries message per follower.
    """
    append_entries_period: float = 0.05   # heartbeat; pysyncobj default 0.1
    raft_min_timeout: float = 0.5         # election timeout range; default 0.4 .. 1.4
    raft_max_timeout: float = 1.2
    leader_fallback_timeout: float = 1.5  # leader steps down without a majority; default 30
    connection_timeout: float = 3.5
    connection_retry_time: float = 1.0    # default 5.0: slow re-join after restarts
    use_batch: bool = False
    batch_size_bytes: int = 2 ** 20       # also bounds one command (chunked path avoided)
    log_compaction_min_entries: int = 10000
    log_compaction_min_time: float = 300.0
    snapshot_chunk_bytes: int = 2 ** 20
    auto_tick_period: float = 0.05
    commands_queue_size: int = 100000

    @property
    def max_command_bytes(self) -> int:
        # pysyncobj sends an entry whose command is >= batch_size_bytes in 'transmission'
        # chunks, a path with an off-by-some end test and without conflict-only truncation.
        return self.batch_size_bytes - 4096


# --------------------------------------------------------------- pysyncobj override 1: journal
_factory_lock = threading.Lock()
_factory_installed = False


def _install_journal_factory() -> None:
    """Let ``SyncObjConf.journalFile`` carry a ready ``Journal`` object.

    Replaces ``pysyncobj.syncobj.createJournal`` (called once, in ``SyncObj.__init__``) with a
    wrapper that returns the object itself when it already is a ``Journal`` and otherwise calls
    the original, so other users of pysyncobj in the process are unaffected.
    """
    global _factory_installed
    with _factory_lock:
        if _factory_installed:
            return
        original = _ps.createJournal

        def create_journal(journal_file=None):
            if isinstance(journal_file, Journal):
                return journal_file
            return original(journal_file)

        _ps.createJournal = create_journal
        _factory_installed = True


class _ClusterSecret(str):
    """A cluster secret that asks for gesmas' AEAD encryptor instead of Fernet."""


_wire_installed = False


def _install_wire() -> None:
    """Cheaper replica-to-replica messages (server/raftwire.py explains the why and the format).

    Replaces ``pysyncobj.syncobj.getEncryptor`` (called once, in ``SyncObj.__init__``) with a
    wrapper that returns an ``AeadEncryptor`` for a ``_ClusterSecret`` and calls the original
    otherwise, and the ``zlib`` name of ``pysyncobj.tcp_connection`` with ``Framing``. The
    framing is process-wide: every pysyncobj connection of a process that imports gesmas'
    replication speaks it (both ends of a gesmas cluster always do).
    """
    global _wire_installed
    with _factory_lock:
        if _wire_installed:
            return
        original = _ps.getEncryptor

        def get_encryptor(password):
            if isinstance(password, _ClusterSecret):
                return raftwire.AeadEncryptor(raftwire.derive_master(password, _ENCRYPTOR_SALT))
            return original(password)

        _ps.getEncryptor = get_encryptor
        _tcp_connection.zlib = raftwire.Framing
        _wire_installed = True


# ------------------------------------------------- pysyncobj override 2: conflict-only truncation
def filter_append_entries(journal: DurableJournal, msg: dict) -> Optional[dict]:
    """Rewrite an append_entries message so pysyncobj truncates only on a real conflict.

    Replaces part of ``SyncObj.__onMessageReceived`` (branch ``append_entries`` with
    ``prevLogIdx``): once the previous entry matches, pysyncobj deletes *every* entry after
    ``prevLogIdx`` and appends the message's entries. A stale or duplicated message (the
    leader resends from a reset nextIndex, batches overlap) thus cuts entries this follower
    has already acknowledged -- which the leader may have counted for a commit. Raft (Fig. 2,
    AppendEntries step 3) deletes only from the first entry whose term differs.

    Returns the message to hand to pysyncobj, or None to drop it:
    * prefix mismatch, snapshot or chunked messages: unchanged (pysyncobj rejects/handles);
    * entries already present with the same term are stripped and ``prevLogIdx`` moved past
      them, so pysyncobj truncates exactly at the first conflicting entry, or appends;
    * if every entry is already present and the log goes further, the message carries nothing
      new and handing it over would truncate: it is dropped (no reply; the leader has already
      advanced nextIndex past it and keeps sending).
    Whenever pysyncobj then handles the message, the log ends at the last entry the leader
    vouched for, so its ``commit = min(leaderCommit, lastLogIndex)`` is Raft's
    ``min(leaderCommit, index of last new entry)``. (``commit_index`` is left alone: pysyncobj
    also uses it to decide when a catching-up follower is ready.)
    """
    if "prevLogIdx" not in msg or msg.get("transmission") is not None:
        return msg
    prev_idx, prev_term = msg["prevLogIdx"], msg["prevLogTerm"]
    if prev_idx is None or journal.term_at(prev_idx) != prev_term:
        return msg
    entries = msg.get("entries") or []
    k = 0
    while k < len(entries) and journal.term_at(entries[k][1]) == entries[k][2]:
        k += 1
    if k == 0 and (entries or prev_idx == journal.last_index):
        return msg  # nothing already present: pysyncobj's own handling is right
    if k == len(entries):
        verified = entries[-1][1] if entries else prev_idx
        if verified < journal.last_index:
            return None
        return dict(msg, prevLogIdx=verified, prevLogTerm=journal.term_at(verified), entries=[])
    return dict(msg, prevLogIdx=entries[k - 1][1], prevLogTerm=entries[k - 1][2],
                entries=entries[k:])


# ---------------------------------------------------- pysyncobj override 3: group-commit transport
def _ae_tail(msg: dict) -> Tuple[int, int]:
    entries = msg.get("entries")
    if entries:
        return entries[-1][1], entries[-1][2]
    return msg["prevLogIdx"], msg["prevLogTerm"]


def _plain_ae(msg: Any) -> bool:
    return (isinstance(msg, dict) and msg.get("type") == "append_entries"
            and "prevLogIdx" in msg and msg.get("prevLogIdx") is not None
            and "transmission" not in msg)


def coalesce(messages: List[Any], max_bytes: int) -> List[Any]:
    """Merge consecutive messages to one node that say the same thing as one message.

    Contiguous append_entries of one term become one (entries concatenated, latest commit
    index); consecutive successful, non-reset next_node_idx acks become the last one.
    """
    out: List[Any] = []
    size = 0
    for msg in messages:
        prev = out[-1] if out else None
        if prev is not None and _plain_ae(prev) and _plain_ae(msg) \
                and prev["term"] == msg["term"] \
                and _ae_tail(prev) == (msg["prevLogIdx"], msg["prevLogTerm"]):
            extra = sum(len(e[0]) for e in msg.get("entries") or ())
            if size + extra <= max_bytes:
                entries = list(prev.get("entries") or ()) + list(msg.get("entries") or ())
                merged = dict(prev, entries=entries,
                              commit_index=max(prev["commit_index"], msg["commit_index"]))
                out[-1], size = merged, size + extra
                continue
        if prev is not None and isinstance(prev, dict) and isinstance(msg, dict) \
                and prev.get("type") == msg.get("type") == "next_node_idx" \
                and prev["success"] and msg["success"] and not prev["reset"] and not msg["reset"] \
                and msg["next_node_idx"] >= prev["next_node_idx"]:
            out[-1] = msg
            continue
        out.append(msg)
        size = sum(len(e[0]) for e in msg.get("entries") or ()) if _plain_ae(msg) else 0
    return out


BATCH = "gesmas_batch"


def batch(messages: List[Any]) -> List[Any]:
    """Wrap runs of messages to one node in one ``gesmas_batch`` message (in order).

    Each message costs its own pickle, encryption, send call and wake-up of the receiver; a
    flush typically has an append_entries plus forwarded commands or their answers for a
    node. Snapshot chunks (``transmission``) travel alone: they are already large.
    """
    out: List[Any] = []
    for alone, group in itertools.groupby(
            messages, key=lambda m: not isinstance(m, dict) or "transmission" in m):
        run = list(group)
        if alone or len(run) == 1:
            out.extend(run)
        else:
            out.append({"type": BATCH, "messages": run})
    return out


def _early(message: Any) -> bool:
    """May this message leave before the journal's pending records are synced?

    Yes for a leader's append_entries and for a command forwarded to the leader: they ask the
    receiver to store entries or propose a command and claim nothing about this node's log.
    A leader counts its own log towards a commit without an ack (pysyncobj's ``_onTick`` starts
    the count at 1), but it computes commits only at the start of a loop iteration, and the
    followers' acks are read only by the poll that follows ``flush``: by then this flush's sync
    has made the leader's copy durable. So an entry is still committed only once a majority
    has it on disk. Acks (next_node_idx) and votes stay held: they claim durable state.
    """
    return isinstance(message, dict) and (message.get("type") == "apply_command"
                                           or _plain_ae(message))


def split_early(outbox: List[Tuple[Any, Any]]) -> Tuple[List[Tuple[Any, Any]],
                                                         List[Tuple[Any, Any]]]:
    """(messages that may leave before the sync, the rest); per destination, a message never
    overtakes an earlier one, so only each node's leading run of early messages goes first."""
    early: List[Tuple[Any, Any]] = []
    late: List[Tuple[Any, Any]] = []
    blocked: set = set()
    for node, message in outbox:
        if node not in blocked and _early(message):
            early.append((node, message))
        else:
            blocked.add(node)
            late.append((node, message))
    return early, late


class _DurableTransport(TCPTransport):
    """TCPTransport that never lets a Raft message out before the journal is durable.

    Replaces ``TCPTransport.send`` for the Raft messages pysyncobj sends (append_entries,
    next_node_idx acks, votes, forwarded commands): a message is queued; ``flush()`` sends the
    leading ``_early`` messages of each node, syncs the journal once, and sends the rest, each
    node's messages coalesced and batched into one. pysyncobj acknowledges entries
    (next_node_idx) right after ``journal.add`` in ``__onMessageReceived``, and the leader counts its own log as
    matched in ``_onTick``: holding the ack, and the append_entries that lead to any follower
    ack, until ``sync()`` is what makes an acknowledged entry durable. ``flush`` runs at the
    end of each loop iteration before the poll (tick callback) and right after the poll
    (``_RaftNode._onTick``), so each batch of received or proposed entries costs one fsync.
    """

    def __init__(self, syncObj, selfNode, otherNodes):
        self._journal: DurableJournal = syncObj._gesmas_journal
        self._outbox: List[Tuple[Any, Any]] = []
        super().__init__(syncObj, selfNode, otherNodes)
        syncObj.addOnTickCallback(self.flush)

    def send(self, node, message):
        # Everything waits for flush(), which runs before every poll and right after it:
        # held messages wait for the sync, and each flush sends one message per node.
        self._outbox.append((node, message))
        return True

    def flush(self) -> None:
        if self._outbox and self._journal.dirty:
            # Messages that state nothing about this node's log go out before the fsync, so
            # that followers write their copy while this node writes its own (Raft thesis
            # §10.2.1). See _early() for why this keeps "majority durable before commit".
            early, self._outbox = split_early(self._outbox)
            self._send_grouped(early)
        try:
            self._journal.sync()
        except OSError as exc:
            # After a failed fsync the kernel may have dropped the dirty pages, so a retry can
            # "succeed" without the data: nothing held may go out; this replica stops.
            self._outbox = []
            replica = self._syncObj._gesmas_replica
            if replica is not None:
                replica._fail(exc, "journal write/fsync failed")
            raise
        outbox, self._outbox = self._outbox, []
        self._send_grouped(outbox)

    def _send_grouped(self, items: List[Tuple[Any, Any]]) -> None:
        if not items:
            return
        per_node: Dict[Any, List[Any]] = {}
        for node, message in items:
            per_node.setdefault(node, []).append(message)
        limit = self._syncObj.conf.appendEntriesBatchSizeBytes
        for node, messages in per_node.items():
            for message in batch(coalesce(messages, limit)):
                super().send(node, message)

    def _onMessageReceived(self, node, message):
        if isinstance(message, dict) and message.get("type") == BATCH:
            for part in message["messages"]:
                self._onMessageReceived(node, part)
            return
        if isinstance(message, dict) and message.get("type") == "append_entries":
            message = filter_append_entries(self._journal, message)
            if message is None:
                return
        super()._onMessageReceived(node, message)


class _RaftNode(SyncObj):
    """The SyncObj: one replicated method, plus a flush after each poll."""

    def __init__(self, replica: "Replica", self_addr: str, peers: List[str],
                 conf: SyncObjConf, journal: DurableJournal):
        self._gesmas_replica = replica
        self._gesmas_journal = journal
        _install_wire()
        if conf.password is not None and not isinstance(conf.password, _ClusterSecret):
            conf.password = _ClusterSecret(conf.password)
        super().__init__(self_addr, peers, conf, transportClass=_DurableTransport)
        self._gesmas_func_id = self._methodToID[self._getFuncName("_gesmas_apply")]

    def _gesmas_submit(self, data: bytes, callback) -> None:
        """Enqueue one ``_gesmas_apply(data)`` call. Replaces the ``@replicated`` wrapper's
        encoding: it pickles with protocol 2, which stores ``bytes`` as
        ``_codecs.encode(str, 'latin1')`` (bigger, slower); pysyncobj's apply side
        (``__doApplyCommand``) reads any protocol."""
        command = pickle.dumps((self._gesmas_func_id, (data,)), protocol=4)
        self._applyCommand(command, callback, _ps._COMMAND_TYPE.REGULAR)

    @replicated
    def _gesmas_apply(self, data):
        # pysyncobj applies entry raftLastApplied + 1 and increments the counter afterwards.
        self._gesmas_replica._apply_committed(self.raftLastApplied + 1, data)

    def _onTick(self, timeToWait=0.0):
        try:
            super()._onTick(timeToWait)
        finally:
            self._SyncObj__transport.flush()  # acks/votes produced while polling


# ------------------------------------------------------------------------------ Replica
class Replica:
    """One Raft replica driving a deterministic state machine. See the module docstring.

    Callbacks run on pysyncobj's tick thread (the apply thread) and must not block:
    ``on_completions(list)``, ``on_role_change(is_leader, leader)``, ``on_fatal(exc)``.
    ``on_role_change`` reports ``is_leader=True`` only once this leader has applied an entry
    of its own term, i.e. its state machine is up to date: start leader duties then, stop them
    on ``is_leader=False``. Construct the Replica on a thread that lives as long as it:
    pysyncobj's tick thread stops when its creating thread ends.
    """

    def __init__(self, self_addr: str, peer_addrs: Iterable[str], data_dir: str, *,
                 fresh: Callable[[], Any], restore: Callable[[bytes], Any],
                 on_completions: Callable[[list], None],
                 on_role_change: Optional[Callable[[bool, Optional[str]], None]] = None,
                 on_fatal: Optional[Callable[[BaseException], None]] = None,
                 password: Optional[str] = None, fsync: bool = True,
                 bind_addr: Optional[str] = None, tuning: RaftTuning = RaftTuning()):
        peers = [p for p in peer_addrs if p != self_addr]
        addrs = [self_addr, *peers] + ([bind_addr] if bind_addr else [])
        if password is None and not all(is_loopback(a) for a in addrs):
            raise ValueError("a cluster secret (password) is required when any replica address "
                             "is not loopback: pysyncobj speaks pickle over TCP")
        if password is not None and not HAS_CRYPTO:
            raise ValueError("password needs the 'cryptography' package (pip install cryptography)")
        self.self_addr = self_addr
        self.data_dir = data_dir
        self.tuning = tuning
        self._fresh, self._restore = fresh, restore
        self._on_completions, self._on_role_change = on_completions, on_role_change
        self._on_fatal = on_fatal
        self.fatal: Optional[BaseException] = None
        self._ready = threading.Event()
        self._role: Optional[Tuple[bool, Optional[str]]] = None
        # Apply-thread state: the state machine and what a snapshot needs (DESIGN §5).
        self._sm = fresh()
        self._ckpt_index: Optional[int] = None
        self._ckpt_blob: Optional[bytes] = None
        self._since: List[Tuple[int, bytes]] = []
        self.snapshots_loaded = 0
        os.makedirs(data_dir, exist_ok=True)
        self._journal = DurableJournal(data_dir, fsync=fsync)
        self._startup_snapshot = os.path.isfile(os.path.join(data_dir, SNAPSHOT_NAME))
        _install_journal_factory()
        t = tuning
        conf = SyncObjConf(
            password=password, journalFile=self._journal,
            fullDumpFile=os.path.join(data_dir, SNAPSHOT_NAME),
            serializer=self._write_snapshot, deserializer=self._read_snapshot,
            bindAddress=bind_addr or self_addr, dynamicMembershipChange=True,
            commandsWaitLeader=False, onReady=self._ready.set,
            appendEntriesPeriod=t.append_entries_period, raftMinTimeout=t.raft_min_timeout,
            raftMaxTimeout=t.raft_max_timeout, leaderFallbackTimeout=t.leader_fallback_timeout,
            connectionTimeout=t.connection_timeout, connectionRetryTime=t.connection_retry_time,
            appendEntriesUseBatch=t.use_batch, appendEntriesBatchSizeBytes=t.batch_size_bytes,
            logCompactionMinEntries=t.log_compaction_min_entries,
            logCompactionMinTime=t.log_compaction_min_time,
            logCompactionBatchSize=t.snapshot_chunk_bytes, autoTickPeriod=t.auto_tick_period,
            commandsQueueSize=t.commands_queue_size)
        self._node: Optional[_RaftNode] = _RaftNode(self, self_addr, peers, conf, self._journal)
        self._tick_thread = self._node._SyncObj__thread
        self._node.addOnTickCallback(self._on_tick)

    # ----------------------------------------------------------------- gateway API
    def propose(self, data: bytes, on_failure: Optional[Callable[[ProposeFailure], None]] = None,
                forward: bool = True) -> None:
        """Submit one command; never blocks. Thread-safe.

        Raises ``NotLeader`` if no leader is known (or this node is a follower and ``forward``
        is False), ``Overloaded`` if the queue is full, ``ValueError`` if ``data`` is too big.
        Later failures reach ``on_failure`` (on the tick thread); success is the completion.
        """
        node = self._live_node()
        if len(data) > self.tuning.max_command_bytes:
            raise ValueError(f"command of {len(data)} bytes exceeds "
                             f"{self.tuning.max_command_bytes}")
        leader = node._getLeader()
        if leader is None or (not forward and not node._isLeader()):
            raise NotLeader(leader.id if leader is not None else None)
        outcome = _Outcome(self, on_failure)
        try:
            node._gesmas_submit(data, outcome)
        except BlockingIOError:
            pass  # wake-up pipe full: the command is queued and the loop is awake anyway
        outcome.submitted = True
        if outcome.queue_full:
            raise Overloaded("replication queue full")

    def is_leader(self) -> bool:
        node = self._node
        return node is not None and node._isLeader()

    def leader(self) -> Optional[str]:
        node = self._node
        leader = node._getLeader() if node is not None else None
        return leader.id if leader is not None else None

    def wait_ready(self, timeout: Optional[float] = None) -> bool:
        """Wait until this replica has caught up with the leader's commit index once."""
        return self._ready.wait(timeout)

    def status(self) -> Dict[str, Any]:
        node = self._node
        if node is None:
            raise ReplicaStopped("replica destroyed")
        for _ in range(5):  # getStatus iterates dicts the tick thread may be resizing
            try:
                raw = node.getStatus()
                break
            except RuntimeError:
                continue
        else:
            raw = {}
        peers = {}
        for key, value in raw.items():
            if key.startswith("partner_node_status_server_"):
                addr = key[len("partner_node_status_server_"):]
                peers[addr] = {"connected": value == 2,
                               "match_index": raw.get("match_idx_server_" + addr),
                               "next_index": raw.get("next_node_idx_server_" + addr)}
        leader = raw.get("leader")
        return {
            "self": self.self_addr,
            "state": {0: "follower", 1: "candidate", 2: "leader"}.get(raw.get("state"), "?"),
            "leader": leader.id if leader is not None else None,
            "term": raw.get("raft_term"),
            "commit_index": raw.get("commit_idx"),
            "last_applied": raw.get("last_applied"),
            "leader_commit_index": raw.get("leader_commit_idx"),
            "log_len": raw.get("log_len"),
            "log_last_index": self._journal_last_index(),
            "has_quorum": raw.get("has_quorum"),
            "peers": peers,
            "ready": self._ready.is_set(),
            "checkpoint_index": self._ckpt_index,
            "commands_since_checkpoint": len(self._since),
            "journal_syncs": self._journal.syncs,
            "journal_synced_records": self._journal.synced_records,
            "fsync": self._journal.fsync_enabled,
            "snapshots_loaded": self.snapshots_loaded,
            "fatal": repr(self.fatal) if self.fatal is not None else None,
        }

    def _journal_last_index(self) -> Optional[int]:
        try:
            return self._journal.last_index
        except IndexError:  # compacted concurrently on the tick thread
            return None

    def add_node(self, addr: str, on_done: Optional[Callable[[bool, str], None]] = None) -> None:
        """Add a replica (dynamic membership). Start it first with all current members as peers;
        wait for ``on_done(True, ...)`` before the next change."""
        self._live_node().addNodeToCluster(addr, callback=_membership_callback(on_done))

    def remove_node(self, addr: str, on_done: Optional[Callable[[bool, str], None]] = None) -> None:
        self._live_node().removeNodeFromCluster(addr, callback=_membership_callback(on_done))

    def force_compaction(self) -> None:
        """Take a snapshot and compact the log at the next opportunity (tests, admin)."""
        self._live_node().forceLogCompaction()

    def destroy(self, timeout: float = 5.0) -> None:
        node, self._node = self._node, None
        if node is None:
            return
        node.destroy()
        thread = self._tick_thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    # ------------------------------------------------------------- apply thread
    def _live_node(self) -> _RaftNode:
        node = self._node
        if node is None or self.fatal is not None:
            raise ReplicaStopped(f"replica stopped: {self.fatal!r}" if self.fatal else
                                 "replica destroyed")
        return node

    def _apply_committed(self, index: int, data: bytes) -> None:
        if self.fatal is not None:
            return
        sm = self._sm
        log.debug("applying log entry %d", index)
        try:
            completions = sm.apply(index, data)
        except BaseException as exc:  # the state machine may be half-updated: fail-stop
            self._fail(exc, f"state machine failed applying index {index}")
            return
        self._since.append((index, data))
        ckpt = sm.checkpoint_index
        if ckpt is not None and ckpt != self._ckpt_index:
            self._ckpt_index, self._ckpt_blob = ckpt, sm.checkpoint_blob
            self._since = [(i, d) for i, d in self._since if i > ckpt]
        if completions:
            try:
                self._on_completions(completions)
            except Exception:
                log.exception("on_completions raised (ignored)")

    def _fail(self, exc: BaseException, what: str) -> None:
        log.critical("%s: %r; this replica stops", what, exc, exc_info=exc)
        self.fatal = exc
        node = self._node
        if node is not None:
            node.destroy()
        if self._on_fatal is not None:
            try:
                self._on_fatal(exc)
            except Exception:
                log.exception("on_fatal raised")

    def _on_tick(self) -> None:
        node = self._node
        if node is None or self._on_role_change is None:
            return
        leader = node._getLeader()
        # A leader is 'ready' once it applied an entry of its own term (its no-op): its state
        # machine then reflects every earlier committed entry.
        ready_leader = node._isLeader() and \
            self._journal.term_at(node.raftLastApplied) == node.raftCurrentTerm
        role = (ready_leader, leader.id if leader is not None else None)
        if role != self._role:
            self._role = role
            try:
                self._on_role_change(*role)
            except Exception:
                log.exception("on_role_change raised (ignored)")

    # --------------------------------------------------------------- snapshots
    def _write_snapshot(self, filename: str, raft_data) -> None:
        """pysyncobj ``serializer``: runs on the tick thread; ``raft_data`` is
        (entry at lastApplied, entry before it, cluster nodes)."""
        if self.fatal is not None:
            raise ReplicaStopped("not snapshotting a failed state machine")
        last_entry, prev_entry, cluster = raft_data
        payload = {
            "format": _SNAPSHOT_FORMAT,
            "last_entry": last_entry, "prev_entry": prev_entry,
            "cluster": sorted(n.id for n in cluster),
            "checkpoint_index": self._ckpt_index, "checkpoint_blob": self._ckpt_blob,
            "commands": [(i, d) for i, d in self._since if i <= last_entry[1]],
        }
        with open(filename, "wb") as f:
            pickle.dump(payload, f, protocol=5)
            f.flush()
            if self._journal.fsync_enabled:
                os.fsync(f.fileno())
        # pysyncobj renames it into place; DurableJournal.deleteEntriesTo fsyncs the directory
        # before it drops any log entry.

    def _read_snapshot(self, filename: str):
        """pysyncobj ``deserializer`` (at start-up and after receiving a snapshot)."""
        try:
            with open(filename, "rb") as f:
                if self._journal.fsync_enabled:  # a received snapshot: durable before acked
                    os.fsync(f.fileno())
                payload = pickle.load(f)
            if self._journal.fsync_enabled:
                fsync_dir(os.path.dirname(os.path.abspath(filename)))
            if payload.get("format") != _SNAPSHOT_FORMAT:
                raise ValueError(f"unknown snapshot format {payload.get('format')!r}")
            blob = payload["checkpoint_blob"]
            sm = self._restore(blob) if blob is not None else self._fresh()
            commands = list(payload["commands"])
            for index, data in commands:  # completions suppressed: nobody waits for them
                sm.apply(index, data)
            if self._startup_snapshot:
                self._startup_snapshot = False
                self._align_journal(payload["prev_entry"], payload["last_entry"])
            self._sm = sm
            self._ckpt_index, self._ckpt_blob = payload["checkpoint_index"], blob
            self._since = commands
            self.snapshots_loaded += 1
            log.info("loaded snapshot at index %d (checkpoint %s + %d commands)",
                     payload["last_entry"][1], self._ckpt_index, len(commands))
            return (payload["last_entry"], payload["prev_entry"],
                    {TCPNode(a) for a in payload["cluster"]})
        except BaseException as exc:
            self._fail(exc, f"cannot load snapshot {filename}")
            raise

    def _align_journal(self, prev_entry, last_entry) -> None:
        """Start the journal at the snapshot's two entries if it holds them.

        Replaces part of ``SyncObj.__loadDumpFile``: at start-up it clears the journal unless
        its first two entries are the snapshot's. After a crash between the snapshot's rename
        and the journal's compaction (``__tryLogCompaction`` -> ``deleteEntriesTo``), that
        would discard every acknowledged entry after the snapshot point; compacting here (an
        atomic rename) keeps them."""
        journal = self._journal
        if journal.first_index is None or journal.first_index >= prev_entry[1]:
            return
        if journal.entry_at(prev_entry[1]) == tuple(prev_entry) and \
                journal.entry_at(last_entry[1]) == tuple(last_entry):
            journal.deleteEntriesTo(prev_entry[1] - journal.first_index)


class _Outcome:
    """pysyncobj callback for one proposal: forwards failures, notices a full queue."""
    __slots__ = ("replica", "on_failure", "submitted", "queue_full")

    def __init__(self, replica: Replica, on_failure):
        self.replica, self.on_failure = replica, on_failure
        self.submitted = False
        self.queue_full = False

    def __call__(self, result, err):
        if err == FAIL_REASON.SUCCESS:
            return
        if err == FAIL_REASON.QUEUE_FULL and not self.submitted:
            self.queue_full = True  # raised synchronously by propose()
            return
        if self.on_failure is None:
            return
        reason, maybe = _FAILURES.get(err, (f"error_{err}", True))
        try:
            self.on_failure(ProposeFailure(reason, maybe, self.replica.leader()))
        except Exception:
            log.exception("on_failure raised (ignored)")


def _membership_callback(on_done):
    if on_done is None:
        return None

    def callback(result, err):
        on_done(err == FAIL_REASON.SUCCESS, _FAILURES.get(err, ("ok", False))[0])
    return callback

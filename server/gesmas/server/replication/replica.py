"""`Replica`: one Raft replica driving a deterministic state machine, with its snapshots
(the state machine's checkpoint plus the commands applied since) and membership changes.
What happens on the apply thread (generations, entries held back, aborts) is applier.py's;
the runaway watchdog that guards it is watchdog.py's."""
from __future__ import annotations

import logging
import os
import pickle
import threading
import time
from typing import Any, Callable, Dict, Iterable, Optional, Tuple

from pysyncobj import SyncObjConf
from pysyncobj.config import FAIL_REASON
from pysyncobj.encryptor import HAS_CRYPTO
from pysyncobj.node import TCPNode

from .apply_thread import ApplyThread, share_from_env
from .applier import ABORT_PREFIX, Applier, ApplyFailed, decode_abort
from .journal import DurableJournal, fsync_dir
from .reads import AppliedReads, IndexCallback, ReadIndex
from .rejoin import RejoinGuard
from .snapshots import BackgroundSerializer, written_over
from .overrides import _install_journal_factory, _RaftNode
from .tcpconn import close_stale_handshakes
from .types import (_FAILURES, NotLeader, Overloaded, ProposeFailure, RaftTuning,
                    ReplicaStopped)
from .watchdog import ApplyMonitor, read_record, remove_record

log = logging.getLogger(__name__)


SNAPSHOT_NAME = "snapshot.bin"
_SNAPSHOT_FORMAT = 1        # 2: its commands hold an aborted entry (an older gesmas would run it)
_SNAPSHOT_FORMATS = (1, 2)


class Replica:
    """One Raft replica driving a deterministic state machine. See the module docstring.

    Callbacks run on pysyncobj's tick thread (the apply thread) and must not block:
    ``on_completions(list)``, ``on_role_change(is_leader, leader)``, ``on_fatal(exc)``.
    The state machine (made by ``fresh()`` or ``restore(blob)``) is described in applier.py.
    ``watchdog``, if given, starts the runaway watchdog (``watchdog.ApplyMonitor``) once the
    data dir is this replica's: a process of its own that kills this whole process when an
    entry runs away (so give it to one Replica per process only).
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
                 bind_addr: Optional[str] = None, tuning: RaftTuning = RaftTuning(),
                 new_cluster: bool = False,
                 watchdog: Optional[Callable[[], ApplyMonitor]] = None):
        # Always, loopback too: peers exchange pickles, and only the secret's AEAD tag on each
        # frame (overrides.py, override 7) keeps a stranger's pickle from being loaded.
        if not password:
            raise ValueError("a cluster secret is required (the Replica's password): the Raft "
                             "port authenticates every frame with it before unpickling")
        peers = [p for p in peer_addrs if p != self_addr]
        if not HAS_CRYPTO:
            raise ValueError("password needs the 'cryptography' package (pip install cryptography)")
        self.self_addr = self_addr
        self.data_dir = data_dir
        self.tuning = tuning
        self._on_completions, self._on_role_change = on_completions, on_role_change
        self._on_fatal = on_fatal
        self.fatal: Optional[BaseException] = None
        self._ready = threading.Event()          # pysyncobj applied the leader's commit once
        self._caught_up = threading.Event()      # ... and so had the apply thread
        self._role: Optional[Tuple[bool, Optional[str]]] = None
        self.snapshots_loaded = 0
        os.makedirs(data_dir, exist_ok=True)
        # an empty data dir that is not a new cluster's: no vote until caught up (rejoin.py)
        self.rejoin = RejoinGuard.open(data_dir, SNAPSHOT_NAME, bool(peers), new_cluster, fsync)
        self._journal = DurableJournal(data_dir, fsync=fsync, mark=ABORT_PREFIX)
        self._abort_targets: Dict[Tuple[int, bytes], int] = {}
        self._raft: Optional[_RaftNode] = None          # set by _RaftNode.__init__
        # the data dir is ours (the journal's lock): the watchdog may write its page there
        self.monitor = watchdog() if watchdog is not None else None
        # Apply-thread state: the state machine and what a snapshot needs (DESIGN §5)
        self._applier = Applier(fresh, restore, self._deliver, monitor=self.monitor,
                                record=read_record(data_dir),
                                forget_record=lambda: remove_record(data_dir),
                                pending_abort=self._pending_abort)
        self._startup_snapshot = os.path.isfile(os.path.join(data_dir, SNAPSHOT_NAME))
        # The apply thread (override 15, apply_thread.py): committed entries are queued by the
        # tick thread and applied there, so Raft's heartbeats and votes never wait for the kernel.
        self._applying = ApplyThread(f"gesmas-apply-{self_addr}", self._apply_entry,
                                     lambda: self.applied_reads.run_due(), self._background,
                                     share_from_env())
        # Reads without a log entry (reads.py): the ReadIndex protocol, and the reads that
        # run against the applied state under the lock the apply thread holds per entry
        self.read_index = ReadIndex(self._journal.term_at)
        self.applied_reads = AppliedReads(self.applied_index, lambda: self._applier.sm,
                                          lambda: self._applier.applied, self._wake)
        _install_journal_factory()
        t = tuning
        conf = SyncObjConf(
            password=password, journalFile=self._journal,
            fullDumpFile=os.path.join(data_dir, SNAPSHOT_NAME),
            serializer=self._write_snapshot, deserializer=self._read_snapshot,  # override 13
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
        # override 13: snapshot files are written on a thread of their own (snapshots.py)
        self.snapshots = BackgroundSerializer(conf.fullDumpFile, conf.logCompactionBatchSize,
                                              self._snapshot_payload, self._write_snapshot,
                                              self._read_snapshot, fsync)
        self._node._SyncObj__serializer = self.snapshots
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

    def leads_with_majority(self, within: float) -> bool:
        """This replica is the leader and a majority of the cluster (itself included)
        answered it within the last ``within`` seconds: no other replica can have been
        elected before that (any majority that elects one holds a replica that answered
        this leader since, in its term). pysyncobj's own step-down waits longer
        (``leader_fallback_timeout``) and only on its tick, which a paused process has not
        run yet when it resumes."""
        node = self._node
        if node is None or not node._isLeader():
            return False
        others = list(node._SyncObj__otherNodes)
        try:
            heard = dict(node._SyncObj__lastResponseTime)
        except RuntimeError:                  # changed under the copy: ask again
            heard = dict(node._SyncObj__lastResponseTime)
        since = time.monotonic() - within
        count = 1 + sum(1 for n in others if heard.get(n, 0.0) > since)
        return count > (len(others) + 1) / 2

    def applied_index(self) -> int:
        """The highest log index whose effects the state machine holds (the entries after the
        last one it applied change nothing: pysyncobj's no-ops, membership changes), minus
        any held back (applier.py). Any thread; a plain read."""
        node = self._raft
        if node is None:
            return self._applier.applied
        held = self._applier.held
        if held:
            return held[0][0] - 1
        behind = self._applying.last_done_if_behind()  # the apply thread is behind pysyncobj
        return node.raftLastApplied if behind is None else behind

    def request_read_index(self, callback: IndexCallback) -> None:
        """Ask for the index a linearizable read must wait for (reads.py): ``callback(index,
        None)`` or ``callback(None, reason)``, later, on the tick thread. Thread-safe."""
        self._live_node()
        self.read_index.request(callback)
        self._wake()

    def read_applied(self, need: int, fn: Callable[[Any], Any],
                     done: Callable[[Any, int, Optional[BaseException]], None]) -> Any:
        """Run ``fn(state machine)`` once index ``need`` is applied, serialized with the
        applying of entries, then ``done(value, index it reflects, error)``: at once on this
        thread when it can, else on the tick thread. Returns a handle whose ``cancelled``
        flag drops the read while it waits. Thread-safe."""
        return self.applied_reads.submit(need, fn, done)

    def _wake(self) -> None:
        """Make the tick thread run a loop iteration now rather than after its poll."""
        node = getattr(self, "_node", None)
        notifier = getattr(node, "_SyncObj__pipeNotifier", None) if node is not None else None
        if notifier is not None:
            try:
                notifier.notify()
            except OSError:       # the pipe is full (the loop is awake anyway) or closed
                pass

    def leader(self) -> Optional[str]:
        node = self._node
        leader = node._getLeader() if node is not None else None
        return leader.id if leader is not None else None

    def wait_ready(self, timeout: Optional[float] = None) -> bool:
        """Wait until this replica has caught up with the leader's commit index once (and
        applied what it had then)."""
        if self._caught_up.is_set():              # once is enough: it stays true
            return True
        started = time.monotonic()
        if not self._ready.wait(timeout):
            return False
        left = None if timeout is None else max(0.0, timeout - (time.monotonic() - started))
        if not self.wait_applied_all(left):
            return False
        self._caught_up.set()
        return True

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
        applier = self._applier
        held = applier.held
        holding = held[0][0] if held else None
        return {
            "self": self.self_addr,
            "state": {0: "follower", 1: "candidate", 2: "leader"}.get(raw.get("state"), "?"),
            "leader": leader.id if leader is not None else None,
            "term": raw.get("raft_term"),
            "commit_index": raw.get("commit_idx"),
            "last_applied": self.applied_index(),    # the apply thread's (held: before them)
            "leader_commit_index": raw.get("leader_commit_idx"),
            "log_len": raw.get("log_len"),
            "log_last_index": self._journal_last_index(),
            "has_quorum": raw.get("has_quorum"),
            "peers": peers,
            "ready": self._caught_up.is_set() or self.wait_ready(0),
            "checkpoint_index": applier.gens[-1].index or None,
            "commands_since_checkpoint": len(applier.gens[-1].entries),
            "holding": holding,                       # entry held back (applier.py), or None
            "held_entries": len(held),
            "runaway_aborts": applier.aborts,
            "journal_syncs": self._journal.syncs,
            "journal_synced_records": self._journal.synced_records,
            "fsync": self._journal.fsync_enabled,
            "snapshots_loaded": self.snapshots_loaded,
            # followers' answers written before their snapshot arrived, not acted on (override 19)
            "stale_answers_ignored": node._gesmas_sent.ignored,
            "fatal": repr(self.fatal) if self.fatal is not None else None,
            "rejoining": self.rejoin is not None,     # no vote until caught up (rejoin.py)
            # queued for peers beyond what their connections were handed (override 17)
            "send_backlog_bytes": self._send_backlog_bytes(node),
            # times a snapshot chunk waited for its follower's rate (override 23)
            "snapshot_chunks_paced": getattr(getattr(node._SyncObj__transport, "pacer", None),
                                             "held", 0),
        }

    @staticmethod
    def _send_backlog_bytes(node: Any) -> int:
        backlog = getattr(node._SyncObj__transport, "backlog_bytes", None)
        try:
            return backlog() if backlog is not None else 0
        except RuntimeError:        # the tick thread changed the backlogs meanwhile
            return 0

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
        self._applying.stop(timeout)
        if self.monitor is not None:
            self.monitor.stop()

    # ------------------------------------------------------------- apply thread
    def _live_node(self) -> _RaftNode:
        node = self._node
        if node is None or self.fatal is not None:
            raise ReplicaStopped(f"replica stopped: {self.fatal!r}" if self.fatal else
                                 "replica destroyed")
        return node

    @property
    def _sm(self) -> Any:
        return self._applier.sm

    def _apply_committed(self, index: int, data: bytes) -> None:
        """pysyncobj's tick thread: queue a committed entry for the apply thread."""
        if self.fatal is None:
            self._applying.put(index, data)

    def _apply_entry(self, index: int, data: bytes) -> None:
        """The apply thread: one committed entry, under the reads' lock (reads see the state
        between two entries)."""
        try:
            if self.fatal is None:
                with self.applied_reads.lock:
                    log.debug("applying log entry %d", index)
                    self._applier.apply(index, data)
        except ApplyFailed as e:
            self._fail(e.cause, e.what)
        except BaseException as e:          # a bug of this layer: fail-stop all the same
            self._fail(e, f"the apply thread failed at log index {index}")

    def _background(self) -> bool:
        """The apply thread, nothing queued: a slice of the open checkpoint capture."""
        try:
            if self.fatal is not None:
                return False
            with self.applied_reads.lock:
                return self._applier.background()
        except BaseException as e:          # a bug of this layer or the kernel: fail-stop
            self._fail(e, "the apply thread's background work failed")
            return False

    def capturing(self) -> bool:
        """Whether the newest checkpoint is still being captured (no snapshot of it yet)."""
        return self._applier.capturing()

    def _on_apply_thread(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn()`` on the apply thread and wait for it (apply_thread.py, jobs)."""
        return self._applying.call(fn)

    def applying(self) -> bool:
        """Whether committed entries wait for the apply thread (or one is being applied)."""
        return self._applying.busy()

    def wait_applied_all(self, timeout: Optional[float] = None) -> bool:
        """Wait until the apply thread has applied every entry queued so far."""
        return self._applying.wait_idle(timeout)

    def _deliver(self, completions: list) -> None:
        try:
            self._on_completions(completions)
        except Exception:
            log.exception("on_completions raised (ignored)")

    def _pending_abort(self, index: int) -> bool:
        """Whether a committed Abort of entry `index` is in the journal (applier.py)."""
        marked, node = self._journal.marked, self._raft
        if not marked or node is None:
            return False
        commit, targets = node.raftCommitIndex, self._abort_targets
        for _ in range(5):          # the tick thread may be adding to it (apply thread here)
            try:
                items = list(marked.items())
                break
            except RuntimeError:
                continue
        else:
            items = []
        for at, command in items:
            if at > commit:
                continue
            target = targets.get((at, command))
            if target is None:
                if len(targets) > 2 * len(marked):
                    targets.clear()
                parsed = decode_abort(_entry_data(command))
                target = targets[(at, command)] = parsed[0] if parsed else 0
            if target == index:
                return True
        return False

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
        if node is None:
            return
        transport = node._SyncObj__transport
        now = time.monotonic()
        close_stale_handshakes(transport, now)
        # reads (reads.py): start a ReadIndex round or ask the leader, and send that now
        # rather than after the poll; then run the reads whose index is applied
        if self.read_index.tick(node, transport, now) or transport._outbox:
            transport.flush()
        self.applied_reads.run_due()
        guard = self.rejoin
        if guard is not None:
            applied = node.raftLastApplied
            if guard.caught_up(node._isLeader(), node.raftCurrentTerm, applied,
                               self._journal.term_at(applied)):
                guard.clear()
                self.rejoin = None
                # a warning only if it had to refuse votes (rejoin.py warned then)
                log.log(logging.WARNING if guard.refused else logging.INFO,
                        "rejoining replica caught up (index %d, term %d): it votes again",
                        applied, node.raftCurrentTerm)
        applier = self._applier
        if applier.held:
            abort = applier.due_proposal(time.monotonic())
            if abort is not None and self.fatal is None:
                try:
                    self.propose(abort)
                except (NotLeader, Overloaded, ReplicaStopped):
                    pass                                  # proposed again in PROPOSE_EVERY
        if self._on_role_change is None:
            return
        leader = node._getLeader()
        # A leader is 'ready' once it applied an entry of its own term (its no-op): its state
        # machine then reflects every earlier committed entry. Not while it holds entries.
        ready_leader = node._isLeader() and not applier.held and \
            self._journal.term_at(node.raftLastApplied) == node.raftCurrentTerm
        role = (ready_leader, leader.id if leader is not None else None)
        if role != self._role:
            self._role = role
            try:
                self._on_role_change(*role)
            except Exception:
                log.exception("on_role_change raised (ignored)")

    # --------------------------------------------------------------- snapshots
    def _snapshot_payload(self, raft_data) -> dict:
        """What a snapshot holds (BackgroundSerializer's ``prepare``): runs on the tick
        thread; ``raft_data`` is (entry at lastApplied, entry before it, cluster nodes). Only
        references and copies of lists: snapshots.py writes it on a thread of its own."""
        if self.fatal is not None:
            raise ReplicaStopped("not snapshotting a failed state machine")
        last_entry, prev_entry, cluster = raft_data
        state, has_aborted = self._applier.snapshot(last_entry[1])
        return {
            "format": 2 if has_aborted else _SNAPSHOT_FORMAT,
            "last_entry": last_entry, "prev_entry": prev_entry,
            "cluster": sorted(n.id for n in cluster), **state,
        }

    def _write_snapshot(self, filename: str, payload: dict) -> None:
        """Write a snapshot file (BackgroundSerializer's ``write``, on its thread)."""
        # over the blocks of the snapshot before last, synced a MB at a time (snapshots.py)
        with written_over(filename, self._journal.fsync_enabled) as paced:
            pickle.dump(payload, paced, protocol=5)
        # BackgroundSerializer renames it into place; DurableJournal.deleteEntriesTo fsyncs
        # the directory before it drops any log entry.

    def _read_snapshot(self, filename: str):
        """pysyncobj ``deserializer`` (at start-up and after receiving a snapshot)."""
        try:
            with open(filename, "rb") as f:
                if self._journal.fsync_enabled:  # a received snapshot: durable before acked
                    os.fsync(f.fileno())
                payload = pickle.load(f)
            if self._journal.fsync_enabled:
                fsync_dir(os.path.dirname(os.path.abspath(filename)))
            if payload.get("format") not in _SNAPSHOT_FORMATS:
                raise ValueError(f"snapshot format {payload.get('format')!r} is not the one "
                                 "this gesmas reads (1, or 2 with aborted entries): run the "
                                 "gesmas version that wrote it, or a newer one")
            self._applying.supersede()       # entries queued before it are superseded
            def load() -> None:
                with self.applied_reads.lock:
                    self._applier.load(payload, payload["last_entry"][1])
            self._on_apply_thread(load)
            if self._startup_snapshot:
                self._startup_snapshot = False
                self._align_journal(payload["prev_entry"], payload["last_entry"])
            self.snapshots_loaded += 1
            log.info("loaded snapshot at index %d (checkpoint %s + %d commands)",
                     payload["last_entry"][1], payload["checkpoint_index"],
                     len(payload["commands"]))
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


def _entry_data(command: bytes) -> bytes:
    """The gesmas bytes of a journal entry (``_RaftNode._gesmas_submit``'s encoding)."""
    try:
        _, (data,) = pickle.loads(command[1:])
        return data if isinstance(data, bytes) else b""
    except Exception:
        return b""


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

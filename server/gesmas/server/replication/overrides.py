"""Every place where gesmas changes pysyncobj's behaviour (the numbered overrides of the
package docstring): the durable journal factory, the wire format and the Raft node whose
replicated method applies gesmas commands; the group-commit transport it sends with is in
durable_transport.py."""
from __future__ import annotations

import logging
import pickle
import threading
from typing import TYPE_CHECKING, List, Optional

import pysyncobj.syncobj as _ps
from pysyncobj import SyncObj, SyncObjConf, replicated
from pysyncobj import tcp_connection as _tcp_connection
from pysyncobj.encryptor import SALT as _ENCRYPTOR_SALT
from pysyncobj.journal import Journal

from . import catchup, prevote, raftwire
from .durable_transport import _DurableTransport
from .journal import DurableJournal
from .tcpconn import _install_tcp_overrides, _raise_frame_cap
from .transport import DurableMatch

if TYPE_CHECKING:  # pragma: no cover
    from .replica import Replica

log = logging.getLogger(__name__)


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
    """Cheaper replica-to-replica messages (raftwire.py explains the why and the format).

    Replaces ``pysyncobj.syncobj.getEncryptor`` (called once, in ``SyncObj.__init__``) with a
    wrapper that returns an ``AeadEncryptor`` for a ``_ClusterSecret`` and calls the original
    otherwise, and the ``zlib`` name of ``pysyncobj.tcp_connection`` with ``Framing``. The
    framing is process-wide: every pysyncobj connection of a process that imports gesmas'
    replication speaks it (both ends of a gesmas cluster always do). Also installs overrides 7
    (bounded, authenticated reads) and 8 (prompt writes), process-wide as well.
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
        _install_tcp_overrides()
        _wire_installed = True


class _RaftNode(SyncObj):
    """The SyncObj: one replicated method, plus a flush after each poll."""

    _gesmas_due_since: Optional[float] = None   # override 25: when a snapshot became due
    _gesmas_stagger = catchup.SNAPSHOT_STAGGER   # override 25 (GESMAS_SNAPSHOT_STAGGER)

    def __init__(self, replica: "Replica", self_addr: str, peers: List[str],
                 conf: SyncObjConf, journal: DurableJournal):
        self._gesmas_replica = replica
        self._gesmas_journal = journal
        self._gesmas_prevote = prevote.PreVote()
        self._gesmas_catch_up = catchup.CatchUp(conf.appendEntriesPeriod)
        self._gesmas_sent = catchup.SnapshotsSent()
        self._gesmas_stagger = catchup.snapshot_stagger_from_env()   # refused here if bad
        if replica is not None:  # its tick thread may apply entries before __init__ returns
            replica._raft = self
        _install_wire()
        _raise_frame_cap(conf.appendEntriesBatchSizeBytes, conf.logCompactionBatchSize)
        if conf.password is not None and not isinstance(conf.password, _ClusterSecret):
            conf.password = _ClusterSecret(conf.password)
        super().__init__(self_addr, peers, conf, transportClass=_DurableTransport)
        self._gesmas_func_id = self._methodToID[self._getFuncName("_gesmas_apply")]
        notifier = getattr(self, "_SyncObj__pipeNotifier", None)
        if notifier is not None:   # override 20: a finished sync wakes the tick thread's poll
            journal.on_durable = notifier.notify

    # override 21: pysyncobj's ``self.__raftMatchIndex = {}`` (in SyncObj.__init__) lands here
    @property
    def _SyncObj__raftMatchIndex(self):
        return self._gesmas_match

    @_SyncObj__raftMatchIndex.setter
    def _SyncObj__raftMatchIndex(self, values):
        match = DurableMatch(self, getattr(self, "_gesmas_journal", None))
        match.update(values)
        self._gesmas_match = match

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

    def _SyncObj__tryLogCompaction(self):
        # A snapshot already written is always finished (pysyncobj reads its end here): until
        # it is, the serializer answers no follower (getTransmissionData gives None while one
        # is under way), so a gate below that held while one was written (override 18 for a
        # follower wiped just then) kept a wiped follower from any snapshot for minutes. The
        # gates only keep a new one from starting.
        serializer = self._SyncObj__serializer
        state = serializer.under_way() if hasattr(serializer, "under_way") else None
        if state == "replaced":          # nothing to compact, and no new one
            serializer.checkSerializing()
        elif state == "ended":
            super()._SyncObj__tryLogCompaction()    # compacts to it, starts nothing new
        if state is not None:
            return
        replica = self._gesmas_replica
        if replica is not None and replica._applier.held:
            return  # override 11: no snapshot while entries are held back (applier.py)
        if replica is not None and replica.applying():
            return  # override 15: nor while the apply thread is behind (replica.py)
        if replica is not None and replica.capturing():
            return  # nor while the newest checkpoint is being captured (kernel/capture.py)
        if self._gesmas_keeps_log_for_a_follower():
            return  # override 18: nor past a follower that is catching up
        if self._gesmas_staggered(_ps.monotonicTime()):
            return  # override 25: nor at the same moment as the other replicas
        super()._SyncObj__tryLogCompaction()

    def _gesmas_staggered(self, now: float) -> bool:
        """Override 25: whether this replica waits before the snapshot pysyncobj would start
        now. Replicas become due for one together (the same log, the same checkpoint's
        capture ending on each), and each snapshot ends with a rename, the journal rewritten
        and fsyncs, on one host's disk at once when the replicas share it; a call commits
        only once two of three have synced its entry. The leader goes first (its snapshot is
        the one a follower that needs one is sent, so it should be the newest); a follower
        of rank r among the other members' sorted ids waits r * GESMAS_SNAPSHOT_STAGGER
        seconds (catchup.py; 2 s by default) after it became due; a forced compaction does
        not wait."""
        if self._SyncObj__forceLogCompaction:
            return False
        conf = self._SyncObj__conf
        if len(self._SyncObj__raftLog) <= conf.logCompactionMinEntries and \
                now - self._SyncObj__lastSerializedTime <= conf.logCompactionMinTime:
            self._gesmas_due_since = None      # not due (pysyncobj's own test)
            return False
        me = self._SyncObj__selfNode
        if me is None:
            return False
        rank = 0 if self._isLeader() else self._gesmas_follower_rank(me)
        if self._gesmas_due_since is None:
            self._gesmas_due_since = now
        return now - self._gesmas_due_since < rank * self._gesmas_stagger

    def _gesmas_follower_rank(self, me) -> int:
        """Override 25: this follower's place after the leader (1, 2...) among the members'
        sorted ids; without a known leader, its place among all of them (0, 1, 2...)."""
        leader = self._SyncObj__raftLeader
        ids = sorted(n.id for n in self._SyncObj__otherNodes | {me}
                     if leader is None or n.id != leader.id)
        return ids.index(me.id) + (leader is not None)

    def _gesmas_keeps_log_for_a_follower(self) -> bool:
        """Override 18 (catchup.py): whether the leader skips a compaction for a follower
        that is catching up."""
        return self._gesmas_catch_up.keeps_log(
            leader=self._isLeader(), forced=self._SyncObj__forceLogCompaction,
            log_entries=len(self._SyncObj__raftLog), every=self.conf.logCompactionMinEntries,
            applied=self.raftLastApplied, others=self._SyncObj__otherNodes,
            connected=self._SyncObj__connectedNodes, confirmed=self._SyncObj__raftMatchIndex,
            next_index=self._SyncObj__raftNextIndex, heard=self._SyncObj__lastResponseTime,
            now=_ps.monotonicTime())

    def _SyncObj__onNodeDisconnected(self, node):
        self._gesmas_catch_up.disconnected(node, _ps.monotonicTime())   # override 18
        self._gesmas_sent.forget(node)                                   # override 19
        super()._SyncObj__onNodeDisconnected(node)

    def _SyncObj__onBecomeLeader(self):
        self._gesmas_sent.sent.clear()      # override 19: what an earlier term sent is void
        super()._SyncObj__onBecomeLeader()

    def _SyncObj__sendAppendEntries(self):
        # override 19 (catchup.SnapshotsSent): note each follower whose snapshot's last chunk
        # goes out now (pysyncobj then moves its next index past the log's first entry)
        next_index, raft_log = self._SyncObj__raftNextIndex, self._SyncObj__raftLog
        first = raft_log[0][1]
        needing = [n for n, i in next_index.items() if i <= first]
        held = self._gesmas_hold_snapshot_sends(needing)
        try:
            super()._SyncObj__sendAppendEntries()
        finally:
            self._SyncObj__connectedNodes.update(held)
        for n in needing:
            if next_index.get(n, 0) > first:   # the snapshot's index: pysyncobj's log[1]
                self._gesmas_sent.went(n, raft_log[1][1], _ps.monotonicTime())

    def _gesmas_hold_snapshot_sends(self, needing: List) -> List:
        """Override 24: while no snapshot can be sent (the serializer's ``sending_paused``:
        one is being written), each connected follower in `needing` is sent one heartbeat
        here and hidden from pysyncobj's sending loop for this call (returned: the caller puts
        them back). pysyncobj's loop asks a paused serializer for a chunk again and again
        until ``appendEntriesPeriod`` has passed: the tick thread held for 50 ms at each
        call, and ~30,000 heartbeats queued for the follower."""
        paused = getattr(self._SyncObj__serializer, "sending_paused", None)
        if not needing or paused is None or not paused():
            return []
        connected = self._SyncObj__connectedNodes
        held = [n for n in needing if n in connected]
        for n in held:     # the message pysyncobj's first round sends (commit index, term)
            self._SyncObj__transport.send(n, {
                "type": "append_entries", "term": self._SyncObj__raftCurrentTerm,
                "commit_index": self._SyncObj__raftCommitIndex, "serialized": None})
            connected.discard(n)
        return held

    def _SyncObj__onMessageReceived(self, node, message):
        if self._gesmas_sent.sent and isinstance(message, dict) and \
                message.get("type") == "next_node_idx":
            message = self._gesmas_sent.answer(node, message, _ps.monotonicTime())  # override 19
        super()._SyncObj__onMessageReceived(node, message)

    def _onTick(self, timeToWait=0.0):
        replica = self._gesmas_replica
        guard = replica.rejoin if replica is not None else None
        journal = self._gesmas_journal
        if guard is not None and not guard.may_stand(journal.term_at(journal.last_index or 0),
                                                     journal.last_index):
            # override 10: a rejoining replica that may lack entries does not stand
            self._SyncObj__raftElectionDeadline = _ps.monotonicTime() + self.conf.raftMaxTimeout
        self._gesmas_prevote.gate(self, _ps.monotonicTime())   # override 14 (prevote.py)
        try:
            super()._onTick(timeToWait)
        finally:
            self._SyncObj__transport.flush()  # acks/votes produced while polling

"""Every place where gesmas changes pysyncobj's behaviour (the numbered overrides of the
package docstring): the durable journal factory, the wire format, the group-commit transport
and the Raft node whose replicated method applies gesmas commands."""
from __future__ import annotations

import logging
import pickle
import threading
from typing import TYPE_CHECKING, Any, Dict, List, Tuple

import pysyncobj.syncobj as _ps
from pysyncobj import SyncObj, SyncObjConf, replicated
from pysyncobj import tcp_connection as _tcp_connection
from pysyncobj.encryptor import SALT as _ENCRYPTOR_SALT
from pysyncobj.journal import Journal
from pysyncobj.transport import TCPTransport

from . import raftwire
from .journal import DurableJournal
from .transport import BATCH, batch, coalesce, filter_append_entries, split_early

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

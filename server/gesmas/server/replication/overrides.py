"""Every place where gesmas changes pysyncobj's behaviour (the numbered overrides of the
package docstring): the durable journal factory, the wire format, the group-commit transport
and the Raft node whose replicated method applies gesmas commands."""
from __future__ import annotations

import errno
import logging
import pickle
import socket
import struct
import threading
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

import pysyncobj.syncobj as _ps
from pysyncobj import SyncObj, SyncObjConf, replicated
from pysyncobj import pickle as _ps_pickle
from pysyncobj import tcp_connection as _tcp_connection
from pysyncobj.encryptor import SALT as _ENCRYPTOR_SALT
from pysyncobj.journal import Journal
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.tcp_connection import CONNECTION_STATE
from pysyncobj.transport import TCPTransport

from . import catchup, prevote, raftwire, reads
from .journal import DurableJournal
from .transport import (BATCH, SEND_AHEAD, _approx_bytes, _size_runs,  # noqa: F401
                        _superseded_dropped, batch, coalesce, filter_append_entries,
                        split_early)

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


# ------------------------------------------ pysyncobj override 7: bounded, authenticated reads
# pysyncobj's TcpConnection appends each recv to a ``bytes`` buffer (quadratic), waits for as
# many bytes as the 4-byte length prefix (struct 'i', so up to 2 GiB, or negative) declares,
# and only then authenticates the frame: one connection that announces 0x7fffffff and streams
# froze a replica's tick thread for minutes before any check, and with no secret it unpickled
# whatever came. The replacements below read into a bytearray, judge the length as soon as
# its 4 bytes are in, buffer at most one cap (plus one recv) before parsing, and refuse any
# frame that is not authenticated before unpickling it.
#
# PREAUTH_FRAME_CAP: until a connection has delivered one frame that decrypted *and* carried
# this connection's random key (pysyncobj's handshake: the reply on an outgoing connection,
# the node address on an incoming one), a frame may not exceed 64 KiB. The handshake frames
# measure 144-215 bytes (AEAD header 41 + tag 16 + a pickled 32-byte key, (key, key) or
# (key, address)); requiring the connection's key, not just a valid tag, keeps a replayed
# handshake frame from unlocking the large cap.
# Large cap (``_frame_cap``): the biggest frame a peer legitimately sends. ``_send_grouped``
# packs a node's messages into frames of ~batch_size_bytes (appendEntriesBatchSizeBytes)
# unless one message alone is bigger; the biggest single messages are an append_entries
# (pysyncobj stops adding entries once they reach batch_size_bytes, so < 2 x batch_size_bytes
# of commands; pickle adds ~40 bytes an entry, at most doubling it for commands of 40 bytes
# or more), a snapshot chunk (snapshot_chunk_bytes) and a forwarded command (<
# max_command_bytes). So a frame stays under ~4 x max(batch_size_bytes, snapshot_chunk_bytes)
# (measured: 1.1 MiB with RaftTuning's 1 MiB defaults, for a follower catching up 40 MiB);
# the cap is 16 x that maximum and at least 64 MiB: a wide margin, and still a bound on what
# a peer can make a replica buffer. A peer that has the secret can do anything anyway (it
# sends pickles): this cap catches bugs; the small one stops strangers.
PREAUTH_FRAME_CAP = 64 * 1024
_MIN_FRAME_CAP = 64 * 1024 * 1024
_frame_cap = _MIN_FRAME_CAP
_LENGTH = struct.Struct("i")    # pysyncobj's prefix: native int
_REFUSAL_LOG_PERIOD = 10.0      # at most one warning per period (one per connection at most)


def _raise_frame_cap(batch_size_bytes: int, snapshot_chunk_bytes: int) -> None:
    """Let this process's replicas read the frames a peer with these settings sends."""
    global _frame_cap
    with _factory_lock:
        _frame_cap = max(_frame_cap, 16 * max(batch_size_bytes, snapshot_chunk_bytes))


class _RefusalLog:
    """One warning per refused connection, at most one per period; the rest are counted."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next = 0.0
        self._suppressed = 0

    def warn(self, conn, reason: str) -> None:
        now = time.monotonic()
        with self._lock:
            if now < self._next:
                self._suppressed += 1
                return
            self._next = now + _REFUSAL_LOG_PERIOD
            suppressed, self._suppressed = self._suppressed, 0
        try:
            peer = "%s:%s" % conn._TcpConnection__socket.getpeername()[:2]
        except (AttributeError, OSError):
            peer = "?"
        log.warning("Raft port: closed the connection with %s: %s%s", peer, reason,
                    f" ({suppressed} more connections refused since the last warning)"
                    if suppressed else "")


_refusals = _RefusalLog()


def _refuse(conn, reason: str) -> None:
    _refusals.warn(conn, reason)
    conn.disconnect()


def _cap(conn) -> int:
    sock = conn._TcpConnection__socket
    return _frame_cap if sock is not None and conn._gesmas_trusted_socket is sock \
        else PREAUTH_FRAME_CAP


def _frame_length(conn, buf: bytearray, cap: int) -> Optional[int]:
    """The length the next frame declares; None (and the connection closed) if out of bounds,
    -1 while fewer than 4 bytes are in."""
    if len(buf) < 4:
        return -1
    (length,) = _LENGTH.unpack_from(buf)
    if not 0 <= length <= cap:
        _refuse(conn, f"frame length {length} outside 0..{cap}"
                + (" (not yet authenticated)" if cap == PREAUTH_FRAME_CAP else ""))
        return None
    return length


def _process_read(self) -> bool:
    """Replaces ``TcpConnection.__processRead``: one recv, appended to a bytearray. Like
    pysyncobj it is called until the socket is drained, except that it stops (returns False)
    once the buffer holds more than a frame of ``cap`` bytes, and that it closes the
    connection as soon as the next frame's length prefix is out of bounds."""
    sock = self._TcpConnection__socket
    try:
        incoming = sock.recv(self._TcpConnection__recvBufferSize)
    except socket.error as e:
        if e.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
            self.disconnect()
        return False
    if not incoming or sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
        self.disconnect()
        return False
    buf = self._TcpConnection__readBuffer
    if not isinstance(buf, bytearray):  # pysyncobj resets it to bytes() on (dis)connect
        buf = self._TcpConnection__readBuffer = bytearray(buf)
    buf += incoming
    cap = _cap(self)
    # the rest waits in the socket; the (level-triggered) poll reports it again after parsing
    return _frame_length(self, buf, cap) is not None and len(buf) <= 4 + cap


def _process_parse_message(self):
    """Replaces ``TcpConnection.__processParseMessage``: the same checks in the same order
    (AEAD tag and timestamp, then unpickle, then the connection's random key), but a frame is
    never unpickled unless it decrypted, and every refusal is logged (rate-limited)."""
    buf = self._TcpConnection__readBuffer
    length = _frame_length(self, buf, _cap(self))
    if length is None or length < 0 or len(buf) - 4 < length:
        return None
    data = bytes(buf[4:4 + length])
    del buf[:4 + length]
    encryptor = self.encryptor
    if encryptor is None:  # Replica always sets a secret; never unpickle an unauthenticated frame
        _refuse(self, "no cluster secret on this connection")
        return None
    try:
        timestamp = encryptor.extract_timestamp(data)  # verifies the whole token
        data = encryptor.decrypt(data)
    except Exception:
        _refuse(self, "frame failed authentication (wrong cluster secret or not a replica)")
        return None
    if timestamp < self.recvLastTimestamp:
        _refuse(self, "replayed frame (timestamp went backwards)")
        return None
    self.recvLastTimestamp = timestamp
    try:
        message = _ps_pickle.loads(_tcp_connection.zlib.decompress(data))
        if self.recvRandKey:
            if not (isinstance(message, tuple) and len(message) == 2):
                raise ValueError("a message without the connection key (sent before the "
                                 "handshake finished?)")
            rand_key, message = message
            if rand_key != self.recvRandKey:
                raise ValueError("wrong connection key")
            self._gesmas_trusted_socket = self._TcpConnection__socket
    except Exception as exc:
        _refuse(self, f"authenticated frame refused ({exc!r:.100})")
        return None
    return message


# ------------------------------------------- pysyncobj override 8: writes that do not wait
_original_send = _tcp_connection.TcpConnection.send
_READ_WRITE = POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.WRITE | POLL_EVENT_TYPE.ERROR


def _send(self, message) -> None:
    """Replaces ``TcpConnection.send``: what the kernel did not take at once goes out as soon
    as the socket is writable. pysyncobj asks the poller for WRITE only from a WRITE event, so
    a frame bigger than the socket buffer went out one buffer per later ``send`` (~one per
    heartbeat, ~2.5 MB/s): a 3 MiB command held the heartbeats behind it past the election
    timeout, and 20 MiB of commands left a cluster electing forever."""
    _original_send(self, message)
    fileno = self._TcpConnection__fileno
    if self._TcpConnection__writeBuffer and fileno is not None \
            and self.state != CONNECTION_STATE.DISCONNECTED:
        self._TcpConnection__poller.subscribe(fileno, self._TcpConnection__processConnection,
                                              _READ_WRITE)


# ------------------------------------- pysyncobj override 9: strangers may not linger or pile up
# An incoming connection stays in TCPTransport._unknownConnections until its first frame names
# a node; pysyncobj checks a connection's timeout only when it has activity, so connections
# that never send (or trickle a byte now and then) held a file descriptor each, for ever.
HANDSHAKE_TIMEOUT = 5.0          # seconds an incoming connection has to authenticate
MAX_UNKNOWN = 256                # incoming connections not yet authenticated, at most
_original_new_incoming = TCPTransport._onNewIncomingConnection


def _on_new_incoming(self, conn) -> None:
    conn._gesmas_accepted = time.monotonic()
    _original_new_incoming(self, conn)
    if len(self._unknownConnections) > MAX_UNKNOWN:
        oldest = min(self._unknownConnections, key=lambda c: c._gesmas_accepted)
        _refuse(oldest, f"more than {MAX_UNKNOWN} connections waiting to authenticate")


def close_stale_handshakes(transport: Any, now: float) -> None:
    """Close the incoming connections that have not authenticated within HANDSHAKE_TIMEOUT
    (called on the tick thread, every tick)."""
    unknown = getattr(transport, "_unknownConnections", None)
    if not unknown:
        return
    for conn in [c for c in unknown
                 if now - getattr(c, "_gesmas_accepted", now) > HANDSHAKE_TIMEOUT]:
        _refuse(conn, f"no authenticated handshake within {HANDSHAKE_TIMEOUT:g} s")


def _install_tcp_overrides() -> None:
    """Overrides 7, 8 and 9; called by ``_install_wire`` (under its lock)."""
    cls = _tcp_connection.TcpConnection
    cls._gesmas_trusted_socket = None  # the socket whose peer has proved the connection key
    cls._TcpConnection__processRead = _process_read
    cls._TcpConnection__processParseMessage = _process_parse_message
    cls.send = _send
    TCPTransport._onNewIncomingConnection = _on_new_incoming


class _DurableTransport(TCPTransport):
    """TCPTransport that never lets a Raft message out before the journal is durable.

    Replaces ``TCPTransport.send`` for the Raft messages pysyncobj sends (append_entries,
    next_node_idx acks, votes, forwarded commands): a message is queued; ``flush()`` sends the
    leading ``_early`` messages of each node, syncs the journal once, and sends the rest, each
    node's messages coalesced and batched into frames of about appendEntriesBatchSizeBytes
    (``_size_runs``). pysyncobj acknowledges entries (next_node_idx) right after
    ``journal.add`` in ``__onMessageReceived``, and the leader counts its own log as matched
    in ``_onTick``: holding the ack, and the append_entries that lead to any follower
    ack, until ``sync()`` is what makes an acknowledged entry durable. ``flush`` runs at the
    end of each loop iteration before the poll (tick callback) and right after the poll
    (``_RaftNode._onTick``), so each batch of received or proposed entries costs one fsync.
    A flush hands a node's connection at most SEND_AHEAD frames' worth of bytes beyond what
    it has not written yet; the rest waits in that node's backlog (``_backlog``), in order,
    for the next flushes (override 17). pysyncobj queues a catching-up follower's whole
    snapshot or log tail in one tick, and framing it (pickle, zlib, encryption, and
    TcpConnection's buffer, which is copied at each append) held the tick thread, and every
    other follower's append_entries with it, for 0.4-0.5 s at 10^6 objects (a 105 MB
    snapshot), so a produce waited that long. A backlog has passed its sync (it is what a
    flush could not send after it), and it is dropped if the node's connection is no longer
    the socket it was queued for: frames of a snapshot transmission cut by a reconnection
    must not reach the new connection (pysyncobj starts that transmission over). Its
    append_entries are dropped too when the leader queues the same entries again after an
    ack (``_superseded_dropped``): a follower catching up 12 MB of entries had 90 MB waiting
    for it without that, 11 MB with it.
    """

    def __init__(self, syncObj, selfNode, otherNodes):
        self._journal: DurableJournal = syncObj._gesmas_journal
        self._outbox: List[Tuple[Any, Any]] = []
        # node -> (the socket its messages were queued for, messages past their sync)
        self._backlog: Dict[Any, Tuple[Any, List[Any]]] = {}
        super().__init__(syncObj, selfNode, otherNodes)
        syncObj.addOnTickCallback(self.flush)

    def send(self, node, message):
        # Everything waits for flush(), which runs before every poll and right after it:
        # held messages wait for the sync, and each flush sends one message per node.
        self._outbox.append((node, message))
        return True

    def flush(self) -> None:
        held_early: List[Tuple[Any, Any]] = []
        if self._outbox and self._journal.dirty:
            # Messages that state nothing about this node's log go out before the fsync, so
            # that followers write their copy while this node writes its own (Raft thesis
            # §10.2.1). See _early() for why this keeps "majority durable before commit".
            early, self._outbox = split_early(self._outbox)
            held_early = self._send_grouped(early)
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
        held = self._send_grouped(outbox)
        if held_early or held:
            self._outbox[:0] = held_early + held   # in their order, before anything newer

    def _handshaking(self, node) -> bool:
        """Override 16. Is the connection to `node` up but its key exchange not finished? An outgoing
        connection is CONNECTED (and TCPTransport.send would write to it) as soon as TCP
        connects, while pysyncobj's handshake still waits for the peer's random key: a message
        written then goes out without that key, and the peer, which expects (key, message)
        from its first reply on, closes the connection ("authenticated frame refused
        (ValueError('too many values to unpack'))", seen during a rolling restart)."""
        conn = self._connections.get(node)
        return (conn is not None and self._syncObj.encryptor is not None
                and conn.state == CONNECTION_STATE.CONNECTED and not conn.sendRandKey)

    def _send_grouped(self, items: List[Tuple[Any, Any]]) -> List[Tuple[Any, Any]]:
        """Send `items` grouped per node; returns those held back for a node whose handshake
        is not finished (sent by a later flush, or dropped as for any node that is not
        connected if the connection fails)."""
        held: List[Tuple[Any, Any]] = []
        if not items and not self._backlog:
            return held
        per_node: Dict[Any, List[Any]] = {node: [] for node in self._backlog}
        for node, message in items:
            per_node.setdefault(node, []).append(message)
        limit = self._syncObj.conf.appendEntriesBatchSizeBytes
        for node, messages in per_node.items():
            sock, waiting = self._backlog.pop(node, (None, []))
            conn = self._connections.get(node)
            now_sock = conn._TcpConnection__socket if conn is not None else None
            if waiting and sock is now_sock:
                messages = _superseded_dropped(waiting, messages) + messages   # older first
            if not messages:
                continue
            if self._handshaking(node):
                # what a send would check: a peer silent for connectionTimeout (one that
                # accepted the connection but never answers the handshake, a stopped process)
                # is disconnected, and its messages are dropped like any disconnected node's
                self._connections[node]._TcpConnection__processConnectionTimeout()
                if self._handshaking(node):
                    held.extend((node, m) for m in messages)
                    continue
            room = SEND_AHEAD * limit - (conn.getSendBufferSize() if conn is not None else 0)
            runs = list(_size_runs(coalesce(messages, limit), limit))
            for k, run in enumerate(runs):
                if room <= 0 and now_sock is not None:
                    self._backlog[node] = (now_sock, [m for r in runs[k:] for m in r])
                    break
                for message in batch(run):
                    super().send(node, message)
                room -= sum(map(_approx_bytes, run))
        return held

    def backlog_bytes(self) -> int:
        """About how many bytes wait in the nodes' backlogs (tests, metrics)."""
        return sum(_approx_bytes(m) for _, ms in self._backlog.values() for m in ms)

    def _onMessageReceived(self, node, message):
        if isinstance(message, dict) and message.get("type") == BATCH:
            for part in message["messages"]:
                self._onMessageReceived(node, part)
            return
        replica = self._syncObj._gesmas_replica
        if isinstance(message, dict) and message.get("type") in reads.MESSAGE_TYPES:
            if replica is not None:      # override 12: ReadIndex messages (reads.py)
                replica.read_index.on_message(self._syncObj, self, node, message)
            return
        if isinstance(message, dict) and message.get("type") in prevote.MESSAGE_TYPES:
            # override 14: pre-vote (prevote.py)
            self._syncObj._gesmas_prevote.on_message(self._syncObj, self, node, message)
            return
        guard = replica.rejoin if replica is not None else None
        if isinstance(message, dict) and message.get("type") == "append_entries":
            if guard is not None:
                guard.heard(message)
            message = filter_append_entries(self._journal, message)
            if message is None:
                return
        elif guard is not None and isinstance(message, dict) and \
                message.get("type") == "request_vote" and guard.refuses(message):
            return  # override 10: a rejoining replica gives no vote to a candidate with a history
        super()._onMessageReceived(node, message)


class _RaftNode(SyncObj):
    """The SyncObj: one replicated method, plus a flush after each poll."""

    def __init__(self, replica: "Replica", self_addr: str, peers: List[str],
                 conf: SyncObjConf, journal: DurableJournal):
        self._gesmas_replica = replica
        self._gesmas_journal = journal
        self._gesmas_prevote = prevote.PreVote()
        self._gesmas_catch_up = catchup.CatchUp(conf.appendEntriesPeriod)
        if replica is not None:  # its tick thread may apply entries before __init__ returns
            replica._raft = self
        _install_wire()
        _raise_frame_cap(conf.appendEntriesBatchSizeBytes, conf.logCompactionBatchSize)
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
        super()._SyncObj__tryLogCompaction()

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
        super()._SyncObj__onNodeDisconnected(node)

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

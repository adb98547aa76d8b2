"""The group-commit transport between replicas (``_DurableTransport``: overrides 16, 17, 20,
22 and 23 of the package docstring, and where 10, 12 and 14 see their messages), which
overrides.py's Raft node uses as its pysyncobj transport."""
from __future__ import annotations

import logging
from typing import Any, Dict, List, Tuple

import pysyncobj.syncobj as _ps
from pysyncobj.tcp_connection import CONNECTION_STATE
from pysyncobj.transport import TCPTransport

from . import catchup, prevote, reads
from .journal import DurableJournal
from .transport import (BATCH, SEND_AHEAD, _approx_bytes, _early, _size_runs,
                        _superseded_dropped, batch, chunk_bytes, coalesce,
                        filter_append_entries, materialized)

log = logging.getLogger(__name__)

#: override 22: a follower whose acks wait for its disk tells its leader it is alive
ALIVE = "gesmas_alive"
ALIVE_EVERY = 0.25   # seconds; a sync takes milliseconds, so only a stalled disk sends it
#: override 20: how long a flush waits for the journal's sync before it goes on without it
SYNC_WAIT = 0.01


class _DurableTransport(TCPTransport):
    """TCPTransport that never lets a Raft message out before what it claims is durable.

    Replaces ``TCPTransport.send`` for the Raft messages pysyncobj sends (append_entries,
    next_node_idx acks, votes, forwarded commands): a message is queued; ``flush()`` hands the
    journal's new records to its syncer (``start_sync``, which returns at once), sends what may
    go, and keeps the rest waiting, tagged with the hand-over whose end makes them true, until
    a later flush finds it durable; each node's messages are coalesced and batched into frames
    of about appendEntriesBatchSizeBytes (``_size_runs``). What may go: each node's leading
    ``_early`` messages (a leader's append_entries, forwarded commands) and everything once
    the journal holds nothing that is not durable. pysyncobj acknowledges entries
    (next_node_idx) right after ``journal.add`` in ``__onMessageReceived``: holding the ack
    until its sync is what makes an acknowledged entry durable; the leader's own count is
    capped by ``DurableMatch``. The syncer wakes the tick thread's poll when a sync ends
    (``journal.on_durable``), so a waiting ack leaves within one loop iteration. ``flush``
    runs at the end of each loop iteration before the poll (tick callback) and right after
    the poll (``_RaftNode._onTick``). A node alone (no other voters) syncs on the tick thread
    as before: its own copy is the majority. The tick thread never waits for the disk
    otherwise, so heartbeats and votes go on while a disk stalls (override 20).
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
        # (the journal's written_seq that makes it true, node, message), in queued order
        self._waiting: List[Tuple[int, Any, Any]] = []
        self._alive_sent = 0.0        # when this node last told its leader it is alive
        # node -> (the socket its messages were queued for, messages past their sync)
        self._backlog: Dict[Any, Tuple[Any, List[Any]]] = {}
        self.pacer = catchup.SnapshotPacer(catchup.snapshot_rate_from_env())  # override 23
        super().__init__(syncObj, selfNode, otherNodes)
        syncObj.addOnTickCallback(self.flush)

    def send(self, node, message):
        # Everything waits for flush(), which runs before every poll and right after it:
        # held messages wait for the sync, and each flush sends one message per node.
        self._outbox.append((node, message))
        return True

    def flush(self) -> None:
        journal = self._journal
        if not self._syncObj._SyncObj__otherNodes:
            self._flush_alone()
            return
        try:
            need = journal.start_sync()
            self._send_ready(need)            # the early ones, and what is durable already
            if need > journal.durable_seq:
                # A sync takes ~0.2-2 ms: waiting for it here, as long as it is quick, sends
                # what it covers (and lets the leader count its own copy) within this flush,
                # as when the tick thread synced itself; a slow disk is waited for at most
                # SYNC_WAIT, then the tick goes on and the syncer wakes it when done.
                journal.wait_synced(SYNC_WAIT)
                if self._waiting:
                    self._send_ready(need)
        except OSError as exc:
            self._failed(exc)
            raise
        if self._waiting:
            self._send_grouped(self._alive(self._waiting))

    def _send_ready(self, need: int) -> None:
        """Send the waiting messages the journal's durable state now covers, then those of
        the outbox that may go (``_early``, or all if `need`, what makes them true, is
        durable); the rest wait, tagged with `need`, in their order."""
        journal, waiting = self._journal, self._waiting
        # everything holds once nothing is left that is not durable (a truncation may have
        # dropped the records a waiting message was tagged for)
        durable = journal.durable_seq if journal.dirty else need
        ready = 0
        while ready < len(waiting) and waiting[ready][0] <= durable:
            ready += 1
        out = [(node, message) for _, node, message in waiting[:ready]]
        del waiting[:ready]
        if self._outbox:
            blocked = {node for _, node, _ in waiting}   # nothing overtakes a waiting message
            for node, message in self._outbox:
                if node not in blocked and (need <= durable or _early(message)):
                    out.append((node, message))
                else:
                    blocked.add(node)
                    waiting.append((need, node, message))
            self._outbox = []
        held = self._send_grouped(out)
        if held:
            self._outbox[:0] = held          # in their order, before anything newer

    def _alive(self, waiting: List[Tuple[int, Any, Any]]) -> List[Tuple[Any, Any]]:
        """Override 22: while this follower's acks wait for a slow disk, tell its leader every
        ALIVE_EVERY seconds that it is alive in the leader's term (``gesmas_alive``, which
        claims nothing about the log). pysyncobj's leader steps down when no majority has
        answered it for leader_fallback_timeout (1.5 s): without this, a disk that stalls
        for that long on the followers deposed a leader whose network was fine."""
        raft = self._syncObj
        leader = raft._SyncObj__raftLeader
        now = _ps.monotonicTime()
        if leader is None or leader is raft._SyncObj__selfNode or \
                now - self._alive_sent < ALIVE_EVERY or \
                not any(node == leader for _, node, _ in waiting):
            return []
        self._alive_sent = now
        return [(leader, {"type": ALIVE, "term": raft._SyncObj__raftCurrentTerm})]

    def _flush_alone(self) -> None:
        """A node with no other voters: sync on this thread, then send (what a cluster of one
        sends: answers to read-only nodes or to joining ones)."""
        try:
            self._journal.sync()
        except OSError as exc:
            self._failed(exc)
            raise
        waiting = [(node, message) for _, node, message in self._waiting]
        self._waiting.clear()
        outbox, self._outbox = waiting + self._outbox, []
        held = self._send_grouped(outbox)
        if held:
            self._outbox[:0] = held

    def _failed(self, exc: OSError) -> None:
        # After a failed fsync the kernel may have dropped the dirty pages, so a retry can
        # "succeed" without the data: nothing held may go out; this replica stops.
        self._outbox = []
        self._waiting.clear()
        replica = self._syncObj._gesmas_replica
        if replica is not None:
            replica._fail(exc, "journal write/fsync failed")

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
        pacer, now = self.pacer, _ps.monotonicTime()
        for node, messages in per_node.items():
            sock, waiting = self._backlog.pop(node, (None, []))
            conn = self._connections.get(node)
            now_sock = conn._TcpConnection__socket if conn is not None else None
            if waiting and sock is now_sock:
                messages = _superseded_dropped(waiting, messages) + messages   # older first
            elif waiting:        # a snapshot's chunks among them never arrive (override 19)
                self._syncObj._gesmas_sent.forget(node)
                pacer.forget(node)
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
                if now_sock is not None and (   # override 23: a snapshot's chunks paced
                        room <= 0 or not pacer.may_send(node, chunk_bytes(run), now)):
                    self._backlog[node] = (now_sock, [m for r in runs[k:] for m in r])
                    break
                try:
                    run = [materialized(m) for m in run]   # a snapshot's chunks, read now
                except OSError:
                    self._unreadable(node, conn)
                    break
                for message in batch(run):
                    super().send(node, message)
                room -= sum(map(_approx_bytes, run))
        return held

    def _unreadable(self, node: Any, conn: Any) -> None:
        """A snapshot chunk for `node` could not be read from its file: nothing more goes
        to it on this connection, which is closed (pysyncobj starts the transfer over once
        it is back, from the snapshot then in place)."""
        log.exception("a snapshot chunk for %s could not be read: its connection is closed "
                      "and the transfer will start over", node)
        self._backlog.pop(node, None)
        if conn is not None:
            conn.disconnect()

    def backlog_bytes(self) -> int:
        """About how many bytes wait in the nodes' backlogs (tests, metrics)."""
        return sum(_approx_bytes(m) for _, ms in self._backlog.values() for m in ms)

    def _onMessageReceived(self, node, message):
        if isinstance(message, dict) and message.get("type") == BATCH:
            for part in message["messages"]:
                self._onMessageReceived(node, part)
            return
        replica = self._syncObj._gesmas_replica
        if isinstance(message, dict) and message.get("type") == ALIVE:
            raft = self._syncObj           # override 22: a follower whose disk is slow
            if raft._isLeader() and message.get("term") == raft._SyncObj__raftCurrentTerm \
                    and node in raft._SyncObj__lastResponseTime:
                raft._SyncObj__lastResponseTime[node] = _ps.monotonicTime()
            return
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

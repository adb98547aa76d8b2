"""Replication: the one module that owns pysyncobj (Raft log, durable journal, snapshots).

Theory of operation
-------------------
``Replica`` wraps a pysyncobj ``SyncObj`` (``_RaftNode``) and drives a deterministic state
machine ``sm`` (the kernel) on an apply thread of its own, fed by pysyncobj's tick thread
(override 15):

* ``propose(data)`` enqueues the bytes as one replicated call of ``_RaftNode._gesmas_apply``;
  a follower forwards it to the leader (pysyncobj does this by itself). When the entry is
  committed every replica calls ``sm.apply(index, data)`` with the same Raft index (the entry
  being applied is always ``raftLastApplied + 1``: pysyncobj increments it after each entry)
  and this node passes the completions to ``on_completions``.
* Snapshots. pysyncobj's custom ``serializer``/``deserializer`` hooks write (on a thread of
  their own, override 13) and read a file
  holding the state machine's last checkpoint (blob, index K) and the commands applied after K
  (DESIGN §5). Loading one = ``restore(blob)`` and re-applying those commands with completions
  suppressed. The state machine object is never pickled: with a custom serializer pysyncobj
  passes ``data=None`` for its own fields.
* Durability (DESIGN §7). pysyncobj internals are touched only here, each override small
  and explained where it is:
  1. ``DurableJournal`` (journal.py) replaces ``FileJournal``, plugged in through
     ``_install_journal_factory``; it fsyncs in groups and stores term/vote durably.
  2. ``_DurableTransport.send``/``flush`` queue every outgoing Raft message; ``flush`` hands
     the journal's new records to its syncer and releases each message once what it claims
     is on disk: a follower acks, and votes go out, only then. A leader's append_entries (and
     forwarded commands) leave at once, so followers write in parallel (``_early``).
  3. ``_DurableTransport._onMessageReceived`` + ``filter_append_entries``: a follower
     truncates its log only on a real conflict.
  4. ``Replica._align_journal``: at start-up pysyncobj would discard the journal after a crash
     between writing a snapshot and compacting the log.
  5. ``_RaftNode._gesmas_submit`` encodes commands with pickle protocol 4, not 2.
  6. ``_install_wire``: ChaCha20-Poly1305 instead of Fernet and no zlib for small messages
     (raftwire.py); ``flush`` sends what it has for a node as one ``gesmas_batch``, cut into
     frames of about ``batch_size_bytes`` (``_size_runs``).
  7. ``_install_tcp_overrides`` (tcpconn.py, as are 8 and 9): reads go into a bytearray; a frame's length prefix is checked
     before its body is buffered (64 KiB until the peer has proved the connection's key, then
     at least 64 MiB); a frame that does not decrypt is never unpickled; a replica always
     needs the cluster secret, loopback too.
  8. ``TcpConnection.send`` asks for a write event while output is pending, so a frame bigger
     than the socket buffer does not wait for later sends.
  9. ``close_stale_handshakes`` (every tick): an incoming connection that has not
     authenticated within 5 s is closed, and at most 256 wait at a time.
  10. ``RejoinGuard`` (rejoin.py): a replica that starts with an empty data dir without
     ``new_cluster`` ignores vote requests from candidates with a log and does not stand for
     election until it has caught up (``_DurableTransport._onMessageReceived``,
     ``_RaftNode._onTick``, ``Replica._on_tick``).
  11. ``_RaftNode._SyncObj__tryLogCompaction``: no snapshot is taken while entries are held
     back behind one that ran away (applier.py): the state machine has not applied them.
  12. ``_DurableTransport._onMessageReceived`` hands gesmas' ReadIndex messages (probe, ack,
     ask, grant) to ``reads.ReadIndex`` before pysyncobj sees them; ``Replica._on_tick``
     starts the rounds and runs the reads whose index is applied (reads.py: reads without a
     log entry, serialized with the applying of entries by ``AppliedReads.lock``).
  13. ``BackgroundSerializer`` (snapshots.py) replaces pysyncobj's ``Serializer``: the tick
     thread only gathers a snapshot's parts; a thread of its own writes and fsyncs the file,
     so heartbeats and votes go on meanwhile. A snapshot received meanwhile wins.
  14. ``PreVote`` (prevote.py), from ``_RaftNode._onTick`` and
     ``_DurableTransport._onMessageReceived``: a replica whose election timeout passed
     stands only once a majority says it would vote for it and hears no leader (Raft §9.6),
     so a follower restarted or cut off from a healthy leader does not depose it.
  15. ``Replica._apply_committed`` only queues a committed entry; the apply thread applies
     it (``apply_thread.ApplyThread``), so no entry, checkpoint or snapshot load holds up heartbeats and
     votes. A snapshot is loaded on the apply thread too (greenlets belong to their thread),
     and entries queued before it are dropped; no snapshot is taken while the apply thread
     is behind. Background work (a checkpoint's capture) runs in slices between entries,
     paced to a share of a core (``GESMAS_CAPTURE_SHARE``).
  16. ``_DurableTransport._send_grouped`` holds a node's messages while the outgoing
     connection to it is up but pysyncobj's key exchange is not finished (``_handshaking``):
     pysyncobj would write them without the connection key, and the peer would close the
     connection.
  17. ``_DurableTransport._send_grouped`` hands a connection at most ``SEND_AHEAD`` frames
     beyond what it has not yet written; the rest waits in the node's backlog for the next
     flushes, and is dropped if the node reconnects (its append_entries also when the
     leader queues the same entries again after an ack: ``_superseded_dropped``). pysyncobj queues a catching-up
     follower's whole snapshot or log tail in one tick, and framing all of it at once held
     the tick thread (and the other follower's appends) for ~0.5 s at 10^6 objects.
  18. ``_RaftNode._gesmas_keeps_log_for_a_follower`` (catchup.py): the leader does not
     compact its log past a follower that is catching up: a connected one more than a tenth
     of the compaction interval behind, or one silent for five heartbeats or disconnected
     less than two minutes ago and behind at all (its place: the lower of its confirmed
     index and the one before its next index), up to ten intervals of log. A compaction past a follower that is loading a
     snapshot, or restarting, made it need the leader's whole snapshot again. This gate
     and the others of ``_SyncObj__tryLogCompaction`` only keep a snapshot from starting:
     one already written is finished first, since until pysyncobj reads its end no
     follower can be sent any snapshot.
  19. ``_RaftNode._SyncObj__sendAppendEntries`` and ``_SyncObj__onMessageReceived``
     (``catchup.SnapshotsSent``): from a snapshot's last chunk until the follower answers
     past the snapshot's index, its answers that ask for an index at or before it were
     written before it arrived; the leader notes it heard them and does not start the
     snapshot over (forgotten on a disconnection, a reconnection, a new term as leader,
     or after a minute).
  20. The journal syncs on a thread of its own (journal.py's syncer), never on the tick
     thread, which the syncer wakes when a sync ends (``journal.on_durable``): a disk that
     stalls holds back acks and commits, not heartbeats or votes, so it causes no election.
     The compaction's files (new file, fsyncs, rename) are the syncer's job too.
  21. ``DurableMatch`` (transport.py) replaces the leader's match indexes: pysyncobj counts
     the leader's own copy of an entry towards its commit, and with override 20 that copy may
     not be durable yet; the count reads the followers' indexes capped at what the leader has
     made durable (or what a majority of followers alone acknowledged).
  22. ``_DurableTransport._alive``: a follower whose acks wait for its disk sends its leader a
     ``gesmas_alive`` (its term, no claim on the log) every 0.25 s, which the leader counts as
     an answer in that term: a disk stall longer than leader_fallback_timeout no longer
     deposes a reachable leader. A gesmas without it ignores the message.
  23. ``catchup.SnapshotPacer`` (``_DurableTransport._send_grouped``): a leader sends a
     follower its snapshot's chunks at ``GESMAS_SNAPSHOT_RATE`` megabytes per second at
     most (default 40; 0 for unpaced), so a transfer to a wiped follower does not take the
     host's cores from the calls for its duration; the chunks wait in the backlog (17).
  24. ``_RaftNode._gesmas_hold_snapshot_sends``: while the leader writes a snapshot (its
     serializer gives no chunk), a follower that needs one gets one heartbeat per round
     instead of pysyncobj asking for a chunk in a loop for a heartbeat period (50 ms of the
     tick thread, ~30,000 messages queued, at each round).
  25. ``_RaftNode._gesmas_staggered``: replicas take their snapshots
     ``GESMAS_SNAPSHOT_STAGGER`` seconds apart (2 by default), by rank of their ids, instead of all at once when they become due together
     (the end of a snapshot rewrites the journal and fsyncs; replicas sharing a disk held
     each other's commits then).

The runaway defence: a watchdog process kills the replica when one entry burns too much CPU
(watchdog.py); restarted, the replica holds that entry back and the cluster aborts it
(applier.py).

Measurements of this layer are in docs/performance.md ("Replication alone").
"""
from .durable_transport import _DurableTransport  # noqa: F401
from .overrides import _install_journal_factory, _RaftNode  # noqa: F401
from .replica import SNAPSHOT_NAME, Replica
from .transport import batch, coalesce, filter_append_entries, split_early
from .types import (NotLeader, Overloaded, ProposeFailure, RaftTuning, ReplicaStopped,
                    ReplicationError)

__all__ = ["NotLeader", "Overloaded", "ProposeFailure", "RaftTuning", "Replica", "ReplicaStopped",
           "ReplicationError", "SNAPSHOT_NAME", "batch", "coalesce", "filter_append_entries",
           "split_early"]

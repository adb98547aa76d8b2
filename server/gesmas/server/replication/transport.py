"""Pure functions over Raft messages: conflict-only truncation of append_entries, coalescing
and batching of outgoing messages, which ones may leave before the journal is synced, and
how much of a node's backlog one flush sends.
No I/O: `durable_transport.py` calls them and the tests check them directly."""
from __future__ import annotations

import itertools
import logging
from typing import Any, Iterable, Iterator, List, Optional, Tuple


from .journal import DurableJournal
from .snapshots import Chunk
from .reads import MESSAGE_TYPES as READ_MESSAGES

log = logging.getLogger(__name__)


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
    """May this message leave before the journal's pending records are durable?

    Yes for a leader's append_entries and for a command forwarded to the leader: they ask the
    receiver to store entries or propose a command and claim nothing about this node's log
    (Raft thesis §10.2.1: followers write their copy while the leader writes its own). A
    leader counts its own log towards a commit without an ack (pysyncobj's ``_onTick`` starts
    the count at 1); ``DurableMatch`` keeps that count honest, so an entry is still committed
    only once a majority has it on disk. Acks (next_node_idx) and votes wait for the sync
    that covers them: they claim durable state.
    """
    return isinstance(message, dict) and (message.get("type") == "apply_command"
                                           or _plain_ae(message))


class DurableMatch(dict):
    """The leader's match indexes (follower -> highest index it acknowledged) as pysyncobj's
    commit count reads them (override 21).

    pysyncobj commits index i when 1 (the leader itself) plus the followers whose match index
    is >= i make a majority. With the journal synced off the tick thread (journal.py) the
    leader's own copy of i may not be durable yet, so a read returns the follower's value
    capped at what may be committed: the leader's durable index, or past it an index that a
    majority of the followers alone acknowledged. Acks are stored as they come; only reads
    are capped, and only while the leader's last entries are not durable (otherwise the cap
    is above every value). ``get`` and iteration (status, leadership transfer) see the raw
    values.
    """

    def __init__(self, raft: Any, journal: Any) -> None:
        super().__init__()
        self._raft, self._journal = raft, journal

    def __getitem__(self, node: Any) -> int:
        value = dict.__getitem__(self, node)
        if self._journal is None:        # a node built without a journal (unit tests)
            return value
        durable = self._journal.durable_index
        if value <= durable:
            return value
        others = self._raft._SyncObj__otherNodes
        majority = (len(others) + 1) // 2 + 1
        acked = sorted((dict.get(self, n, 0) for n in others), reverse=True)
        alone = acked[majority - 1] if len(acked) >= majority else 0
        return min(value, max(durable, alone))


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


# ------------------------------------ what one flush sends a node (overrides 6 and 17)
def _chunk_len(message: dict) -> int:
    """The bytes of the snapshot chunk a Raft message carries (pysyncobj's append_entries
    with ``serialized``: (data, is_first, is_last)), 0 for any other."""
    part = message.get("serialized")
    return len(part[0] or b"") if part else 0


def materialized(message: Any) -> Any:
    """`message` as it goes on the wire: a snapshot chunk's data (``snapshots.Chunk``, read
    when sent) read from its file. OSError if it cannot be read."""
    part = message.get("serialized") if isinstance(message, dict) else None
    if not part or not isinstance(part[0], Chunk):
        return message
    return dict(message, serialized=(part[0].read(), *part[1:]))


def chunk_bytes(messages: Iterable[Any]) -> int:
    """The bytes of snapshot chunks among `messages` (override 23 paces them)."""
    return sum(_chunk_len(m) for m in messages if isinstance(m, dict))


def _approx_bytes(message: Any) -> int:
    """About what a Raft message costs pickled: its payload bytes plus an allowance."""
    if not isinstance(message, dict):
        return 64
    size = 64 + sum(len(e[0]) + 48 for e in message.get("entries") or ())
    for key in ("command", "data"):  # apply_command; a 'transmission' chunk of a big entry
        if isinstance(message.get(key), bytes):
            size += len(message[key])
    return size + _chunk_len(message)


#: Frames of appendEntriesBatchSizeBytes one flush may hand a connection beyond what it has
#: not written yet (override 17, ``_DurableTransport``): 2 MiB with the default tuning, ~10 ms
#: of framing on the tick thread.
SEND_AHEAD = 2


def _size_runs(messages: List[Any], limit: int) -> Iterator[List[Any]]:
    """Consecutive runs of ~``limit`` bytes at most (or one bigger message): each becomes at
    most one frame, so a catching-up follower gets many bounded frames, not one huge one
    (``__sendAppendEntries`` queues a whole log tail, or snapshot, per tick; override 7)."""
    run: List[Any] = []
    size = 0
    for message in messages:
        n = _approx_bytes(message)
        if run and size + n > limit:
            yield run
            run, size = [], 0
        run.append(message)
        size += n
    if run:
        yield run


def _superseded_dropped(waiting: List[Any], newer: List[Any]) -> List[Any]:
    """A node's backlog without the append_entries that newer ones send again: pysyncobj
    moves a follower's nextIndex back to each ack, so while a backlog waits the leader
    queues the same entries again from the follower's last ack. The entries of the waiting
    append_entries are then on the follower (up to that ack) or in the newer ones (after
    it), so those messages are dropped (as a lossy network may); anything else (a snapshot
    chunk: its transmission has no sequence numbers) is kept, in order."""
    first = next((m for m in newer if _plain_ae(m)), None)
    tails = [_ae_tail(m)[0] for m in waiting if _plain_ae(m)]
    if first is None or not tails or first["prevLogIdx"] >= max(tails):
        return waiting
    return [m for m in waiting if not _plain_ae(m)]

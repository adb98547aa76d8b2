"""Reads without a log entry: etcd's ReadIndex over pysyncobj (``ReadIndex``), and reads run
against the applied state, serialized with the applying of entries (``AppliedReads``).

Theory of operation
-------------------
A linearizable read must reflect every write acknowledged before it arrived. A leader knows
every such write is at or below its commit index once it has committed an entry of its own
term; what it does not know, alone, is whether it is still the leader: a newer one may have
been elected and acknowledged writes while this one was paused or cut off. So (Raft thesis
§6.4, etcd's ReadIndex):

1. the leader notes its commit index C when it starts a *round*, on the tick thread, after
   the reads of that round arrived;
2. it sends every other replica a probe ``{type: PROBE, term: T, round: r}``; a replica
   answers ``{type: ACK, round: r, term: its current term}`` once it has processed every
   message before the probe (TCP keeps each link in order);
3. once a majority (itself included) has acknowledged round r or a later one *in term T*,
   no leader of a newer term existed when those replicas answered (each of them would have
   moved past T to vote for it), so the leader was still the leader after the reads arrived:
   they may be answered from any state that has applied C. An ACK naming a newer term ends
   every round at once: this replica is no longer the leader.

All the reads waiting when a round starts share it; a round starts on each tick that finds
new reads, so rounds overlap under load (an ACK of round r confirms every round <= r from
that replica). This is a round started after the reads arrived, never a lease: a paused
leader that resumes cannot answer from memory of acknowledgements received before its pause.

A follower serves a linearizable read by asking its leader over the Raft transport
(``{type: ASK, id}``); the leader adds the request to its next round and answers ``{type:
GRANT, id, index: C}`` (or ``error``); the follower then waits until it has applied C. The
request reached the leader after the read arrived at the follower, so the same argument holds.
A follower that knows no leader, a leader whose round fails or times out, and a follower whose
ASK goes unanswered refuse the read (the gateway says UNAVAILABLE; the client retries
elsewhere). Nothing stale is ever answered: a read waits or fails.

These four message types are gesmas' own; ``_DurableTransport._onMessageReceived`` hands them
here before pysyncobj sees them (an older replica's pysyncobj ignores unknown types, so a
mixed cluster only fails linearizable reads during a rolling upgrade).

``AppliedReads`` runs ``fn(state_machine)`` once the replica has applied a given index. The
apply thread holds ``lock`` while it applies one entry (or loads a snapshot); a read takes
the same lock, so it sees the state between two entries. A read that finds the lock free and
the index applied runs at once on the caller's thread (the event loop); otherwise it waits in
a queue that the apply thread runs after its entries, on each tick.

Everything here runs on pysyncobj's tick thread but ``ReadIndex.request`` and
``AppliedReads.submit``, which any thread may call.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

log = logging.getLogger(__name__)

PROBE = "gesmas_read_probe"     # leader -> replica: term, round
ACK = "gesmas_read_ack"         # replica -> leader: round, term
ASK = "gesmas_read_ask"         # follower -> leader: id
GRANT = "gesmas_read_grant"     # leader -> follower: id, index | error
MESSAGE_TYPES = frozenset((PROBE, ACK, ASK, GRANT))

#: The consistencies a read may ask for (node.py ``Node.read``).
LINEARIZABLE, SEQUENTIAL = "linearizable", "sequential"

#: Seconds a round (leader) or an ASK (follower) may stay unanswered before its reads fail.
ROUND_TIMEOUT = 2.0

#: ``callback(index, None)`` once the read index is known, ``callback(None, reason)`` if the
#: read must be refused. Called on the tick thread.
IndexCallback = Callable[[Optional[int], Optional[str]], None]


@dataclass
class _Round:
    id: int
    term: int
    index: int                       # the leader's commit index when the round started
    started: float
    waiting: List[IndexCallback]


@dataclass
class _Ask:
    leader: Any                      # the pysyncobj node it went to
    sent: float
    waiting: List[IndexCallback]


class ReadIndex:
    """The ReadIndex protocol of one replica (module docstring). ``node`` is the pysyncobj
    ``SyncObj``; ``term_at(index)`` the journal's term of an entry."""

    def __init__(self, term_at: Callable[[int], Optional[int]],
                 timeout: float = ROUND_TIMEOUT) -> None:
        self._term_at = term_at
        self.timeout = timeout
        self._mu = threading.Lock()
        self._new: List[IndexCallback] = []      # arrived, not in a round or ASK yet
        self._rounds: List[_Round] = []          # leader: rounds in flight, oldest first
        self._round_id = 0
        self._acked: Dict[Any, int] = {}         # leader: node -> highest round it acked
        self._acked_term = -1                    # the term those acks were given in
        self._asks: Dict[int, _Ask] = {}         # follower: ASKs in flight by id
        self._ask_id = 0
        self._unready: List[Tuple[float, IndexCallback]] = []   # leader without a commit
        self.rounds_started = 0                  # counters, for tests and metrics
        self.rounds_confirmed = 0

    # -------------------------------------------------------------- any thread
    def request(self, callback: IndexCallback) -> None:
        """Ask for a read index; the caller then wakes the tick thread."""
        with self._mu:
            self._new.append(callback)

    # ------------------------------------------------------------- tick thread
    def tick(self, node: Any, transport: Any, now: float) -> bool:
        """Start a round for the reads that arrived (leader), or ask the leader for them
        (follower); fail what waited too long. Returns whether messages were queued (the
        caller flushes the transport at once rather than after the next poll)."""
        with self._mu:
            new, self._new = self._new, []
        sent = False
        leader = node._isLeader()
        term = node.raftCurrentTerm
        if self._rounds and (not leader or term != self._rounds[0].term):
            self._fail_rounds("this replica is no longer the leader")
        self._expire(now)
        if leader:
            if self._unready:
                new = [cb for _, cb in self._unready] + new
                self._unready = []
            if new:
                sent = self._start_round(node, transport, term, new, now)
        elif new:
            target = node._getLeader()
            if target is None:
                for cb in new:
                    _call(cb, None, "no leader is known")
            else:
                self._ask_id += 1
                self._asks[self._ask_id] = _Ask(target, now, new)
                transport.send(target, {"type": ASK, "id": self._ask_id})
                sent = True
        return sent

    def _start_round(self, node: Any, transport: Any, term: int,
                     waiting: List[IndexCallback], now: float) -> bool:
        commit = node.raftCommitIndex
        if self._term_at(commit) != term:
            # a new leader knows every committed entry only once it has committed one of
            # its own term (its no-op): until then its commit index may be behind
            self._unready.extend((now, cb) for cb in waiting)
            return False
        if self._acked_term != term:
            self._acked, self._acked_term = {}, term
        self._round_id += 1
        self.rounds_started += 1
        self._rounds.append(_Round(self._round_id, term, commit, now, waiting))
        others = list(node._SyncObj__otherNodes)
        for other in others:
            transport.send(other, {"type": PROBE, "term": term, "round": self._round_id})
        self._confirm(node)                  # a cluster of one confirms at once
        return bool(others)

    def _confirm(self, node: Any) -> None:
        if not self._rounds:
            return
        others = list(node._SyncObj__otherNodes)
        majority = (len(others) + 1) // 2 + 1
        acked = sorted((self._acked.get(o, 0) for o in others), reverse=True)
        # the highest round that a majority (this leader plus majority-1 others) acknowledged
        confirmed = acked[majority - 2] if majority >= 2 else self._round_id
        while self._rounds and self._rounds[0].id <= confirmed:
            r = self._rounds.pop(0)
            self.rounds_confirmed += 1
            for cb in r.waiting:
                _call(cb, r.index, None)

    def _expire(self, now: float) -> None:
        limit = now - self.timeout
        while self._rounds and self._rounds[0].started < limit:
            r = self._rounds.pop(0)
            for cb in r.waiting:
                _call(cb, None, f"no majority confirmed the leadership within {self.timeout:g} s")
        for ask_id in [i for i, a in self._asks.items() if a.sent < limit]:
            for cb in self._asks.pop(ask_id).waiting:
                _call(cb, None, f"the leader did not give a read index within {self.timeout:g} s")
        if self._unready and self._unready[0][0] < limit:
            late = [cb for t, cb in self._unready if t < limit]
            self._unready = [(t, cb) for t, cb in self._unready if t >= limit]
            for cb in late:
                _call(cb, None, f"the leader has not committed an entry of its term within "
                      f"{self.timeout:g} s")

    def _fail_rounds(self, reason: str) -> None:
        rounds, self._rounds = self._rounds, []
        unready, self._unready = self._unready, []
        for r in rounds:
            for cb in r.waiting:
                _call(cb, None, reason)
        for _, cb in unready:
            _call(cb, None, reason)

    def on_message(self, node: Any, transport: Any, sender: Any, message: Dict[str, Any]) -> None:
        """One of this module's messages from ``sender`` (tick thread)."""
        kind = message.get("type")
        try:
            if kind == PROBE:
                transport.send(sender, {"type": ACK, "round": int(message["round"]),
                                        "term": node.raftCurrentTerm})
            elif kind == ACK:
                self._on_ack(node, sender, int(message["round"]), int(message["term"]))
            elif kind == ASK:
                self._on_ask(node, transport, sender, int(message["id"]))
            elif kind == GRANT:
                self._on_grant(sender, message)
        except (KeyError, TypeError, ValueError) as e:
            log.warning("malformed %s message from %s: %r", kind, getattr(sender, "id", sender), e)

    def _on_ack(self, node: Any, sender: Any, round_id: int, term: int) -> None:
        current = node.raftCurrentTerm
        if term > current:
            self._fail_rounds(f"a replica is in term {term}, after this leader's {current}")
            return
        if not node._isLeader() or term != current or self._acked_term != current:
            return
        if round_id > self._acked.get(sender, 0):
            self._acked[sender] = round_id
            self._confirm(node)

    def _on_ask(self, node: Any, transport: Any, sender: Any, ask_id: int) -> None:
        def grant(index: Optional[int], reason: Optional[str]) -> None:
            if index is not None:
                transport.send(sender, {"type": GRANT, "id": ask_id, "index": index})
            else:
                transport.send(sender, {"type": GRANT, "id": ask_id, "error": reason})
        if not node._isLeader():
            grant(None, "the replica asked is not the leader")
            return
        with self._mu:
            self._new.append(grant)         # in the next tick's round (the next iteration)

    def _on_grant(self, sender: Any, message: Dict[str, Any]) -> None:
        ask = self._asks.get(int(message["id"]))
        if ask is None or ask.leader != sender:
            return                           # expired already, or not from whom we asked
        del self._asks[int(message["id"])]
        index, error = message.get("index"), message.get("error")
        for cb in ask.waiting:
            if isinstance(index, int):
                _call(cb, index, None)
            else:
                _call(cb, None, f"the leader refused: {error}")

    def pending(self) -> int:
        """Reads waiting for an index (tests)."""
        with self._mu:
            n = len(self._new)
        return n + len(self._unready) + sum(len(r.waiting) for r in self._rounds) + \
            sum(len(a.waiting) for a in self._asks.values())


def _call(cb: IndexCallback, index: Optional[int], reason: Optional[str]) -> None:
    try:
        cb(index, reason)
    except Exception:
        log.exception("read index callback raised (ignored)")


# ------------------------------------------------------------------ reads of the applied state
@dataclass
class _Read:
    need: int
    fn: Callable[[Any], Any]
    done: Callable[[Any, int, Optional[BaseException]], None]
    cancelled: bool = False


@dataclass
class AppliedReads:
    """Runs reads against the applied state (module docstring). ``applied()`` is the highest
    index whose effects the state machine holds (entries that change nothing, such as
    pysyncobj's no-ops, count); ``sm()`` the state machine; ``exact()`` the index of the last
    entry the state machine applied itself (read under ``lock``)."""

    applied: Callable[[], int]
    sm: Callable[[], Any]
    exact: Callable[[], int]
    wake: Callable[[], None]
    lock: threading.Lock = field(default_factory=threading.Lock)
    _mu: threading.Lock = field(default_factory=threading.Lock)
    _queue: List[_Read] = field(default_factory=list)

    def submit(self, need: int, fn: Callable[[Any], Any],
               done: Callable[[Any, int, Optional[BaseException]], None]) -> _Read:
        """Run ``fn(sm)`` once index ``need`` is applied and call ``done(value, index,
        error)``: at once on this thread if it can, else later on the apply thread. The
        returned handle's ``cancelled`` flag drops a read still queued."""
        read = _Read(need, fn, done)
        if self.applied() >= need and self.lock.acquire(blocking=False):
            try:
                self._run(read)
            finally:
                self.lock.release()
            return read
        with self._mu:
            self._queue.append(read)
        self.wake()
        return read

    def run_due(self) -> None:
        """Run the queued reads whose index is applied (apply thread, between entries)."""
        if not self._queue:
            return
        applied = self.applied()
        with self._mu:
            due = [r for r in self._queue if r.need <= applied and not r.cancelled]
            self._queue = [r for r in self._queue if r.need > applied and not r.cancelled]
        if not due:
            return
        with self.lock:
            for read in due:
                self._run(read)

    def _run(self, read: _Read) -> None:
        """With ``lock`` held."""
        index = max(self.applied(), self.exact())
        try:
            value = read.fn(self.sm())
        except BaseException as e:          # the caller turns it into the read's error
            read.done(None, index, e)
            return
        read.done(value, index, None)

    def waiting(self) -> int:
        with self._mu:
            return len(self._queue)

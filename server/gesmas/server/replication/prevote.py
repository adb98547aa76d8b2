"""Pre-vote (Raft thesis §9.6, as etcd runs it): a replica whose election timeout passed
asks first whether it could win, without raising its term (override 14).

Why. pysyncobj starts an election as soon as a follower has not heard from a leader within
its election timeout: it raises its term and asks for votes. A replica restarted on its data
(or cut off from the leader alone for a moment) does exactly that while the leader is
healthy, and the higher term in its request deposes the leader: writes stall for an
election and, as measured, the restarted replica often became the leader itself.

How. When pysyncobj would start an election, `gate` holds it back (it moves the election
deadline, as the rejoin guard does) and sends a `gesmas_pre_vote` carrying the term it
would stand in and its last log entry. A replica grants it only if it would grant the real
vote (that term is above its own, the candidate's log is at least as up to date) *and* it
has no leader it heard from within its own election timeout; a leader never grants one.
Nothing changes on either side: no term, no vote recorded. With grants from a majority
(itself included) the candidate's next tick runs pysyncobj's election as before. A leader's
`timeout_now` (a leadership transfer) skips the pre-vote.

The messages are new types: a gesmas without this override ignores them (pysyncobj reads a
term only from the message types it knows), so a mixed cluster elects as before; a replica
that gets no answer simply asks again at its next timeout.

Runs on the tick thread only (the gate from `_RaftNode._onTick`, the messages from
`_DurableTransport._onMessageReceived`).
"""
from __future__ import annotations

import logging
from typing import Any, Optional, Set

from pysyncobj.syncobj import _RAFT_STATE
from pysyncobj.monotonic import monotonic as monotonicTime

log = logging.getLogger(__name__)

PRE_VOTE = "gesmas_pre_vote"
PRE_VOTE_RESPONSE = "gesmas_pre_vote_response"
MESSAGE_TYPES = frozenset({PRE_VOTE, PRE_VOTE_RESPONSE})


class PreVote:
    def __init__(self) -> None:
        self.term: Optional[int] = None      # the term the current round asks about
        self.grants: Set[Any] = set()        # node ids that granted it
        self.won: Optional[int] = None       # a term whose round a majority granted
        self.rounds = 0                      # rounds started (status, tests)
        self.held = 0                        # elections held back for want of a majority

    # -- the candidate ----------------------------------------------------------------------

    def gate(self, raft: Any, now: float) -> None:
        """Before pysyncobj's tick: if it is about to start an election, let it only after a
        pre-vote round won; otherwise hold it and start a round."""
        if raft._SyncObj__raftState not in (_RAFT_STATE.FOLLOWER, _RAFT_STATE.CANDIDATE) \
                or raft._SyncObj__selfNode is None or raft._SyncObj__transferInProgress:
            return
        if raft._SyncObj__raftElectionDeadline >= now or \
                not raft._SyncObj__connectedToAnyone():
            return
        term = raft._SyncObj__raftCurrentTerm + 1
        if self.won == term:
            self.won = None                  # pysyncobj stands in `term` now
            return
        if self.term is not None:
            self.held += 1
        raft._SyncObj__raftElectionDeadline = now + raft._SyncObj__generateRaftTimeout()
        # It no longer hears its leader: forget it, as pysyncobj does when it stands. Then it
        # grants the others' pre-votes (a replica that knows a leader and whose deadline is
        # ahead refuses them: two followers of a paused leader would refuse each other).
        raft._SyncObj__raftLeader = None
        self.term, self.grants, self.won = term, {raft._SyncObj__selfNode.id}, None
        self.rounds += 1
        message = {"type": PRE_VOTE, "pre_term": term,
                   "last_log_index": raft._SyncObj__getCurrentLogIndex(),
                   "last_log_term": raft._SyncObj__getCurrentLogTerm()}
        transport = raft._SyncObj__transport
        for node in raft._SyncObj__otherNodes:
            transport.send(node, dict(message))
        self._check(raft)

    def _check(self, raft: Any) -> None:
        voters = len(raft._SyncObj__otherNodes) + 1
        if self.term is not None and len(self.grants) > voters / 2:
            self.won, self.term = self.term, None
            raft._SyncObj__raftElectionDeadline = 0      # elect at the next tick
            log.info("pre-vote for term %d granted by a majority: standing for election",
                     self.won)

    # -- every replica ----------------------------------------------------------------------

    def on_message(self, raft: Any, transport: Any, node: Any, message: dict) -> None:
        if message.get("type") == PRE_VOTE:
            granted = self._grants(raft, message)
            transport.send(node, {"type": PRE_VOTE_RESPONSE,
                                  "pre_term": message.get("pre_term"), "granted": granted})
        elif message.get("type") == PRE_VOTE_RESPONSE:
            if message.get("granted") is True and self.term is not None and \
                    message.get("pre_term") == self.term and \
                    raft._SyncObj__raftCurrentTerm + 1 == self.term:
                self.grants.add(node.id)
                self._check(raft)

    @staticmethod
    def _grants(raft: Any, message: dict) -> bool:
        term, index, last = (message.get("pre_term"), message.get("last_log_index"),
                             message.get("last_log_term"))
        if not all(type(x) is int for x in (term, index, last)):
            return False
        if term <= raft._SyncObj__raftCurrentTerm:
            return False
        state = raft._SyncObj__raftState
        if state == _RAFT_STATE.LEADER:
            return False
        if raft._SyncObj__raftLeader is not None and \
                raft._SyncObj__raftElectionDeadline > monotonicTime():
            return False                     # it hears from a leader: no election is needed
        mine = (raft._SyncObj__getCurrentLogTerm(), raft._SyncObj__getCurrentLogIndex())
        return (last, index) >= mine

"""A replica that comes back with an empty data dir must not vote until it has caught up
(pysyncobj override 10).

Why: Raft's safety rests on a voter remembering what it wrote. A replica whose disk was lost
(or emptied by an operator) and that comes back under its old identity would vote at once;
with a peer that lagged it can elect that peer, and writes that only it and the (now stopped)
third replica had acknowledged are then lost on every replica. An empty data dir alone cannot
tell a lost disk from the first start of a new cluster: the operator says which, as with
etcd's ``--initial-cluster-state``. ``gesmas server --new-cluster`` (passed by ``gesmas up``
and by ``LocalCluster`` when they create a cluster) means "this empty data dir is new"; any
other empty start is a rejoin.

What a rejoining replica does, until it is caught up:
* it ignores vote requests from candidates whose log may lack an entry committed before it
  came back (``covers`` says which logs cannot); a candidate with an empty log cannot win
  against a voter that holds committed entries, so it gets the vote, and every replica of a
  new cluster started without the flag can still elect one of them;
* it does not stand for election while its own log may lack such an entry;
* the state survives restarts: a marker file (``REJOINING``) is written, and fsynced, before
  the journal is created, and removed only once caught up. A replica that crashed half-way
  through catching up is still rejoining when it comes back.

Caught up: as a follower, it has applied an entry of the current leader's term (that leader's
log holds every entry committed before its term) and everything up to the commit index that
leader reported first in that term (which covers what was acknowledged before this replica
came back). As a leader (elected with an empty log, so by voters with empty logs), once it has
applied an entry of its own term. All methods run on the tick thread.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Dict, Optional

from .journal import LOG_NAME, MAGIC, fsync_dir

log = logging.getLogger(__name__)

MARKER_NAME = "REJOINING"
_MARKER_TEXT = (
    "This replica started with an empty data dir without --new-cluster, so it may have lost\n"
    "entries it had acknowledged. It does not vote for a candidate with a history, nor stand\n"
    "for election, until it has caught up with a leader; then gesmas removes this file.\n")


def is_empty(data_dir: str, snapshot_name: str) -> bool:
    """No log record and no snapshot: nothing this replica wrote is left."""
    log_path = os.path.join(data_dir, LOG_NAME)
    has_log = os.path.isfile(log_path) and os.path.getsize(log_path) > len(MAGIC)
    return not has_log and not os.path.isfile(os.path.join(data_dir, snapshot_name))


class RejoinGuard:
    def __init__(self, marker: str, fsync: bool = True) -> None:
        self.marker = marker
        self.fsync = fsync
        self.term = -1          # the term whose leader's first reported commit index is `commit`
        self.commit = 0
        self.refused = 0        # vote requests refused: the cluster had a history

    @classmethod
    def open(cls, data_dir: str, snapshot_name: str, has_peers: bool, new_cluster: bool,
             fsync: bool = True) -> Optional[RejoinGuard]:
        """The guard of a replica starting in `data_dir` (already created), or None. Call it
        before the journal is opened: an empty start writes the marker first."""
        marker = os.path.join(data_dir, MARKER_NAME)
        if os.path.isfile(marker):
            log.info("still rejoining after an empty start (%s exists): no vote for a "
                     "candidate with a history until caught up", marker)
            return cls(marker, fsync)
        if new_cluster or not has_peers or not is_empty(data_dir, snapshot_name):
            return None
        with open(marker, "w") as f:
            f.write(_MARKER_TEXT)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        if fsync:
            fsync_dir(data_dir)
        # INFO, not a warning: this is also every replica's first start under a unit file or
        # a StatefulSet (which never pass --new-cluster), and then nothing is wrong: the
        # candidates have empty logs and get the vote. The warning comes from refuses(), when
        # a candidate with a history shows that this replica may lack entries it had.
        log.info("started with an empty data dir and without --new-cluster: until it has "
                 "caught up with a leader it votes only for candidates whose log surely holds "
                 "what it may have had (on a cluster's first start: any, their logs are empty)")
        return cls(marker, fsync)

    def heard(self, message: Dict[str, Any]) -> None:
        """An append_entries from the leader of message['term']."""
        term = message.get("term", -1)
        if term > self.term:
            self.term, self.commit = term, message.get("commit_index", 0)

    def covers(self, last_term: int, last_index: int) -> bool:
        """Whether a log ending with an entry (last_index, last_term) surely holds every entry
        committed before this replica came back. Those were committed in terms up to
        `self.term`, the first term this replica heard a leader in since: before that term
        they are in its leader's log ahead of every entry of the term (a leader holds every
        committed entry and appends after it), and in that term up to the commit index the
        leader first reported (`self.commit`). So a log whose last entry is of a later term,
        or of that term at or past that index, holds them all (Raft's log matching); one of
        term 0 holds nothing to lose (pysyncobj starts every log with a no-op of term 0)."""
        if not last_term:
            return True
        if self.term < 0:           # no leader heard since the empty start: nothing is known
            return False
        return last_term > self.term or (last_term == self.term and last_index >= self.commit)

    def refuses(self, message: Dict[str, Any]) -> bool:
        """Whether to ignore this request_vote. The first refusal is a warning: a candidate
        with a history means the cluster had entries before this replica started empty."""
        last_term = message.get("last_log_term") or 0
        last_index = message.get("last_log_index") or 0
        if self.covers(last_term, last_index):
            return False
        if not self.refused:
            log.warning("refused the vote to a candidate whose log (term %d, index %d) may "
                        "lack entries committed before this replica started with an empty data "
                        "dir (a lost disk?): it votes for such candidates again once it has "
                        "caught up with a leader (README 'A replica that lost its disk')",
                        last_term, last_index)
        self.refused += 1
        return True

    def may_stand(self, last_term: Optional[int], last_index: Optional[int]) -> bool:
        """Whether to stand for election with its own log (its own vote is one too)."""
        return self.covers(last_term or 0, last_index or 0)

    def caught_up(self, is_leader: bool, term: int, applied: int,
                  applied_term: Optional[int]) -> bool:
        if applied_term != term:
            return False
        return is_leader or (term == self.term and applied >= self.commit)

    def clear(self) -> None:
        """Caught up: vote again, also after a restart."""
        try:
            os.unlink(self.marker)
        except FileNotFoundError:
            pass
        if self.fsync:
            fsync_dir(os.path.dirname(self.marker))

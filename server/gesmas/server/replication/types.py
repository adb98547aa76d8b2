"""What the replication layer hands out: its errors, the outcome of a failed proposal, and
the Raft timing settings."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

from pysyncobj.config import FAIL_REASON


log = logging.getLogger(__name__)


class ReplicationError(Exception):
    """Base class of the errors ``Replica`` raises."""


class NotLeader(ReplicationError):
    """The command was not accepted: no leader is known (``leader`` None) or forwarding is off."""

    def __init__(self, leader: Optional[str]):
        super().__init__(f"not leader; leader is {leader or 'unknown'}")
        self.leader = leader


class Overloaded(ReplicationError):
    """pysyncobj's command queue is full."""


class ReplicaStopped(ReplicationError):
    """The replica was destroyed, or stopped itself after a fatal state-machine error."""


@dataclass(frozen=True)
class ProposeFailure:
    """Asynchronous outcome of a proposal that pysyncobj reports as not (known to be) applied.

    ``maybe_applied`` is True when the outcome is unknown (the command may still be committed
    and its completion delivered); False when it is certain the command will not be applied.
    """
    reason: str
    maybe_applied: bool
    leader: Optional[str]


_FAILURES = {  # pysyncobj FAIL_REASON -> (name, maybe_applied)
    FAIL_REASON.QUEUE_FULL: ("queue_full", False),
    FAIL_REASON.MISSING_LEADER: ("no_leader", False),
    FAIL_REASON.DISCARDED: ("discarded", False),
    FAIL_REASON.NOT_LEADER: ("not_leader", False),
    FAIL_REASON.LEADER_CHANGED: ("leader_changed", True),
    FAIL_REASON.REQUEST_DENIED: ("denied", False),
    FAIL_REASON.UNKNOWN_OUTCOME: ("unknown_outcome", True),
}


@dataclass(frozen=True)
class RaftTuning:
    """pysyncobj knobs. Defaults chosen from measurements (module docstring).

    ``use_batch=False`` makes pysyncobj wake its loop through a pipe on every proposal and ship
    entries at once; ``_DurableTransport`` still groups them: all entries added in one loop
    iteration share one fsync and travel in one append_entries message per follower.
    """
    append_entries_period: float = 0.05   # heartbeat; pysyncobj default 0.1
    raft_min_timeout: float = 0.5         # election timeout range; default 0.4 .. 1.4
    raft_max_timeout: float = 1.2
    leader_fallback_timeout: float = 1.5  # leader steps down without a majority; default 30
    connection_timeout: float = 3.5
    connection_retry_time: float = 1.0    # default 5.0: slow re-join after restarts
    use_batch: bool = False
    batch_size_bytes: int = 2 ** 20       # also bounds one command (chunked path avoided)
    log_compaction_min_entries: int = 10000
    log_compaction_min_time: float = 300.0
    snapshot_chunk_bytes: int = 2 ** 20
    auto_tick_period: float = 0.05
    commands_queue_size: int = 100000

    @property
    def max_command_bytes(self) -> int:
        # pysyncobj sends an entry whose command is >= batch_size_bytes in 'transmission'
        # chunks, a path with an off-by-some end test and without conflict-only truncation.
        return self.batch_size_bytes - 4096

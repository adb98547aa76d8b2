"""The leader keeps its log while a follower catches up (override 18).

Why. A follower that loads a snapshot (~12 s at 10^6 objects) answers nothing meanwhile, and
the entries queued for it may be dropped (override 17). If the leader compacted its log past
the follower's place then, the follower needed the next snapshot once it had loaded the
first: a second transfer and load (a wiped follower caught up in ~27 s instead of ~13 s at
10^6, docs/performance.md). A follower restarted on its own data is in the same place: it
loads its own snapshot before it connects, and if the leader compacted past it meanwhile it
needs the leader's whole snapshot after its own. etcd keeps entries behind each snapshot for
such a follower (SnapshotCatchUpEntries); this keeps the leader's whole log while one catches
up, within bounds.

The rule (`keeps_log`). A follower's place is the last index the leader knows it holds: the
index it confirmed, or the one before the next the leader will send it if that is lower (a
follower that lost its data confirmed a high index before; the leader then sends it a
snapshot and goes on from the snapshot's index). The leader does not compact while
  * a connected follower's place is more than a tenth of `logCompactionMinEntries` behind
    the leader's applied index (a healthy follower is always a few entries behind: those
    are on their way, and a compaction does not hold them back), or
  * a follower whose connection closed less than `CATCH_UP_GRACE` seconds ago is behind it
    at all: nothing more reaches it until it is back, and a compaction past its place then
    costs it the leader's whole snapshot. At 10^6 objects the leader compacted 1.8 s after
    a follower was stopped to be restarted, ~340 entries past it (under the tenth), and the
    follower loaded its own snapshot and then the leader's (27 s instead of ~14 s), or
  * a connected follower the leader has not heard from for `SILENT_BEATS` heartbeats is
    behind it at all: a follower loading the snapshot it was just sent answers nothing (its
    Raft thread waits for the load), and its connection stays up for the first 3.5 s. At 10^5
    waiting calls the leader compacted within a second of such a load's start, less than a
    tenth of an interval past the snapshot, and the follower had to load the next one (a
    catch-up of 9.7 s, not 5).
The leader closes a connection to a peer silent for `connection_timeout` (3.5 s), so a
follower loading a snapshot for 14 s, restarting or paused is disconnected for most of its
catch-up. A disconnected follower whose place is 0 does not count: after a failover a new
leader knows no follower's place (its confirmed indexes start at 0), and the old leader,
dead, must not hold its log.

Bounds. The log is kept to at most `CATCH_UP_KEEP` compaction intervals (100,000 entries at
the default interval; `CATCH_UP_FLOOR` entries at least); past that, or for a compaction pysyncobj forces, the leader compacts
as before. A follower that stays down holds the log for `CATCH_UP_GRACE` seconds at most;
one that stays connected but does not keep up (stuck) holds it up to the bound.

Runs on the tick thread only (`_RaftNode._SyncObj__tryLogCompaction` and
`_SyncObj__onNodeDisconnected` in overrides.py).

A snapshot sent once (`SnapshotsSent`, override 19). pysyncobj's leader takes a follower's
`next_node_idx` answer as it comes, with nothing to say which message it answers. A wiped
follower answers each heartbeat with a reset to the start of the log; the first such answer
starts the snapshot, and a small one goes out whole in one tick, after which the leader's
next index for the follower is past the snapshot. An answer to an earlier heartbeat, still on
its way, then set that index back, and the whole snapshot went out again (the follower loaded
the same snapshot twice in about one run of eight of test_rejoin's wiped follower). A
follower answers in order, and its Raft thread waits for a load, so from the snapshot's last
chunk until its first answer past the snapshot's index every answer it sends was written
before it had the snapshot: the leader notes that it heard from it, and moves nothing. The
snapshot is forgotten (the follower's answers count again) when its connection closes, when
chunks waiting for it are dropped because it reconnected (override 17), when this replica
becomes leader again, and, for a follower that never loads it, after `SENT_SNAPSHOT_BOUND`
seconds.

A snapshot sent at a bounded rate (`SnapshotPacer`, override 23). A leader sent a wiped
follower its whole snapshot as fast as the two could frame, compress, encrypt, decrypt and
write it: at 10^6 objects 105 MB in about a second, during which the three replicas and
their clients share this host's two cores, and a produce loop's calls took 85-128 ms
(against a few ms before and after; the disk was not slow and nothing stole the host). The
leader now hands a follower its snapshot's chunks at `SNAPSHOT_RATE` at most, so the same
work is spread over a few seconds and leaves room for the calls; `GESMAS_SNAPSHOT_RATE`
(megabytes per second; 0 sends unpaced) sets it. The chunks wait in the node's backlog
(override 17), where pysyncobj's sending loop puts the whole snapshot in its first rounds
(it takes chunks for up to a heartbeat period per round); a chunk there is a place in the
file, read when it is sent (snapshots.py, `Chunk`), so the wait costs no memory. Only chunks of a
snapshot are paced: a follower's log entries, heartbeats and every other node's messages go as
before (a heartbeat queued behind a chunk waits for it: a node's messages stay in order, and
the chunks themselves reset the follower's election timer).
"""
from __future__ import annotations

import logging
import os
from typing import Any, Dict, Iterable, Mapping, Tuple

log = logging.getLogger(__name__)

#: compaction intervals of log a leader keeps at most for a follower catching up
CATCH_UP_KEEP = 10

#: entries of log a leader may keep for a follower catching up whatever the interval: ten
#: intervals of 100 entries (the smallest allowed) fill in half a second under four writers,
#: before a wiped follower has received and loaded its snapshot
CATCH_UP_FLOOR = 10_000

#: seconds after a follower's connection closed during which the leader keeps its log for it
CATCH_UP_GRACE = 120.0

#: heartbeats (append_entries periods) without an answer after which a connected follower
#: counts as not receiving: a healthy one answers each
SILENT_BEATS = 5

#: seconds after a snapshot's last chunk during which a follower's answers that ask for an
#: index at or before it are taken as written before it arrived (module docstring); a load
#: of 10^6 objects takes ~15 s, and a follower's Raft thread answers nothing meanwhile
SENT_SNAPSHOT_BOUND = 60.0

#: bytes per second at which a leader sends one follower a snapshot (module docstring)
SNAPSHOT_RATE = 40 * 2 ** 20

#: the least rate GESMAS_SNAPSHOT_RATE may ask for: a chunk (1 MiB) every 1/8 s resets a
#: follower's election timer (0.5-1.2 s) with room to spare
SNAPSHOT_RATE_FLOOR = 8 * 2 ** 20


class CatchUp:
    """When each follower's connection last closed, and the rule (module docstring)."""

    def __init__(self, heartbeat: float, grace: float = CATCH_UP_GRACE,
                 keep: int = CATCH_UP_KEEP) -> None:
        self.silent = SILENT_BEATS * heartbeat
        self.grace = grace
        self.keep = keep
        self.gone: Dict[Any, float] = {}     # node -> monotonic time its connection closed

    def disconnected(self, node: Any, now: float) -> None:
        self.gone[node] = now

    def keeps_log(self, *, leader: bool, forced: bool, log_entries: int, every: int,
                  applied: int, others: Iterable[Any], connected: Iterable[Any],
                  confirmed: Mapping[Any, int], next_index: Mapping[Any, int],
                  heard: Mapping[Any, float], now: float) -> bool:
        """Whether the leader should skip this compaction for a follower catching up."""
        if not leader or forced:
            return False
        every = max(1, every)
        if log_entries > max(self.keep * every, CATCH_UP_FLOOR):
            return False
        lag = max(1, every // 10)
        up = set(connected)
        for node in others:
            place = min(confirmed.get(node, 0), next_index.get(node, applied + 1) - 1)
            if node in up and applied - place > lag:
                return True
            if not 0 < place < applied:
                continue
            if node in up:
                if now - heard.get(node, now) > self.silent:
                    return True
            elif now - self.gone.get(node, -1e18) < self.grace:
                return True
        return False


class SnapshotsSent:
    """The snapshot each follower was last sent whole, until it answers past it (module
    docstring, override 19). Tick thread only."""

    def __init__(self, bound: float = SENT_SNAPSHOT_BOUND) -> None:
        self.bound = bound
        self.sent: Dict[Any, Tuple[int, float]] = {}   # node -> (snapshot index, when)
        self.ignored = 0                               # stale answers not acted on

    def went(self, node: Any, index: int, now: float) -> None:
        """The last chunk of the snapshot at `index` went to `node`."""
        self.sent[node] = (index, now)

    def forget(self, node: Any) -> None:
        self.sent.pop(node, None)

    def answer(self, node: Any, message: Dict[str, Any], now: float) -> Dict[str, Any]:
        """The `next_node_idx` message the leader should act on: `message`, or, for an answer
        written before the follower had the snapshot, one that only says it was heard."""
        at = self.sent.get(node)
        if at is None:
            return message
        index, when = at
        wants = message.get("next_node_idx")
        if not isinstance(wants, int) or wants > index or now - when > self.bound:
            del self.sent[node]      # past the snapshot (its load answered), or given up
            return message
        if not (message.get("reset") or message.get("success")):
            return message           # moves nothing anyway
        self.ignored += 1
        log.info("an answer from %s written before its snapshot at index %d arrived: heard, "
                 "not acted on (it asked for %d)", node, index, wants)
        return dict(message, reset=False, success=False)


def snapshot_rate_from_env(environ: Any = os.environ) -> float:
    """The rate GESMAS_SNAPSHOT_RATE asks for, in bytes per second (SNAPSHOT_RATE if unset;
    0 for unpaced)."""
    raw = str(environ.get("GESMAS_SNAPSHOT_RATE", "")).strip()
    if not raw:
        return float(SNAPSHOT_RATE)
    try:
        rate = float(raw) * 2 ** 20
    except ValueError:
        rate = float("nan")
    if rate == 0 or SNAPSHOT_RATE_FLOOR <= rate < float("inf"):   # NaN fails both
        return rate
    raise ValueError(f"GESMAS_SNAPSHOT_RATE={raw!r} is not a rate in megabytes per second: "
                     f"0 (unpaced) or at least {SNAPSHOT_RATE_FLOOR >> 20}")


#: seconds between two replicas' snapshots (override 25, ``_RaftNode._gesmas_staggered``)
SNAPSHOT_STAGGER = 2.0
#: the most GESMAS_SNAPSHOT_STAGGER may ask for: the last of three replicas takes its snapshot
#: twice that after the first, and the log grows meanwhile
SNAPSHOT_STAGGER_MAX = 30.0


def snapshot_stagger_from_env(environ: Any = os.environ) -> float:
    """The seconds GESMAS_SNAPSHOT_STAGGER asks for between two replicas' snapshots
    (SNAPSHOT_STAGGER if unset; 0: each takes its snapshot as soon as it is due)."""
    raw = str(environ.get("GESMAS_SNAPSHOT_STAGGER", "")).strip()
    if not raw:
        return SNAPSHOT_STAGGER
    try:
        seconds = float(raw)
    except ValueError:
        seconds = float("nan")
    if 0 <= seconds <= SNAPSHOT_STAGGER_MAX:     # NaN fails
        return seconds
    raise ValueError(f"GESMAS_SNAPSHOT_STAGGER={raw!r} is not a number of seconds from 0 to "
                     f"{SNAPSHOT_STAGGER_MAX:g} (the time between two replicas' snapshots)")


class SnapshotPacer:
    """Each node's credit of snapshot bytes (a token bucket): `rate` bytes a second, at
    most `burst` saved up (module docstring, override 23). Tick thread only."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.burst = max(2 * 2 ** 20, rate * 0.1)     # two chunks, or a tenth of a second
        self.credit: Dict[Any, Tuple[float, float]] = {}   # node -> (bytes, as of when)
        self.held = 0                                      # times a chunk had to wait

    def may_send(self, node: Any, nbytes: int, now: float) -> bool:
        """Whether `nbytes` of snapshot chunks may go to `node` now; if so they are spent
        (the credit may go below zero by one run: the next waits until it is back above)."""
        if nbytes <= 0 or self.rate <= 0:
            return True
        credit, when = self.credit.get(node, (self.burst, now))
        credit = min(self.burst, credit + (now - when) * self.rate)
        if credit <= 0:
            self.credit[node] = (credit, now)
            self.held += 1
            return False
        self.credit[node] = (credit - nbytes, now)
        return True

    def forget(self, node: Any) -> None:
        self.credit.pop(node, None)

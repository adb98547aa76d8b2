"""The apply thread (override 15): committed entries applied off pysyncobj's tick thread.

Theory of operation. pysyncobj applies committed entries on its tick thread, the thread that
also sends heartbeats and answers votes. A kernel entry can take long (a checkpoint, a catch-up,
an entry that uses its whole step budget), and a leader that stops sending heartbeats that long
is deposed. So the tick thread only queues each entry (`put`); this thread applies them, one at
a time and in log order, through the `apply(index, data)` callback it is given. Raft never
waits for the kernel.

Jobs. `call(fn)` runs `fn` on this thread ahead of the entries queued, and waits for it: the
kernel's greenlets belong to the thread that made them, so whatever runs kernel code (a
snapshot being loaded, a state read that resumes a greenlet) must run here.

Generations. When a snapshot replaces the state, the entries queued before it are superseded:
`supersede()` drops them, and an entry taken from the queue before the call but not yet applied
is dropped too (its generation is older). Jobs are not entries: they stay queued (an earlier
version cleared them with the entries, which left their callers waiting until the replica
stopped, and miscounted `inflight`).

Background work. When the queue is empty, `background()` runs (a checkpoint's capture saving
objects in slices, kernel/capture.py), again and again while it says there is more and no
entry or job is queued: an entry never waits for more than one slice.

Pacing. Background work takes at most `share` of a core: after a slice that used c seconds
of this thread's CPU the thread rests c * (1 - share) / share before the next one (entries
and jobs are not paced: one queued ends the rest at once). A capture does not need to end
fast, only before the next checkpoint, and the leader proposes checkpoints 5 s apart at the
least (duties.py); so a run of slices rests only in its first PACE_FOR seconds (1 / share if
longer: the time a second of CPU takes at that share), and goes flat out after that.
Unpaced, the three replicas' captures after a checkpoint took both cores of a 2-core host
for a second (~1 s of CPU each at 10^6 objects with 20,000 made since the last checkpoint:
bench/capture_slices.py), and the calls made then waited for a core (docs/performance.md).
`GESMAS_CAPTURE_SHARE` sets the share (default BACKGROUND_SHARE; 1 runs slices back to back,
as before).

Counters, under the condition's lock: `inflight` counts the entries queued or being applied
(never the jobs), `last_done` is the last entry this thread finished. `busy()` and
`last_done_if_behind()` read them for the replica's applied index; `wait_idle()` waits until
every entry queued so far is applied.

Threading rule: `put` is called by the tick thread only, in log order; everything else may be
called from any thread; `call` from this thread runs `fn` at once.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from typing import Any, Callable, Deque, Optional, Tuple

from .types import ReplicaStopped

log = logging.getLogger(__name__)

_JOB = -1                    # the index of a queued job

#: The share of a core background slices may take (module docstring: pacing).
BACKGROUND_SHARE = 0.25
#: Seconds from its first slice in which a run of background slices is paced.
PACE_FOR = 4.0


def share_from_env(environ: Any = os.environ) -> float:
    """The background share GESMAS_CAPTURE_SHARE asks for (BACKGROUND_SHARE if unset)."""
    raw = str(environ.get("GESMAS_CAPTURE_SHARE", "")).strip()
    try:
        share = float(raw) if raw else BACKGROUND_SHARE
    except ValueError:
        share = float("nan")
    if not 0.01 <= share <= 1:               # NaN fails this too
        raise ValueError(f"GESMAS_CAPTURE_SHARE={raw!r} is not a share of the apply thread's "
                         "time from 0.01 to 1")
    return share


class ApplyThread:
    def __init__(self, name: str, apply: Callable[[int, bytes], None],
                 idle: Callable[[], None],
                 background: Callable[[], bool] = lambda: False,
                 share: float = 1.0, pace_for: Optional[float] = None) -> None:
        """`apply(index, data)`: apply one entry (it handles its own errors). `idle()`: called
        after an entry when nothing more is queued. `background()`: one slice of background
        work, run while nothing is queued; returns whether there is more. `share`: of a core,
        what background slices may take (1: back to back), in their first `pace_for` s
        (default: PACE_FOR, or 1 / share s if longer: a second of CPU ends paced)."""
        if not 0 < share <= 1:
            raise ValueError(f"share must be in (0, 1], not {share!r}")
        self._apply, self._idle, self._background = apply, idle, background
        self._more = False               # background work may be left (this thread only)
        self._rest = (1 - share) / share     # rest per CPU second of a background slice
        self._pace_for = max(PACE_FOR, 1 / share) if pace_for is None else pace_for
        self._rest_until = 0.0           # no background slice before (monotonic; this thread)
        self._paced_since: Optional[float] = None   # the first slice of this run of them
        self._cv = threading.Condition()
        self._q: Deque[Tuple[int, int, Any]] = deque()   # (generation, index or _JOB, data or job)
        self._gen = 0
        self.inflight = 0
        self.last_done = 0
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, daemon=True, name=name)
        self._thread.start()

    # -- the tick thread -------------------------------------------------------------------------

    def put(self, index: int, data: bytes) -> None:
        with self._cv:
            self._q.append((self._gen, index, data))
            self.inflight += 1
            self._cv.notify()

    # -- any thread ------------------------------------------------------------------------------

    def on_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn()`` on the apply thread, ahead of the entries queued, and wait for it.
        Returns its result or raises its exception; ReplicaStopped if the thread stops first."""
        if self.on_thread():
            return fn()
        done = threading.Event()
        out: list = [None, None]

        def job() -> None:
            try:
                out[0] = fn()
            except BaseException as e:
                out[1] = e
            finally:
                done.set()
        with self._cv:
            if self._stopping:
                raise ReplicaStopped("replica destroyed")
            self._q.appendleft((self._gen, _JOB, job))
            self._cv.notify()
        while not done.wait(0.5):
            if self._stopping:
                raise ReplicaStopped("replica destroyed")
        if out[1] is not None:
            raise out[1]
        return out[0]

    def supersede(self) -> None:
        """The state was replaced: drop the entries queued so far (not the jobs)."""
        with self._cv:
            self._gen += 1
            kept = [item for item in self._q if item[1] == _JOB]
            self.inflight -= len(self._q) - len(kept)
            self._q.clear()
            self._q.extend(kept)
            self._cv.notify_all()

    def busy(self) -> bool:
        """Whether entries wait for the apply thread (or one is being applied)."""
        return self.inflight > 0

    def last_done_if_behind(self) -> Optional[int]:
        """The last entry applied, if entries are still queued or being applied, else None."""
        with self._cv:
            return self.last_done if self.inflight else None

    def wait_idle(self, timeout: Optional[float] = None) -> bool:
        """Wait until every entry queued so far is applied (or the thread stops)."""
        with self._cv:
            return self._cv.wait_for(lambda: self.inflight == 0 or self._stopping, timeout)

    def stop(self, timeout: float) -> None:
        with self._cv:
            self._stopping = True
            self._q.clear()
            self._cv.notify_all()
        if not self.on_thread():
            self._thread.join(timeout)

    # -- the apply thread ------------------------------------------------------------------------

    def _loop(self) -> None:
        cv, q = self._cv, self._q
        while True:
            with cv:
                while not q and not self._stopping:
                    if not self._more:
                        cv.wait()
                        continue
                    rest = self._rest_until - time.monotonic()
                    if rest <= 0:
                        break
                    cv.wait(rest)
                if self._stopping and not q:
                    return
                if not q:
                    item = None
                else:
                    item = q.popleft()
            if item is None:
                c0 = time.thread_time()
                self._more = bool(self._background())
                if not self._more:
                    self._paced_since = None
                elif self._rest:
                    now = time.monotonic()
                    if self._paced_since is None:
                        self._paced_since = now
                    self._rest_until = min(now + (time.thread_time() - c0) * self._rest,
                                           self._paced_since + self._pace_for)
                continue
            gen, index, data = item
            if index == _JOB:
                data()
                continue
            try:
                if gen == self._gen:
                    self._apply(index, data)
            finally:
                with cv:                         # taken from the queue: supersede() left it
                    self.inflight -= 1
                    self.last_done = index
                    empty = not q
                    if empty:
                        cv.notify_all()
            if empty:
                self._idle()
                self._more = True                # a checkpoint may have left work

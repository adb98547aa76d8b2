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

Counters, under the condition's lock: `inflight` counts the entries queued or being applied
(never the jobs), `last_done` is the last entry this thread finished. `busy()` and
`last_done_if_behind()` read them for the replica's applied index; `wait_idle()` waits until
every entry queued so far is applied.

Threading rule: `put` is called by the tick thread only, in log order; everything else may be
called from any thread; `call` from this thread runs `fn` at once.
"""
from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Any, Callable, Deque, Optional, Tuple

from .types import ReplicaStopped

log = logging.getLogger(__name__)

_JOB = -1                    # the index of a queued job


class ApplyThread:
    def __init__(self, name: str, apply: Callable[[int, bytes], None],
                 idle: Callable[[], None]) -> None:
        """`apply(index, data)`: apply one entry (it handles its own errors). `idle()`: called
        after an entry when nothing more is queued."""
        self._apply, self._idle = apply, idle
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
                    cv.wait()
                if not q:
                    return
                gen, index, data = q.popleft()
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

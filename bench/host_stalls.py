"""What the host took from this machine while a benchmark ran: to tell a stall of ours from
one of the host's.

On a virtual machine a call can stop for reasons no process here sees: the hypervisor runs
something else on the vCPU (the kernel counts that time as *steal*, /proc/stat's eighth
column), or the whole guest is paused. A sampler in a process of its own reads /proc/stat
every SAMPLE_S seconds and notes time.monotonic() (the clock every process here shares);
``HostStalls`` reads its lines and says, for a span of time, how much steal and I/O wait the
host counted and whether the sampler itself went unscheduled for long (a gap: a pause of the
guest, or a machine too loaded to run it).

    python bench/host_stalls.py            # the sampler: one line per sample, until killed
"""
from __future__ import annotations

import bisect
import os
import subprocess
import sys
import threading
import time

SAMPLE_S = 0.05
TICK_MS = 1000.0 / os.sysconf("SC_CLK_TCK")
GAP_S = 0.25                    # a sampler late by this much did not run: a gap


def _cpu_line() -> tuple[int, int]:
    """(steal, iowait) of all CPUs, in clock ticks."""
    with open("/proc/stat", "rb") as f:
        fields = f.readline().split()
    return int(fields[8]), int(fields[5])


def sample_forever() -> None:
    while True:
        steal, iowait = _cpu_line()
        sys.stdout.write(f"{time.monotonic():.4f} {steal} {iowait}\n")
        sys.stdout.flush()
        time.sleep(SAMPLE_S)


class HostStalls:
    """The sampler's child process and its samples: (t, steal ticks, iowait ticks)."""

    def __init__(self) -> None:
        self.t: list[float] = []
        self.steal: list[int] = []
        self.iowait: list[int] = []
        self._lock = threading.Lock()
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__)],
                                     stdout=subprocess.PIPE, text=True)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            t, steal, iowait = line.split()
            with self._lock:
                self.t.append(float(t))
                self.steal.append(int(steal))
                self.iowait.append(int(iowait))

    def _between(self, column: list[int], a: float, b: float) -> float:
        """The ticks of `column` counted from the last sample at or before `a` to the first
        at or after `b`, in ms (all CPUs together)."""
        with self._lock:
            i = max(0, bisect.bisect_right(self.t, a) - 1)
            j = min(len(self.t) - 1, bisect.bisect_left(self.t, b))
            if j <= i:
                return 0.0
            return (column[j] - column[i]) * TICK_MS

    def steal_ms(self, a: float, b: float) -> float:
        return self._between(self.steal, a, b)

    def iowait_ms(self, a: float, b: float) -> float:
        return self._between(self.iowait, a, b)

    def gaps(self, a: float, b: float) -> list[tuple[float, float]]:
        """Spans in [a, b] in which the sampler took no sample for over GAP_S seconds."""
        with self._lock:
            i = max(1, bisect.bisect_left(self.t, a))
            return [(self.t[k - 1], self.t[k]) for k in range(i, len(self.t))
                    if self.t[k] <= b and self.t[k] - self.t[k - 1] > GAP_S]

    def explains(self, t: float, ms: float, steal_over_ms: float = 20.0) -> bool:
        """Whether the host took time during the call [t, t + ms]: over `steal_over_ms` of
        steal, or a gap of the sampler overlapping it."""
        end = t + ms / 1e3
        return (self.steal_ms(t, end) > steal_over_ms
                or any(g0 < end and g1 > t for g0, g1 in self.gaps(t - 1.0, end + 1.0)))

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self._thread.join(5)


if __name__ == "__main__":
    try:
        sample_forever()
    except (KeyboardInterrupt, BrokenPipeError):
        pass

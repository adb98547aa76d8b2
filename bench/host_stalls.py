"""What the host took from this machine while a benchmark ran: to tell a stall of ours from
one of the host's.

On a virtual machine a call can stop for reasons no process here sees: the hypervisor runs
something else on the vCPU (the kernel counts that time as *steal*, /proc/stat's eighth
column), or the whole guest is paused; or the disk is slow to answer (the CPUs then sit in
*I/O wait*, the fifth column), because this machine wrote much or because the host's disk
is busy with others. A sampler in a process of its own reads /proc/stat and the statistics
of the disk that holds the temporary directory (/sys/dev/block/M:m/stat) every SAMPLE_S
seconds and notes time.monotonic() (the clock every process here shares). ``HostStalls``
reads its lines and says, for a span of time, how much steal and I/O wait the kernel
counted, what this machine read and wrote on that disk and how long its requests took, and
whether the sampler itself went unscheduled for long (a gap: a pause of the guest, or a
machine too loaded to run it).

    python bench/host_stalls.py            # the sampler: one line per sample, until killed
"""
from __future__ import annotations

import bisect
import os
import subprocess
import sys
import tempfile
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


#: fields of a block device's stat file kept (0-based): sectors read, write requests,
#: sectors written, ms writing (summed over requests), ms the device was busy, ms
#: discarding, flushes and ms flushing (Documentation/block/stat.rst)
DISK_FIELDS = (2, 4, 6, 7, 9, 14, 15, 16)


def _disk_stat_path(path: str) -> str | None:
    dev = os.stat(path).st_dev
    stat = f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/stat"
    return stat if os.path.exists(stat) else None


def _disk(stat: str | None) -> list[int]:
    if stat is None:
        return [0] * len(DISK_FIELDS)
    with open(stat, "rb") as f:
        fields = f.read().split()
    return [int(fields[i]) if i < len(fields) else 0 for i in DISK_FIELDS]


def sample_forever() -> None:
    stat = _disk_stat_path(tempfile.gettempdir())
    while True:
        steal, iowait = _cpu_line()
        disk = " ".join(map(str, _disk(stat)))
        sys.stdout.write(f"{time.monotonic():.4f} {steal} {iowait} {disk}\n")
        sys.stdout.flush()
        time.sleep(SAMPLE_S)


class HostStalls:
    """The sampler's child process and its samples: (t, steal ticks, iowait ticks)."""

    def __init__(self) -> None:
        self.t: list[float] = []
        self.steal: list[int] = []
        self.iowait: list[int] = []
        self.disk: list[list[int]] = []     # DISK_FIELDS per sample
        self._lock = threading.Lock()
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__)],
                                     stdout=subprocess.PIPE, text=True)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            t, steal, iowait, *disk = line.split()
            with self._lock:
                self.t.append(float(t))
                self.steal.append(int(steal))
                self.iowait.append(int(iowait))
                self.disk.append([int(x) for x in disk])

    def _span(self, a: float, b: float) -> tuple[int, int]:
        """The samples (i, j) around [a, b]: the last at or before `a`, the first at or after
        `b` (j <= i: none between), with the lock held."""
        i = max(0, bisect.bisect_right(self.t, a) - 1)
        j = min(len(self.t) - 1, bisect.bisect_left(self.t, b))
        return i, j

    def _between(self, column: list[int], a: float, b: float) -> float:
        """The ticks of `column` counted over [a, b] (``_span``), in ms (all CPUs)."""
        with self._lock:
            i, j = self._span(a, b)
            return (column[j] - column[i]) * TICK_MS if j > i else 0.0

    def disk_between(self, a: float, b: float) -> dict[str, float]:
        """What the disk did over [a, b] (``_span``): MB read and written, write requests and
        their mean time, the ms it was busy and discarding, flushes and their mean time."""
        with self._lock:
            i, j = self._span(a, b)
            if j <= i or not self.disk[i] or not self.disk[j]:
                return {}
            d = [y - x for x, y in zip(self.disk[i], self.disk[j])]
        rd, writes, wr, write_ms, busy, discard_ms, flushes, flush_ms = d
        return {"read_mb": round(rd * 512 / 1e6, 1), "written_mb": round(wr * 512 / 1e6, 1),
                "writes": writes, "write_ms_mean": round(write_ms / writes, 1) if writes else 0,
                "busy_ms": busy, "discard_ms": discard_ms, "flushes": flushes,
                "flush_ms_mean": round(flush_ms / flushes, 1) if flushes else 0}

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

"""Smoke test of bench/cluster_bench.py --quick: it starts its own 3-process cluster, runs tiny
sizes, exits 0 and prints the table and the JSON line. No timing assertions."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from procgroup import run_in_group

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.cluster

LATENCY_OPS = ["produce", "consume", "lock acquire+release", "counter add"]


def test_cluster_bench_quick(tmp_path: Path) -> None:
    out_json = tmp_path / "bench.json"
    out = run_in_group(
        [sys.executable, str(ROOT / "bench" / "cluster_bench.py"), "--quick",
         "--json", str(out_json)],
        timeout=180, cwd=ROOT)
    assert out.returncode == 0, f"stdout:\n{out.stdout}\nstderr:\n{out.stderr}"
    lines = out.stdout.splitlines()
    table = [ln for ln in lines if ln.startswith("|")]
    assert table and table[0].startswith("| measurement"), out.stdout
    names = [ln.split("|")[1].strip() for ln in table[2:]]
    expected = [f"latency {op} (via {via})" for via in ("leader", "follower")
                for op in LATENCY_OPS]
    expected += [f"throughput {op}, {n} client{'s' if n > 1 else ''}"
                 for n in (1, 2) for op in ("produce", "consume")]
    assert names == expected, names
    for ln in table[2:]:
        assert "errors" not in ln and "STUCK" not in ln, ln

    result = json.loads(lines[-1])
    assert json.loads(out_json.read_text()) == result
    assert result["facts"]["fsync"] == "on"
    assert result["facts"]["cores"] >= 1 and result["facts"]["python"]
    rows = result["rows"]
    assert len(rows) == len(expected)
    for r in rows:
        assert r["n"] > 0 and r.get("errors", 0) == 0, r
    tp = [r for r in rows if r["kind"] == "throughput"]
    assert [(r["op"], r["clients"]) for r in tp] == [
        ("produce", 1), ("consume", 1), ("produce", 2), ("consume", 2)]
    assert all(r["ops"] == r["n"] > 0 and r["stuck_clients"] == 0 for r in tp), tp


def test_aio_bench_small() -> None:
    out = run_in_group([sys.executable, str(ROOT / "bench" / "aio_bench.py"), "--n", "200"],
                       timeout=180, cwd=ROOT)
    assert out.returncode == 0, f"stdout:\n{out.stdout}\nstderr:\n{out.stderr}"
    figures = dict(line.split(None, 1) for line in out.stdout.splitlines() if line.strip())
    assert figures["lost"] == "0" and figures["wrong"] == "0" and figures["n"] == "200"
    assert float(figures["rss_mb_blocked"]) > 0


def test_cancel_bench_small() -> None:
    """bench/cancel_bench.py: a killed client's 300 waits are all withdrawn, in fewer log
    entries than waits, and the other client's session is kept."""
    out = run_in_group([sys.executable, str(ROOT / "bench" / "cancel_bench.py"),
                        "--waiters", "300", "--limit", "120"],
                       timeout=300, cwd=ROOT)
    assert out.returncode == 0, f"stdout:\n{out.stdout}\nstderr:\n{out.stderr}"
    line = [x for x in out.stdout.splitlines() if x.startswith("withdrawn after")]
    assert line and line[0].endswith("kept"), out.stdout
    entries = int(line[0].split(" in ")[1].split()[0])
    assert 0 < entries < 300, line[0]


def test_mirror_bench_quick(tmp_path: Path) -> None:
    """bench/mirror_bench.py --quick: the reads through the cluster and of a mirror, the
    mirror's lag, printed and in its JSON line."""
    out_json = tmp_path / "mirror.json"
    out = run_in_group([sys.executable, str(ROOT / "bench" / "mirror_bench.py"), "--quick",
                        "--json", str(out_json)], timeout=180, cwd=ROOT)
    assert out.returncode == 0, f"stdout:\n{out.stdout}\nstderr:\n{out.stderr}"
    lines = out.stdout.splitlines()
    assert lines[0].startswith("gesmas: mirror of 10 keys loaded in "), out.stdout
    assert lines[1].startswith("round 1: Map.get p50 "), out.stdout
    result = json.loads(lines[-1])
    assert json.loads(out_json.read_text()) == result
    g = result["results"]["gesmas"]
    assert g["rounds"][0]["get"]["p50_ms"] > 0 and g["rounds"][0]["mirror"]["p50_ms"] > 0
    assert g["mirror_reads_per_s_16_threads"] > 0 and g["lag"]["from_put_start_p50_ms"] > 0


def test_scale_bench_quick(tmp_path: Path) -> None:
    """bench/scale_bench.py --quick: every phase runs, the catch-up after a restart and after
    a wipe is measured, and the JSON holds what the table prints."""
    out_json = tmp_path / "scale.json"
    out = run_in_group(
        [sys.executable, str(ROOT / "bench" / "scale_bench.py"), "--quick",
         "--json", str(out_json)],
        timeout=300, cwd=ROOT)
    assert out.returncode == 0, f"stdout:\n{out.stdout}\nstderr:\n{out.stderr}"
    run = json.loads(out_json.read_text())["runs"][0]
    assert [p["phase"] for p in run["phases"]] == ["create", "idle", "waiters", "restart",
                                                   "wipe", "list"]
    create, _, waiters, restart, wipe, listing = run["phases"]
    assert create["objects"] == 1000 and len(create["rate_per_tenth"]) == 10
    assert waiters["waiters"] == 50
    assert restart["caught_up_seconds"] > 0 and wipe["caught_up_seconds"] > 0
    assert listing["listed"] >= 1000
    assert "| restart: caught up after, s |" in out.stdout
    # the produce loop (a child process) was timed through every phase
    assert all(p["produce_calls"] > 0 and p["produce_max_ms"] > 0 for p in run["phases"]), \
        [(p["phase"], p["produce_calls"]) for p in run["phases"]]
    # the host's sampler ran through every phase (steal may be 0 on a quiet host)
    assert all(p["host_steal_ms"] >= 0 and p["host_iowait_ms"] >= 0 and p["host_gaps"] >= 0
               for p in run["phases"])
    assert "host steal; I/O wait, ms" in out.stdout
    # a checkpoint's size is read once its capture has ended (it is 0 before)
    assert create["checkpoints"] > 0 and create["checkpoint_bytes"] > 0
    assert "| create: largest checkpoint, MB |" in out.stdout


def test_host_stalls_spans() -> None:
    """bench/host_stalls.py's arithmetic on given samples: steal between two times, the
    sampler's gaps, and which calls the host explains."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from host_stalls import GAP_S, TICK_MS, HostStalls
    finally:
        sys.path.remove(str(ROOT / "bench"))
    h = HostStalls.__new__(HostStalls)
    h._lock = __import__("threading").Lock()
    # samples every 0.05-0.2 s; 5 ticks of steal between 1.00 and 1.05; a 0.6 s gap after 1.3
    h.t = [1.0, 1.05, 1.1, 1.3, 1.9, 1.95]
    h.steal = [100, 105, 105, 105, 105, 105]
    h.iowait = [7, 7, 7, 7, 9, 9]
    assert h.steal_ms(1.0, 1.05) == 5 * TICK_MS
    assert h.steal_ms(1.06, 1.09) == 0            # no sample between: nothing counted
    # a sample interval that overlaps the span counts whole
    assert h.steal_ms(1.01, 1.2) == 5 * TICK_MS and h.steal_ms(1.05, 1.2) == 0
    assert h.iowait_ms(1.3, 1.9) == 2 * TICK_MS
    assert 1.9 - 1.3 > GAP_S and h.gaps(0, 10) == [(1.3, 1.9)]
    assert h.gaps(1.91, 10) == []
    assert h.explains(1.0, 50.0)                  # 50 ms of steal over the 20 ms default
    assert not h.explains(1.1, 50.0)              # no steal, no gap
    assert h.explains(1.5, 60.0)                  # inside the gap
    # the disk: fields as DISK_FIELDS (sectors read, writes, sectors written, ms writing,
    # ms busy, ms discarding, flushes, ms flushing); 2,048 sectors = 1.05 MB
    h.disk = [[0, 0, 0, 0, 0, 0, 0, 0]] * 3 + [[0, 4, 2048, 40, 30, 0, 2, 6]] * 3
    assert h.disk_between(1.05, 1.3) == {
        "read_mb": 0.0, "written_mb": 1.0, "writes": 4, "write_ms_mean": 10.0, "busy_ms": 30,
        "discard_ms": 0, "flushes": 2, "flush_ms_mean": 3.0}
    assert h.disk_between(1.3, 1.9)["written_mb"] == 0.0 and h.disk_between(5, 6) == {}


def test_capture_slices_quick() -> None:
    """bench/capture_slices.py --quick --restore: every round's capture ends with a blob,
    and each round prints its entry, its slices and its collector passes; so does the first
    capture of a kernel restored after them."""
    out = run_in_group([sys.executable, str(ROOT / "bench" / "capture_slices.py"), "--quick",
                        "--restore"], timeout=120, cwd=ROOT)
    assert out.returncode == 0, f"stdout:\n{out.stdout}\nstderr:\n{out.stderr}"
    rounds = [ln for ln in out.stdout.splitlines() if ln.startswith("round ")]
    assert len(rounds) == 2, out.stdout
    restored = [ln for ln in out.stdout.splitlines() if ln.startswith("the first capture")]
    assert len(restored) == 1 and "restored from" in out.stdout, out.stdout
    for ln in rounds + restored:
        assert "slices, longest" in ln and "longest collection" in ln, ln
        assert int(ln.rsplit("blob ", 1)[1].split()[0]) > 0, ln


def test_dict_resize_bench_small() -> None:
    """bench/dict_resize_bench.py: a row per table, each with its longest insert, where it
    was (one of the inserts made) and the total; then a row per table with its lookups and
    its bytes a key."""
    out = run_in_group([sys.executable, str(ROOT / "bench" / "dict_resize_bench.py"),
                        "--objects", "3000", "--runs", "2"], timeout=120, cwd=ROOT)
    assert out.returncode == 0, f"stdout:\n{out.stdout}\nstderr:\n{out.stderr}"
    rows = [ln for ln in out.stdout.splitlines() if ln.startswith("  ") and " longest " in ln]
    assert [r.split(" longest ")[0].strip() for r in rows] == [
        "dict (one, as the tables were)", "EpochDict", "ObjectTable (objects by name)",
        "FrameTable (frames, and its page index)"], out.stdout
    for r in rows:
        spots = [int(x) for x in re.findall(r" at (\d+)", r)]
        assert len(spots) == 2 and all(1 <= x <= 3000 for x in spots), r
        assert r.rstrip().endswith(" s") and "total" in r, r
    costs = [ln for ln in out.stdout.splitlines() if ln.startswith("  ") and " held " in ln]
    assert [r.split(" held ")[0].strip() for r in costs] == [
        r.split(" longest ")[0].strip() for r in rows], out.stdout
    for r in costs:
        held, absent, size = (float(x) for x in re.findall(r"([\d.]+) (?:us|bytes)", r))
        assert held > 0 and absent > 0 and size > 8, r


def test_writeback_bench_install(tmp_path: Path) -> None:
    """bench/writeback_bench.py --install: a row per install each way, and nothing left in
    its directory (the journal, the snapshot, its spare and its .tmp removed)."""
    out = run_in_group([sys.executable, str(ROOT / "bench" / "writeback_bench.py"),
                        "--install", "--mb", "2", "--runs", "1", "--dir", str(tmp_path)],
                       timeout=120, cwd=ROOT)
    assert out.returncode == 0, f"stdout:\n{out.stdout}\nstderr:\n{out.stderr}"
    rows = [ln.split("|")[1:-1] for ln in out.stdout.splitlines() if ln.startswith("| ")]
    assert [r[0].strip() for r in rows[1:]] == ["fresh", "over"], out.stdout
    for r in rows[1:]:
        n, p50, longest = (float(x) for x in r[2].split(","))
        assert n > 0 and 0 < p50 <= longest and int(r[3]) >= 0, r
    assert list(tmp_path.iterdir()) == []

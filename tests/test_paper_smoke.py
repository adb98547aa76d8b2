"""Smoke test of bench/paper.py --quick --systems gesmas: it starts its own 3-process gesmas
cluster, runs every experiment at tiny sizes (no ZooKeeper needed), exits 0 and prints the
table; the JSON and the plots are written under --out. No timing assertions."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from procgroup import run_in_group

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.cluster


def test_paper_quick_gesmas_only(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = run_in_group(
        [sys.executable, str(ROOT / "bench" / "paper.py"), "--quick", "--systems", "gesmas",
         "--out", str(tmp_path)],
        timeout=150, cwd=ROOT)
    assert out.returncode == 0, f"stdout:\n{out.stdout}\nstderr:\n{out.stderr}"
    table = [ln for ln in out.stdout.splitlines() if ln.startswith("|")]
    assert table and table[0].startswith("| measurement | better | gesmas | zookeeper"), out.stdout
    names = [ln.split("|")[1].strip() for ln in table[2:]]
    expected = [
        "produce ops/s, 1 client", "produce ops/s, 2 clients",
        "consume mean ms @ length 10", "consume p50 ms @ length 10",
        "consume p50 ms @ length 10, ZooKeeper: paper's recipe",
        "mixed 2P+2C produced/s", "mixed 2P+2C consumed/s",
        "mixed 2P+2C produced+consumed/s",
        "herd N=3: s until all released",
        "barrier 3 parties x 2 rounds: s",
        "lock hand-offs/s, 1 client", "lock hand-offs/s, 2 clients",
    ] + [f"{op} {q} ms (1 client)" for op in ("produce", "consume", "lock acquire+release")
         for q in ("p50", "p99")]
    assert names == expected, names
    for ln in table[2:]:
        cells = [c.strip() for c in ln.split("|")[1:-1]]
        assert cells[2] != "—", ln                         # gesmas measured
        assert cells[3] == "—", ln                         # zookeeper not run
        assert "infeasible" not in ln and "VIOLATED" not in ln and "reached" not in ln, ln

    doc = json.loads((tmp_path / "paper.json").read_text())
    assert list(doc["results"]) == ["gesmas"]
    g = doc["results"]["gesmas"]
    assert not [e for e, v in g.items() if "failed" in v], g
    assert all(r["n_errors"] == 0 for r in g["lock"].values()), g["lock"]
    assert all(r["mutual_exclusion"] == "ok" for r in g["lock"].values()), g["lock"]
    assert all(r["released"] == r["n"] for r in g["herd"].values()), g["herd"]
    assert all(r["finished"] == r["parties"] for r in g["barrier"].values()), g["barrier"]
    for name in ("paper_consume_latency.png", "paper_herd.png", "paper_barrier.png"):
        assert (tmp_path / name).stat().st_size > 1000, name


def test_paper_reads_and_map_quick_gesmas_only(tmp_path: Path) -> None:
    """--only reads,map --quick --systems gesmas (one cluster for both): one repetition of
    every point at tiny sizes; issue 24's table with gesmas measured and the other columns
    empty, and no log entry while only reads ran (the leader's commit index, before and
    after each point); issue 27's map table: gets, puts, and watch fan-outs in which every
    watcher was notified of every change."""
    out = run_in_group(
        [sys.executable, str(ROOT / "bench" / "paper.py"), "--quick", "--only", "reads,map",
         "--systems", "gesmas", "--out", str(tmp_path)],
        timeout=200, cwd=ROOT)
    assert out.returncode == 0, f"stdout:\n{out.stdout}\nstderr:\n{out.stderr}"
    reads_out, _, map_out = out.stdout.partition("Map (issue 27)")
    assert map_out, out.stdout
    _check_map(map_out, json.loads((tmp_path / "paper.json").read_text()))
    table = [ln for ln in reads_out.splitlines() if ln.startswith("|")]
    assert table and table[0] == "| figure | ZooKeeper | etcd | gesmas | gesmas vs the best |", \
        out.stdout
    names = [ln.split("|")[1].strip() for ln in table[2:]]
    assert names == [
        f"read p50 ms, 1 client on {w}, {m}" for m in ("linearizable", "cheapest")
        for w in ("the leader", "a follower")] + [
        f"reads/s, 1 client on {w}, {m}" for m in ("linearizable", "cheapest")
        for w in ("the leader", "a follower")] + [
        "reads/s, 3 clients over 3 replicas, linearizable",
        "reads/s, 3 clients over 3 replicas, cheapest",
        "95/5 mix ops/s, 3 clients, linearizable reads",
        "95/5 mix ops/s, 3 clients, cheapest reads",
        "95/5 mix: write p50 ms, 3 clients, linearizable reads",
        "log entries during the read-only loads (leader's index before and after)",
        "log entries during the 95/5 mixes"], names
    for ln in table[2:-2]:
        cells = [c.strip() for c in ln.split("|")[1:-1]]
        assert cells[1] == "—" and cells[2] == "—", ln     # ZooKeeper, etcd not run
        assert cells[3] != "—", ln                         # gesmas measured
    assert "| log entries during the read-only loads" in table[-2] and \
        table[-2].split("|")[4].strip().startswith("0 in "), table[-2]

    doc = json.loads((tmp_path / "paper.json").read_text())
    assert list(doc["results"]) == ["gesmas"]
    recs = doc["results"]["gesmas"]["reads"]
    assert "failed" not in recs, recs
    assert len(recs) == 8, sorted(recs)        # 4 points x 2 consistencies, 1 repetition
    for key, rec in recs.items():
        assert rec["n_errors"] == 0 and "infeasible" not in rec, (key, rec)
        assert rec["reads"] > 0, (key, rec)
        if rec["point"] != "mix":
            assert rec["log_entries"] == 0 and rec["writes"] == 0, (key, rec)
    assert "a read-only load adds no log entry (gesmas): **met**" in out.stdout, out.stdout


def _check_map(text: str, doc: dict) -> None:
    table = [ln for ln in text.splitlines() if ln.startswith("|")]
    assert table[0] == "| figure | ZooKeeper | etcd | gesmas | gesmas vs the best |", text
    names = [ln.split("|")[1].strip() for ln in table[2:]]
    gets = [f"{figure}, 1 client, {mode}" for mode in ("linearizable", "cheapest")
            for figure in ("get p50 ms", "gets/s")]
    assert names[:6] == gets + ["put p50 ms, 1 client", "puts/s, 1 client"], names
    assert names[-5:] == [
        "3 watchers of one key: ms from the put to the last notified",
        "3 watchers of one key: server CPU ms per change",
        "3 watchers of 3 keys: ms from a put to its watcher (p50)",
        "3 watchers of 3 keys: ms from a round's first put to the last notified",
        "3 watchers of 3 keys: server CPU ms per change"], names
    for ln in table[2:]:
        cells = [c.strip() for c in ln.split("|")[1:-1]]
        assert cells[1] == "—" and cells[2] == "—" and cells[3] != "—", ln
    recs = doc["results"]["gesmas"]["map"]
    assert "failed" not in recs and len(recs) == 5, sorted(recs)
    for point, rec in recs.items():
        assert rec["n_errors"] == 0 and "infeasible" not in rec, (point, rec)
        if point.startswith("fan|"):
            assert rec["notified"] == rec["watchers"] * rec["rounds"], (point, rec)
        else:
            assert rec["ops"] > 0, (point, rec)
    assert "Map targets (issue 27):" in text

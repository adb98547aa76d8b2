"""bench/paper.py's report: the table, the targets, the plots and docs/benchmarks.md."""
from __future__ import annotations

import datetime as dt
import os
import platform
import shutil
import subprocess
from typing import Any


from paper_common import PAPER_SYSTEMS as SYSTEMS, ROOT, ROUTE_ENV

# -- report ------------------------------------------------------------------------------------

def _get(res: dict[str, Any], *path: str) -> Any:
    cur: Any = res
    for k in path:
        if not isinstance(cur, dict) or k not in cur:
            return None
        cur = cur[k]
    return cur


def metric_rows(results: dict[str, Any], cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """(experiment, metric, direction, per-system value and note)."""
    rows: list[dict[str, Any]] = []

    def add(exp: str, metric: str, higher: bool, path: tuple[str, ...], fmt: str,
            note_path: tuple[str, ...] | None = None) -> None:
        vals, notes = {}, {}
        for s in SYSTEMS:
            if exp not in results.get(s, {}):
                continue
            v = _get(results[s], exp, *path)
            vals[s] = v
            if note_path is not None:
                nt = _get(results[s], exp, *note_path)
                if nt:
                    notes[s] = nt
        if vals:
            rows.append({"experiment": exp, "metric": metric, "higher_is_better": higher,
                         "values": vals, "fmt": fmt, "notes": notes})

    for n in cfg["produce_clients"]:
        add("produce", f"produce ops/s, {n} client{'s' if n > 1 else ''}", True,
            (str(n), "ops_per_s"), ",.0f")
    for L in cfg["consume_lengths"]:
        add("consume", f"consume mean ms @ length {L:,}", False, (str(L), "mean_ms"), ".2f",
            (str(L), "infeasible"))
        add("consume", f"consume p50 ms @ length {L:,}", False, (str(L), "p50_ms"), ".2f",
            (str(L), "infeasible"))
    for L in cfg["consume_lengths"]:
        add("consume", f"consume p50 ms @ length {L:,}, ZooKeeper: paper's recipe", False,
            (str(L), "paper", "p50_ms"), ".2f")
    if len(cfg["consume_lengths"]) > 1:
        mid = cfg["consume_lengths"][1]
        add("consume", f"consume ops/s (1 client) @ length {mid:,}", True,
            (str(mid), "ops_per_s"), ",.0f", (str(mid), "infeasible"))
        add("consume", f"consume ops/s (1 client) @ length {mid:,}, ZooKeeper: paper's "
            "recipe", True, (str(mid), "paper", "ops_per_s"), ",.0f")
    add("mixed", "mixed 2P+2C produced/s", True, ("produced_per_s",), ",.0f")
    add("mixed", "mixed 2P+2C consumed/s", True, ("consumed_per_s",), ",.0f")
    add("mixed", "mixed 2P+2C produced+consumed/s", True, ("total_per_s",), ",.0f")
    for n in cfg["herd_ns"]:
        add("herd", f"herd N={n}: s until all released", False, (str(n), "time_s"), ".3f",
            (str(n), "infeasible"))
    for c in cfg["barrier_parties"]:
        add("barrier", f"barrier {c} parties x {cfg['barrier_rounds']} rounds: s", False,
            (str(c), "time_s"), ".3f", (str(c), "infeasible"))
    for n in cfg["lock_clients"]:
        add("lock", f"lock hand-offs/s, {n} client{'s' if n > 1 else ''}", True,
            (str(n), "handoffs_per_s"), ",.0f", (str(n), "mutual_exclusion"))
    for op in ("produce", "consume", "lock acquire+release"):
        for q in ("p50", "p99"):
            add("latency", f"{op} {q} ms (1 client)", False, (op, f"{q}_ms"), ".2f")
    return rows


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and v == v else None


def _fmt(v: Any, fmt: str) -> str:
    x = _num(v)
    return "—" if x is None else format(x, fmt)


def render_table(rows: list[dict[str, Any]]) -> str:
    head = ["measurement", "better", "gesmas", "zookeeper", "gesmas/zk", "gesmas advantage"]
    lines = ["| " + " | ".join(head) + " |", "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        g, z = _num(r["values"].get("gesmas")), _num(r["values"].get("zookeeper"))
        ratio = g / z if g is not None and z else None
        adv = None if ratio is None or ratio == 0 else (ratio if r["higher_is_better"]
                                                       else 1 / ratio)
        cells = []
        for s in SYSTEMS:
            c = _fmt(r["values"].get(s), r["fmt"])
            if r["notes"].get(s) and r["notes"][s] != "ok":
                c += f" ({r['notes'][s]})"
            cells.append(c)
        lines.append(f"| {r['metric']} | {'higher' if r['higher_is_better'] else 'lower'} | "
                     f"{cells[0]} | {cells[1]} | {_fmt(ratio, '.3g')} | "
                     f"{_fmt(adv, '.2f')}{'×' if adv is not None else ''} |")
    return "\n".join(lines)


def targets(results: dict[str, Any], cfg: dict[str, Any]) -> list[str]:
    g, z = results.get("gesmas", {}), results.get("zookeeper", {})
    out = []

    def chk(name: str, ok: bool | None, detail: str) -> None:
        out.append(f"- {name}: **{'met' if ok else ('missed' if ok is not None else 'n/a')}**"
                   f" — {detail}")
    ns = cfg["herd_ns"]
    gh = [_num(_get(g, "herd", str(n), "time_s")) for n in ns]
    zh = _num(_get(z, "herd", str(ns[-1]), "time_s"))
    if gh[-1] and zh:
        f = zh / gh[-1]
        chk(f"herd N={ns[-1]} gesmas ≥10× faster", f >= 10, f"{f:.1f}× (gesmas {gh[-1]:.3f} s, "
            f"ZooKeeper {zh:.3f} s)")
    elif gh[-1]:
        zn = _get(z, "herd", str(ns[-1]), "infeasible")
        chk(f"herd N={ns[-1]} gesmas ≥10× faster", True if zn else None,
            f"gesmas {gh[-1]:.3f} s; ZooKeeper: {zn or 'not measured'}")
    if all(gh) and len(ns) > 1:
        per = [t / n * 1e3 for t, n in zip(gh, ns)]   # type: ignore[operator]
        growth = gh[-1] / gh[0]   # type: ignore[operator]
        chk("herd linear in N (gesmas)", growth <= 1.5 * ns[-1] / ns[0],
            f"time N={ns[-1]} / N={ns[0]} = {growth:.2f} for a {ns[-1] / ns[0]:.0f}× larger N; "
            f"ms per item: " + ", ".join(f"{p:.2f}" for p in per))
    Ls = cfg["consume_lengths"]
    g0, g1 = _num(_get(g, "consume", str(Ls[0]), "p50_ms")), \
        _num(_get(g, "consume", str(Ls[-1]), "p50_ms"))
    m0, m1 = _num(_get(g, "consume", str(Ls[0]), "mean_ms")), \
        _num(_get(g, "consume", str(Ls[-1]), "mean_ms"))
    if g0 and g1 and m0 and m1:
        chk(f"gesmas consume latency flat within 20% from {Ls[0]:,} to {Ls[-1]:,}",
            g1 / g0 <= 1.2 and m1 / m0 <= 1.2,
            f"p50 {g0:.2f} → {g1:.2f} ms ({(g1 / g0 - 1) * 100:+.0f}%), mean {m0:.2f} → "
            f"{m1:.2f} ms ({(m1 / m0 - 1) * 100:+.0f}%)")
    # consume: against ZooKeeper's faster recipe at each length (LockingQueue or the paper's)
    for L, want in zip(Ls[:2], (1.0, 5.0)):
        gr = _num(_get(g, "consume", str(L), "ops_per_s"))
        zr = max([x for x in (_num(_get(z, "consume", str(L), "ops_per_s")),
                              _num(_get(z, "consume", str(L), "paper", "ops_per_s"))) if x]
                 or [0.0])
        if gr and zr:
            chk(f"consume rate at {L:,} ≥{want:g}× ZooKeeper's faster recipe", gr / zr >= want,
                f"{gr / zr:.1f}× ({gr:.0f} vs {zr:.0f} consumes/s, one client)")
    c = cfg["barrier_parties"][-1]
    gb, zb = _num(_get(g, "barrier", str(c), "time_s")), _num(_get(z, "barrier", str(c), "time_s"))
    if gb and zb:
        chk(f"barrier {c} parties ≥5× faster", zb / gb >= 5,
            f"{zb / gb:.1f}× ({gb:.3f} vs {zb:.3f} s for {cfg['barrier_rounds']} rounds)")
    for n, want in ((cfg["lock_clients"][0], 1.0), (cfg["lock_clients"][-1], 2.0)):
        gl, zl = _num(_get(g, "lock", str(n), "handoffs_per_s")), \
            _num(_get(z, "lock", str(n), "handoffs_per_s"))
        if gl and zl:
            chk(f"lock hand-offs at {n} client{'s' if n > 1 else ''} ≥{want:g}× ZooKeeper",
                gl / zl >= want, f"{gl / zl:.2f}× ({gl:.0f} vs {zl:.0f} hand-offs/s)")
    n = cfg["produce_clients"][-1]
    gp, zp = _num(_get(g, "produce", str(n), "ops_per_s")), \
        _num(_get(z, "produce", str(n), "ops_per_s"))
    if gp and zp:
        chk(f"produce throughput at {n} clients ≥1.5× ZooKeeper", gp >= 1.5 * zp,
            f"{gp / zp:.2f}× ({gp:.0f} vs {zp:.0f} ops/s)")
    gm, zm = _num(_get(g, "mixed", "total_per_s")), _num(_get(z, "mixed", "total_per_s"))
    if gm and zm:
        chk("mixed 2P+2C items produced and consumed per second ≥1.5× ZooKeeper",
            gm >= 1.5 * zm, f"{gm / zm:.2f}× ({gm:.0f} vs {zm:.0f} items/s)")
    for op in ("produce", "lock acquire+release"):
        gq, zq = _num(_get(g, "latency", op, "p50_ms")), _num(_get(z, "latency", op, "p50_ms"))
        if gq and zq:
            chk(f"{op} p50 latency ≤ ZooKeeper's", gq <= zq,
                f"{gq:.2f} vs {zq:.2f} ms ({zq / gq:.2f}×)")
    return out


def plots(results: dict[str, Any], cfg: dict[str, Any], out_dir: str) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    files = []
    specs = [
        ("consume", "paper_consume_latency.png", cfg["consume_lengths"], "mean_ms",
         "queue length", "consume latency, mean ms", True,
         "Consume latency vs queue length (1 consumer)"),
        ("herd", "paper_herd.png", cfg["herd_ns"], "time_s", "N blocked consumers",
         "s until all N released", False, "Herd: N waiters, N items produced"),
        ("barrier", "paper_barrier.png", cfg["barrier_parties"], "time_s", "parties",
         f"s for {cfg['barrier_rounds']} consecutive barriers", False, "Barrier"),
    ]
    for exp, fname, xs, key, xl, yl, logx, title in specs:
        if not any(exp in results.get(s, {}) for s in SYSTEMS):
            continue
        fig, ax = plt.subplots(figsize=(5.5, 3.8), dpi=100)
        for s, mk in zip(SYSTEMS, ("o-", "s--")):
            pts = [(x, _num(_get(results.get(s, {}), exp, str(x), key))) for x in xs]
            pts = [(x, y) for x, y in pts if y is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], mk, label=s)
        if logx:
            ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(xl)
        ax.set_ylabel(yl)
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = os.path.join(out_dir, fname)
        fig.savefig(path)
        plt.close(fig)
        files.append(path)
    return files


def git_commit() -> str:
    try:
        h = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                           capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=ROOT, capture_output=True, text=True, timeout=10).stdout
        return h + (" (with uncommitted changes)" if dirty.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def facts(systems: list[str]) -> dict[str, Any]:
    f: dict[str, Any] = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "cores": os.cpu_count(), "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(), "platform": platform.platform(),
        "gesmas_commit": git_commit(),
        "gesmas_secure": os.environ.get("GESMAS_TEST_SECURE") == "1",
    }
    if "etcd" in systems:
        import etcd_cluster
        import grpc
        f["etcd"] = etcd_cluster.version()
        f["grpcio"] = grpc.__version__
    if "zookeeper" in systems:
        import kazoo
        import zk
        f["zookeeper"] = zk.version()
        f["java"] = zk.java_version()
        f["kazoo"] = getattr(kazoo, "__version__", None) or _dist_version("kazoo")
    return f


def _dist_version(name: str) -> str:
    from importlib.metadata import version
    try:
        return version(name)
    except Exception:  # noqa: BLE001
        return "unknown"


def write_docs(command: str, fa: dict[str, Any], table: str, tg: list[str],
               pngs: list[str]) -> str:
    docs = os.path.join(ROOT, "docs")
    os.makedirs(docs, exist_ok=True)
    for p in pngs:
        shutil.copy(p, os.path.join(docs, os.path.basename(p)))
    imgs = "\n".join(f"![{os.path.basename(p)}]({os.path.basename(p)})" for p in pngs)
    text = f"""# Benchmarks: gesmas vs ZooKeeper (the GESMAS paper's experiments)

Generated by `bench/paper.py` (the harness; `bench/zk.py` starts the ZooKeeper ensemble).

- Date: {fa['date']}
- Machine: {fa['cores']} cores, load average {fa['loadavg_at_start']} at start →
  {fa.get('loadavg_at_end')} at end (**other work was running on the machine**; the client
  processes, the 3 gesmas replicas and the 3 ZooKeeper JVMs all share these cores)
- {fa['platform']}, Python {fa['python']}
- ZooKeeper {fa.get('zookeeper', '—')} (Debian package; {fa.get('java', '')}), kazoo
  {fa.get('kazoo', '—')}
- gesmas commit {fa['gesmas_commit']}
- Total run time: {fa.get('total_s')} s

Command:

```sh
{command}
```

## Setup

- **gesmas**: 3 replicas via `LocalCluster` on 127.0.0.1, fsync of the Raft journal on. Each
  client is its own `Client` (own session) with `route="{os.environ.get(ROUTE_ENV, 'leader')}"`;
  client *i* opens its session at replica *i* mod 3 (with `route="leader"` its calls then go
  to the leader).
- **ZooKeeper**: 3 JVMs (`QuorumPeerMain`, `-Xmx256m`) on 127.0.0.1 with durable defaults
  (`forceSync=yes`; only the AdminServer is off, four-letter words `srvr,mntr,ruok` allowed and
  `maxClientCnxns=0`). Each client is its own `KazooClient`; client *i* connects to server
  *i* mod 3 first.
- Recipes: queue = kazoo `LockingQueue` (`put`; `get(timeout)` + `consume()` — every `get`
  lists and sorts the entries and the taken nodes and watches the parent); lock = kazoo `Lock`;
  barrier = kazoo `DoubleBarrier(c).enter()` on a fresh path per round (kazoo's `Barrier` is a
  gate opened by a third party, not a rendezvous of c parties); gesmas uses `Queue`, `Lock` and
  one cyclic `Barrier(c)`.
- Clients are threads in spawned worker processes, so the Python client side is part of every
  figure, for both systems alike.
- Both clusters run for the whole session and the systems take turns: each point (an
  experiment at one size) is measured on one system and right after on the other, the first
  one alternating from point to point, so that a change in the host's load between points
  does not fall on one system only.
- Consume latency: one queue per length, each pre-filled (gesmas: 32 producing clients;
  ZooKeeper: `create_async` with 1000 creates in flight); after a 10 s pause for the fills'
  after-effects (snapshots, checkpoints, the kernel writing back the fills' dirty pages), one
  client times 300 consumes per length, taking them round-robin (one from each queue in
  turn), so that load from elsewhere on the host weighs on every length alike.
- Herd: N clients block in `consume`, then one producer produces N items; time from the first
  produce to the last consumer released (includes the N sequential produces).
- Lock: clients loop acquire/release for a fixed time; every holding interval is logged with
  CLOCK_MONOTONIC (system wide) and checked afterwards for overlaps ("ok" in the table); the
  gesmas fences are also checked to increase.

## Results

"gesmas/zk" is the plain ratio of the two values; "better" says which direction is better for
that row; "gesmas advantage" is how many times better gesmas is (>1: gesmas better, <1:
ZooKeeper better).

{table}

## Targets

{chr(10).join(tg)}

Where the time goes on the gesmas side, and what was changed because of it:
[performance.md](performance.md).

## Plots

{imgs}
"""
    path = os.path.join(docs, "benchmarks.md")
    if os.path.exists(path):          # keep the reads section of an earlier --only reads run
        with open(path, encoding="utf-8") as f:       # and what follows it (notes by hand)
            old = f.read()
        b = old.find(READS_BEGIN)
        if b >= 0:
            text = text.rstrip("\n") + "\n\n" + old[b:].rstrip("\n") + "\n"
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


# -- main --------------------------------------------------------------------------------------



# -- the reads experiment (issue 24) -----------------------------------------------------------

READ_SYSTEMS = ["zookeeper", "etcd"]          # the columns next to gesmas
READ_MODE_NOTE = {
    "linearizable": "ZooKeeper sync + getData; etcd Range; gesmas Counter.get, linearizable",
    "cheapest": "ZooKeeper getData; etcd serializable Range; gesmas Counter.get, sequential",
}


def _median(xs: list[float]) -> float | None:
    xs = sorted(xs)
    if not xs:
        return None
    m = len(xs) // 2
    return xs[m] if len(xs) % 2 else (xs[m - 1] + xs[m]) / 2


def read_values(results: dict[str, Any], system: str, point: str, mode: str,
                field: str) -> list[float]:
    """The repetitions' values of one figure (measured points only)."""
    out = []
    for rec in (results.get(system, {}).get("reads") or {}).values():
        if not isinstance(rec, dict) or rec.get("point") != point or rec.get("mode") != mode:
            continue
        v = _num(_get(rec, *field.split(".")))
        if v is not None and "infeasible" not in rec:
            out.append(v)
    return out


def read_figure(results: dict[str, Any], system: str, point: str, mode: str,
                field: str) -> tuple[float | None, float | None, float | None, int]:
    """(median, min, max, n) over the repetitions."""
    xs = read_values(results, system, point, mode, field)
    return (_median(xs), min(xs) if xs else None, max(xs) if xs else None, len(xs))


READ_ROWS = [
    # label, point, mode, field, higher is better, format
    ("read p50 ms, 1 client on the leader, linearizable", "1@leader", "linearizable",
     "p50_ms", False, ".2f"),
    ("read p50 ms, 1 client on a follower, linearizable", "1@follower", "linearizable",
     "p50_ms", False, ".2f"),
    ("read p50 ms, 1 client on the leader, cheapest", "1@leader", "cheapest", "p50_ms", False,
     ".2f"),
    ("read p50 ms, 1 client on a follower, cheapest", "1@follower", "cheapest", "p50_ms",
     False, ".2f"),
    ("reads/s, 1 client on the leader, linearizable", "1@leader", "linearizable",
     "ops_per_s", True, ",.0f"),
    ("reads/s, 1 client on a follower, linearizable", "1@follower", "linearizable",
     "ops_per_s", True, ",.0f"),
    ("reads/s, 1 client on the leader, cheapest", "1@leader", "cheapest", "ops_per_s", True,
     ",.0f"),
    ("reads/s, 1 client on a follower, cheapest", "1@follower", "cheapest", "ops_per_s", True,
     ",.0f"),
    ("reads/s, {n} clients over 3 replicas, linearizable", "16", "linearizable", "ops_per_s",
     True, ",.0f"),
    ("reads/s, {n} clients over 3 replicas, cheapest", "16", "cheapest", "ops_per_s", True,
     ",.0f"),
    ("95/5 mix ops/s, {n} clients, linearizable reads", "mix", "linearizable", "ops_per_s",
     True, ",.0f"),
    ("95/5 mix ops/s, {n} clients, cheapest reads", "mix", "cheapest", "ops_per_s", True,
     ",.0f"),
    ("95/5 mix: write p50 ms, {n} clients, linearizable reads", "mix", "linearizable",
     "write.p50_ms", False, ".2f"),
]


def _cell(fig: tuple[float | None, float | None, float | None, int], fmt: str) -> str:
    med, lo, hi, n = fig
    if med is None:
        return "—"
    c = format(med, fmt)
    if n > 1 and lo is not None and hi is not None:
        c += f" ({format(lo, fmt)}–{format(hi, fmt)})"
    return c


def _vs_best(g: float | None, others: list[float | None], higher: bool) -> float | None:
    os_ = [x for x in others if x]
    if not g or not os_:
        return None
    return g / max(os_) if higher else min(os_) / g


def reads_table(results: dict[str, Any], cfg: dict[str, Any]) -> str:
    """Issue 24's table: one row per figure, median of the repetitions (min–max)."""
    n = cfg["reads_clients"]
    reps = cfg.get("reads_repeat", 1)
    lines = [f"Reads: median of {reps} run{'s' if reps > 1 else ''} (min–max). linearizable = "
             f"{READ_MODE_NOTE['linearizable']}; cheapest = {READ_MODE_NOTE['cheapest']}. "
             "\"gesmas vs the best\": how many times better gesmas is than the better of "
             "ZooKeeper and etcd (>1: gesmas better).", "",
             "| figure | ZooKeeper | etcd | gesmas | gesmas vs the best |",
             "|---|---:|---:|---:|---:|"]
    for label, point, mode, field, higher, fmt in READ_ROWS:
        figs = {s: read_figure(results, s, point, mode, field)
                for s in READ_SYSTEMS + ["gesmas"]}
        if all(f[0] is None for f in figs.values()):
            continue
        adv = _vs_best(figs["gesmas"][0], [figs[s][0] for s in READ_SYSTEMS], higher)
        lines.append(f"| {label.format(n=n)} | " + " | ".join(
            _cell(figs[s], fmt) for s in READ_SYSTEMS + ["gesmas"]) +
            f" | {'—' if adv is None else format(adv, '.2f') + '×'} |")
    # the log: entries added while only reads ran (the 1-client and 16-client points)
    cells = []
    for s in READ_SYSTEMS + ["gesmas"]:
        ent, reads, late = [], 0, 0
        for rec in (results.get(s, {}).get("reads") or {}).values():
            if isinstance(rec, dict) and rec.get("point") != "mix":
                late += bool(rec.get("log_late"))
                if rec.get("log_entries") is not None:
                    ent.append(rec["log_entries"])
                    reads += rec.get("reads", 0)
        cells.append(("—" if not ent else f"{sum(ent):,} in {reads:,} reads") +
                     (f" ({late} points not checked: index read too late)" if late else ""))
    lines.append("| log entries during the read-only loads (leader's index before and after) | "
                 + " | ".join(cells) + " | |")
    mixc = []
    for s in READ_SYSTEMS + ["gesmas"]:
        mix_ent, w = 0, 0
        seen = False
        for rec in (results.get(s, {}).get("reads") or {}).values():
            if isinstance(rec, dict) and rec.get("point") == "mix" and \
                    rec.get("log_entries") is not None:
                seen = True
                mix_ent += rec["log_entries"]
                w += rec.get("writes", 0)
        mixc.append("—" if not seen else f"{mix_ent:,} for {w:,} writes")
    lines.append("| log entries during the 95/5 mixes | " + " | ".join(mixc) + " | |")
    return "\n".join(lines)


def reads_targets(results: dict[str, Any], cfg: dict[str, Any]) -> list[str]:
    out = []

    def chk(name: str, ok: bool | None, detail: str) -> None:
        out.append(f"- {name}: **{'met' if ok else ('missed' if ok is not None else 'n/a')}**"
                   f" — {detail}")

    def med(s: str, point: str, mode: str, field: str) -> float | None:
        return read_figure(results, s, point, mode, field)[0]
    for point, where in (("1@leader", "on the leader"), ("1@follower", "on a follower")):
        g, e = med("gesmas", point, "linearizable", "p50_ms"), \
            med("etcd", point, "linearizable", "p50_ms")
        if g and e:
            chk(f"linearizable read p50 {where} ≤ etcd's linearizable Range", g <= e,
                f"{g:.2f} vs {e:.2f} ms ({e / g:.2f}×)")
        g, z = med("gesmas", point, "cheapest", "p50_ms"), \
            med("zookeeper", point, "cheapest", "p50_ms")
        if g and z:
            chk(f"sequential read p50 {where} ≤ ZooKeeper's getData", g <= z,
                f"{g:.2f} vs {z:.2f} ms ({z / g:.2f}×)")
    n = cfg["reads_clients"]
    for mode, want in (("cheapest", 2.0), ("linearizable", 1.0)):
        g = med("gesmas", "16", mode, "ops_per_s")
        best = max([x for x in (med(s, "16", mode, "ops_per_s") for s in READ_SYSTEMS) if x]
                   or [0.0])
        if g and best:
            chk(f"reads/s at {n} clients, {'sequential' if mode == 'cheapest' else mode}, ≥ "
                f"{want:g}× the best of ZooKeeper and etcd ({mode} reads)", g >= want * best,
                f"{g / best:.2f}× ({g:,.0f} vs {best:,.0f} reads/s)")
    for mode in ("cheapest", "linearizable"):
        g = med("gesmas", "mix", mode, "ops_per_s")
        best = max([x for x in (med(s, "mix", mode, "ops_per_s") for s in READ_SYSTEMS) if x]
                   or [0.0])
        if g and best:
            chk(f"95/5 mix at {n} clients ({mode} reads) ≥ the best of ZooKeeper and etcd",
                g >= best, f"{g / best:.2f}× ({g:,.0f} vs {best:,.0f} ops/s)")
    ent, reads = [], 0
    for rec in (results.get("gesmas", {}).get("reads") or {}).values():
        if isinstance(rec, dict) and rec.get("point") != "mix" and \
                rec.get("log_entries") is not None:
            ent.append(rec["log_entries"])
            reads += rec.get("reads", 0)
    if ent:
        chk("a read-only load adds no log entry (gesmas)", sum(ent) == 0,
            f"{sum(ent)} entries while {reads:,} reads were served, over {len(ent)} points")
    chk("writes no slower than today", None, "not measured by this experiment (the paper "
        "run's produce rows and bench/read_bench.py compare writes)")
    return out


READS_BEGIN = "<!-- reads: generated by bench/paper.py --only reads; begin -->"
READS_END = "<!-- reads: end -->"


def reads_section(command: str, fa: dict[str, Any], table: str, tg: list[str],
                  cfg: dict[str, Any]) -> str:
    n, reps = cfg["reads_clients"], cfg["reads_repeat"]
    return f"""{READS_BEGIN}
## Reads: gesmas vs ZooKeeper and etcd (issue 24)

- Date: {fa['date']}; total run time {fa.get('total_s')} s
- Machine: {fa['cores']} cores, load average {fa['loadavg_at_start']} at start →
  {fa.get('loadavg_at_end')} at end; the client processes and the 9 servers share these
  cores, and so does whatever else runs on the machine (not controlled by the benchmark)
- {fa['platform']}, Python {fa['python']}; gesmas commit {fa['gesmas_commit']}
- ZooKeeper {fa.get('zookeeper', '—')} ({fa.get('java', '')}), kazoo {fa.get('kazoo', '—')};
  etcd {fa.get('etcd', '—')} (Debian's etcd-server), grpcio {fa.get('grpcio', '—')}

Command:

```sh
{command}
```

Setup (`bench/paper.py`, experiment `reads`; `bench/etcd_cluster.py` starts etcd):

- Three clusters of 3 members on 127.0.0.1, all durable: gesmas (`LocalCluster`, fsync on),
  ZooKeeper (forceSync on, as above), etcd 3.4 (default: WAL fsync before acknowledging). All
  three stay up for the whole run.
- One key read over and over: gesmas `Counter.get` through the client library (a declared
  reader, `_readers` in objects/gesmas/objects/counter.py: served without a log entry), with
  `Client(..., consistency="sequential")` (cheapest) or the default `"linearizable"`, and
  `route="replica"` (calls stay on the replica the client was given); ZooKeeper `getData`
  (cheapest) or `sync` + `getData` (linearizable) through kazoo; etcd a serializable Range
  (cheapest) or a Range (linearizable, ReadIndex) through grpcio (bench/etcd_cluster.py says
  why no PyPI client). Writes of the mix: gesmas `Counter.add`, ZooKeeper `setData`, etcd
  `Put`, all of the key being read.
- Points: 1 client on the leader and 1 client on a follower, reads one after the other
  for {cfg['reads_seconds_1']:g} s (p50 and reads/s); {n} clients, client *i* on member
  *i* mod 3, for {cfg['reads_seconds']:g} s; the same {n} clients with a write instead of a
  read for {cfg['reads_write_frac']:.0%} of the operations (chosen at random, the same
  sequence for every system). Clients are threads in up to {cfg['procs']} spawned
  processes; each makes {cfg['reads_warmup']} reads before the timed window. A point is
  measured on each system one after the other, the first system rotating from point to
  point; the whole set of points is run {reps} time{'s' if reps > 1 else ''}, and the table
  gives the median and the range.
- Log entries: the leader's log index (gesmas Status `commit_index`, ZooKeeper `srvr` zxid,
  etcd Maintenance.Status `raftIndex`) read once every client of the point has connected
  and again right after the load ends, while the clients keep their sessions open for
  {cfg['reads_hold']:g} s more (opening and closing a session, and gesmas' CreateObject of
  a proxy, are log entries of their own, outside that window).

{table}

Targets (issue 24):

{chr(10).join(tg)}
{READS_END}"""


def _replace_reads_section(text: str, section: str) -> str:
    """text with its reads section replaced by `section` (appended when it had none)."""
    b, e = text.find(READS_BEGIN), text.find(READS_END)
    if b >= 0 and e > b:
        return text[:b] + section + text[e + len(READS_END):]
    return text.rstrip("\n") + "\n\n" + section + "\n"


def write_reads_docs(command: str, fa: dict[str, Any], table: str, tg: list[str],
                     cfg: dict[str, Any]) -> str:
    path = os.path.join(ROOT, "docs", "benchmarks.md")
    text = ""
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            text = f.read()
    with open(path, "w", encoding="utf-8") as f:
        f.write(_replace_reads_section(text, reads_section(command, fa, table, tg, cfg)))
    return path

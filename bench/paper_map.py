"""bench/paper.py's map experiment (--only map): a key-value store's reads, writes and watch
fan-out, gesmas' Map side by side with ZooKeeper (znodes, one-shot watches) and etcd (keys,
watch streams). Issue 27's figures.

Points (systems take turns point by point, as in the other experiments):
  kv|get-linearizable|n, kv|get-cheapest|n   n clients read one key for a bounded time:
      gesmas Map.get (a reader: no log entry; linearizable / sequential, route="replica"),
      ZooKeeper sync+getData / getData, etcd Range / serializable Range; p50, p99, gets/s.
  kv|put|n      n clients write one key: Map.put, setData, Put; p50, p99, puts/s.
  fan|popular|n n watchers (each its own session or channel, client i at replica i mod 3) on
      one key, one writer: per round one put; the time from the put to the LAST watcher
      notified. Watchers then watch again (gesmas: from the revision they got, so nothing
      is missed; ZooKeeper: a new one-shot watch; etcd: the stream goes on).
  fan|distinct|n n watchers on n keys (none a prefix of another), one writer: per round a
      put to each key in turn; the time from each put to its watcher, and from the round's
      first put to the last watcher notified.
  For both fan-out points: the servers' CPU time per change (utime + stime of the three
  server processes over the rounds, less their idle rate measured just before; the clients
  run elsewhere), i.e. the work a change costs the servers, waking and re-watching
  included. Clock ticks are 10 ms and the host is shared: small points are noisy.

gesmas watchers read one Map.watch_stream(key, revision) each (a followed call: the replica
answers it at each change, from a wait off the log that a put to its key wakes; followers
of one key at one revision share the run), with sequential reads on their own replica;
`--watch rearm` sends a Map.watch per change instead. ZooKeeper watchers use kazoo's
get(path, watch=...); etcd watchers one Watch stream each (bench/etcd_cluster.py).
"""
from __future__ import annotations

import os
import threading
import time
from typing import Any

from paper_common import OP_TIMEOUT, log, stats
from paper_conns import connect
from paper_workers import run_clients

FANOUT_MAP = "paper-fanout"         # gesmas: the fan-out's own Map (its history is its own)
KV_KEY = "paper-kv"
MODES = {"get-linearizable": "linearizable", "get-cheapest": "sequential"}
SYSTEMS = ["zookeeper", "etcd", "gesmas"]


def config(quick: bool) -> dict[str, Any]:
    # rounds: of one put (popular) or of a put to each of the n keys (distinct); settle:
    # seconds between rounds (every watcher notified and watching again); idle: seconds the
    # servers' idle CPU rate is measured for, before the rounds
    c: dict[str, Any] = ({"map_clients": [1], "map_seconds": 0.5, "map_warmup": 2,
                          "map_watchers": [3], "map_rounds": {"popular": 3, "distinct": 2},
                          "map_settle": 0.3, "map_idle": 0.3, "map_timeout": 30.0}
                         if quick else
                         {"map_clients": [1, 16], "map_seconds": 5.0, "map_warmup": 20,
                          "map_watchers": [10, 100],
                          "map_rounds": {"popular": 20, "distinct": 3},
                          "map_settle": 0.3, "map_idle": 2.0, "map_timeout": 60.0})
    c["map_points"] = [f"kv|{op}|{n}" for op in ("get-linearizable", "get-cheapest", "put")
                       for n in c["map_clients"]] + \
        [f"fan|{layout}|{n}" for layout in ("popular", "distinct") for n in c["map_watchers"]]
    return c


def exp_map(system: str, ep: list[str], cfg: dict[str, Any], cluster: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for point in cfg["map_points"]:
        kind, what, n = point.split("|")
        rec = (_kv(system, ep, cfg, what, int(n)) if kind == "kv" else
               _fanout(system, ep, cfg, what, int(n), cluster))
        out[point] = rec
        log(f"  [{system}] map {point}: " + ", ".join(
            f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in rec.items()
            if k in ("ops_per_s", "p50_ms", "last_ms", "each_p50_ms", "cpu_ms_per_change",
                     "infeasible")))
    return out


# -- reads and writes of one key ------------------------------------------------------------------

def _kv(system: str, ep: list[str], cfg: dict[str, Any], what: str, n: int) -> dict[str, Any]:
    opts: dict[str, Any] = {"kv": True}
    if what in MODES:
        opts["consistency"] = MODES[what]
        if system == "gesmas":
            opts["route"] = "replica"      # a read stays on the replica its client uses
    setup = connect(system, ep, 0, kv=True)
    try:                                   # the key exists before the clients read it
        (setup.setup_read if system == "zookeeper" else setup.write)(KV_KEY)
    finally:
        setup.close()
    seconds = cfg["map_seconds"]
    r = run_clients(system, ep, "write" if what == "put" else "read", ["client"] * n,
                    {"key": KV_KEY, "seconds": seconds, "conn": opts,
                     "warmup": cfg["map_warmup"], "limit": seconds + 2 * OP_TIMEOUT},
                    min(cfg["procs"], n))
    ops = sum(x["ops"] for x in r["slots"])
    el = max((x.get("end", 0) for x in r["slots"]), default=0) - r["start"]
    rec = {"clients": n, "ops": ops, "ops_per_s": ops / el if el > 0 else float("nan"),
           **stats([v for x in r["slots"] for v in x["lat"]]), "n_errors": len(r["errors"]),
           "errors": r["errors"][:5]}
    if r["errors"] or len(r["slots"]) < n:
        rec["infeasible"] = f"{len(r['errors'])} errors: {'; '.join(r['errors'][:2])}"
    return rec


# -- watch fan-out ------------------------------------------------------------------------------

def fan_keys(layout: str, n: int) -> list[str]:
    """The watched keys of a point: one for `popular`, n of one length (none a prefix of
    another: a gesmas watch is of a prefix) for `distinct`."""
    base = f"fan-{layout}-{n}/"
    return [base + "hot"] if layout == "popular" else [f"{base}{i:06d}" for i in range(n)]


def _fanout(system: str, ep: list[str], cfg: dict[str, Any], layout: str, n: int,
            cluster: Any) -> dict[str, Any]:
    keys = fan_keys(layout, n)
    rounds, settle, timeout = cfg["map_rounds"][layout], cfg["map_settle"], cfg["map_timeout"]
    writer = connect(system, ep, 0, kv=FANOUT_MAP)
    try:
        for k in keys:                      # ZooKeeper watches existing nodes: make them
            (writer.setup_read if system == "zookeeper" else writer.write)(k)

        def on_start(start: float) -> dict[str, Any]:
            time.sleep(max(0.0, start + settle - time.monotonic()))   # the watchers arm
            c0, t0 = server_cpu(cluster.pids()), time.monotonic()
            time.sleep(cfg["map_idle"])
            c1, t1 = server_cpu(cluster.pids()), time.monotonic()
            puts = []
            for r in range(rounds):
                row = []
                for k in keys:
                    row.append(time.monotonic())
                    writer.write(k, f"round-{r}".encode())
                puts.append(row)
                time.sleep(settle)          # every watcher notified and watching again
            c2, t2 = server_cpu(cluster.pids()), time.monotonic()
            idle = (c1 - c0) / (t1 - t0)
            return {"puts": puts, "cpu_s": (c2 - c1) - idle * (t2 - t1),
                    "idle_cpu_per_s": idle}
        r = run_clients(system, ep, "watch", ["watcher"] * n,
                        {"keys": keys, "rounds": rounds, "timeout": timeout, "seconds": 0.0,
                         "conn": _watch_conn(system), "watch": cfg.get("map_watch", "stream"),
                         "limit": settle * (rounds + 3) + cfg["map_idle"] + timeout +
                         2 * OP_TIMEOUT},
                        cfg["procs"], on_start=on_start)
    finally:
        writer.close()
    return fan_figures(layout, n, keys, r)


def fan_figures(layout: str, n: int, keys: list[str], r: dict[str, Any]) -> dict[str, Any]:
    """The figures of a fan-out point from the writer's put times and the watchers'
    notification times (one CLOCK_MONOTONIC across processes)."""
    extra = r.get("extra") or {}
    puts: list[list[float]] = extra.get("puts", [])
    rounds = len(puts)
    slots = r["slots"]
    each, last = [], []
    missing = 0
    for rnd in range(rounds):
        got = []
        for s in slots:
            times = s.get("notified", [])
            if rnd >= len(times):
                missing += 1
                continue
            put = puts[rnd][keys.index(s["key"])]
            each.append((times[rnd] - put) * 1e3)
            got.append(times[rnd])
        if got:
            last.append((max(got) - puts[rnd][0]) * 1e3)
    changes = rounds * len(keys)
    rec: dict[str, Any] = {
        "watchers": n, "keys": len(keys), "rounds": rounds, "changes": changes,
        "each_p50_ms": stats(each)["p50_ms"], "last_ms": stats(last)["p50_ms"],
        "last_max_ms": max(last) if last else float("nan"), "notified": len(each),
        "cpu_ms_per_change": (extra["cpu_s"] * 1e3 / changes
                              if changes and "cpu_s" in extra else float("nan")),
        "idle_cpu_per_s": extra.get("idle_cpu_per_s"), "n_errors": len(r["errors"]),
        "errors": r["errors"][:5]}
    if missing or r["errors"] or len(slots) < n or r.get("stuck"):
        rec["infeasible"] = (f"{missing} notifications missing, {len(r['errors'])} errors, "
                             f"{len(slots)} of {n} watchers reported: "
                             f"{'; '.join(r['errors'][:2])}")
    return rec


def _watch_conn(system: str) -> dict[str, Any]:
    if system == "gesmas":       # a wait off the log on the watcher's own replica
        return {"kv": FANOUT_MAP, "consistency": "sequential", "route": "replica"}
    return {"kv": True}


def server_cpu(pids: list[int]) -> float:
    """CPU seconds (user + system) the processes `pids` have used so far."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])      # utime, stime (fields 14, 15)
    return total / tick


# -- the watchers (in the worker processes: paper_workers' "watch" kind) ---------------------------

def watch_body(conn: Any, slot: dict[str, Any], p: dict[str, Any]) -> None:
    """One watcher: its key (one per watcher, or the one key), notified `rounds` times."""
    key = p["keys"][slot["idx"] % len(p["keys"])]
    slot["key"] = key
    w = {"gesmas": GesmasWatch, "zookeeper": ZkWatch, "etcd": EtcdWatch}[conn.name](
        conn, key, p["timeout"], *([p.get("watch", "stream")] if conn.name == "gesmas" else []))
    times: list[float] = []
    slot["notified"] = times
    try:
        for _ in range(p["rounds"]):
            times.append(w.next(p["timeout"]))
            slot["ops"] += 1
    finally:
        w.close()


class GesmasWatch:
    """The key's changes from the map's revision when the watcher starts (before the
    writer's first put): `stream` (the default) one Map.watch_stream, which the replica
    answers at each change; `rearm` a Map.watch per change, from the revision of the last
    answer (the client sends the next watch when it has the answer)."""

    def __init__(self, conn: Any, key: str, timeout: float, mode: str = "stream") -> None:
        self.m = conn.map()
        self.key = key
        self.rev = self.m.revision()
        self.stream = (self.m.watch_stream(key, self.rev, timeout=timeout)
                       if mode == "stream" else None)

    def next(self, timeout: float) -> float:
        if self.stream is not None:
            next(self.stream)
        else:
            got = self.m.watch(self.key, self.rev, timeout=timeout)
            self.rev = got["revision"]
        return time.monotonic()

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()


class ZkWatch:
    """A one-shot data watch (kazoo get(path, watch=...)), set again after each event."""

    def __init__(self, conn: Any, key: str, timeout: float) -> None:
        self.c = conn.c
        self.path = f"/paper/read/{key}"

    def next(self, timeout: float) -> float:
        fired = threading.Event()
        stamp: list[float] = []

        def on_event(event: Any) -> None:
            stamp.append(time.monotonic())
            fired.set()
        self.c.get(self.path, watch=on_event)
        if not fired.wait(timeout):
            raise TimeoutError(f"no ZooKeeper watch event on {self.path} in {timeout} s")
        return stamp[0]

    def close(self) -> None:
        pass


class EtcdWatch:
    """One Watch stream of the key, created from now (its first answer says so)."""

    def __init__(self, conn: Any, key: str, timeout: float) -> None:
        self.responses, self._close = conn.kv.watch(f"/paper/read/{key}".encode(),
                                                    deadline=timeout * 10)
        first = next(self.responses)
        if not first.created:
            raise RuntimeError(f"etcd watch of {key} not created: {first}")

    def next(self, timeout: float) -> float:
        for resp in self.responses:        # bounded by the stream's deadline
            if resp.canceled:
                raise RuntimeError(f"etcd watch canceled: {resp.cancel_reason}")
            if resp.events:
                return time.monotonic()
        raise RuntimeError("etcd watch stream ended")

    def close(self) -> None:
        self._close()


# -- report -------------------------------------------------------------------------------------

def _rows(cfg: dict[str, Any]) -> list[tuple[str, str, str, bool, str]]:
    """(label, point, field, higher is better, format)."""
    rows = []
    for n in cfg["map_clients"]:
        c = f"{n} client{'s' if n > 1 else ''}"
        for what, name in (("get-linearizable", "linearizable"), ("get-cheapest", "cheapest")):
            rows.append((f"get p50 ms, {c}, {name}", f"kv|{what}|{n}", "p50_ms", False, ".2f"))
            rows.append((f"gets/s, {c}, {name}", f"kv|{what}|{n}", "ops_per_s", True, ",.0f"))
        rows.append((f"put p50 ms, {c}", f"kv|put|{n}", "p50_ms", False, ".2f"))
        rows.append((f"puts/s, {c}", f"kv|put|{n}", "ops_per_s", True, ",.0f"))
    for n in cfg["map_watchers"]:
        rows += [
            (f"{n} watchers of one key: ms from the put to the last notified",
             f"fan|popular|{n}", "last_ms", False, ".1f"),
            (f"{n} watchers of one key: server CPU ms per change", f"fan|popular|{n}",
             "cpu_ms_per_change", False, ".2f"),
            (f"{n} watchers of {n} keys: ms from a put to its watcher (p50)",
             f"fan|distinct|{n}", "each_p50_ms", False, ".1f"),
            (f"{n} watchers of {n} keys: ms from a round's first put to the last notified",
             f"fan|distinct|{n}", "last_ms", False, ".1f"),
            (f"{n} watchers of {n} keys: server CPU ms per change", f"fan|distinct|{n}",
             "cpu_ms_per_change", False, ".2f")]
    return rows


def value(results: dict[str, Any], system: str, point: str, field: str) -> float | None:
    rec = (results.get(system, {}).get("map") or {}).get(point)
    if not isinstance(rec, dict) or "infeasible" in rec:
        return None
    v = rec.get(field)
    return None if v is None or v != v else float(v)


def map_table(results: dict[str, Any], cfg: dict[str, Any]) -> str:
    lines = ["Map (issue 27): linearizable = gesmas Map.get linearizable / ZooKeeper sync + "
             "getData / etcd Range; cheapest = sequential / getData / serializable Range. "
             "\"gesmas vs the best\": how many times better gesmas is than the better of "
             "ZooKeeper and etcd (>1: gesmas better).", "",
             "| figure | ZooKeeper | etcd | gesmas | gesmas vs the best |",
             "|---|---:|---:|---:|---:|"]
    for label, point, field, higher, fmt in _rows(cfg):
        vals = {s: value(results, s, point, field) for s in SYSTEMS}
        if all(v is None for v in vals.values()):
            continue
        others = [x for x in (vals["zookeeper"], vals["etcd"]) if x]
        g = vals["gesmas"]
        adv = None if not g or not others else (g / max(others) if higher
                                                 else min(others) / g)
        lines.append(f"| {label} | " + " | ".join(
            "—" if vals[s] is None else format(vals[s], fmt) for s in SYSTEMS) +
            f" | {'—' if adv is None else format(adv, '.2f') + '×'} |")
    return "\n".join(lines)


def map_targets(results: dict[str, Any], cfg: dict[str, Any]) -> list[str]:
    """Issue 27's targets: ahead of both on fan-out; reads no worse than etcd's
    serializable get."""
    out = []

    def chk(name: str, ok: bool | None, detail: str) -> None:
        out.append(f"- {name}: **{'met' if ok else ('missed' if ok is not None else 'n/a')}**"
                   f" — {detail}")
    for label, point, field, higher, _ in _rows(cfg):
        if not point.startswith("fan|"):
            continue
        g = value(results, "gesmas", point, field)
        others = [v for v in (value(results, s, point, field) for s in ("zookeeper", "etcd"))
                  if v is not None]
        if g is None or len(others) < 2:
            chk(f"fan-out ahead of ZooKeeper and etcd: {label}", None, "not all measured")
        else:
            chk(f"fan-out ahead of ZooKeeper and etcd: {label}", g < min(others),
                f"{g:.2f} vs {min(others):.2f}")
    for n in cfg["map_clients"]:
        for field, higher, what in (("p50_ms", False, "get p50"), ("ops_per_s", True, "gets/s")):
            g = value(results, "gesmas", f"kv|get-cheapest|{n}", field)
            e = value(results, "etcd", f"kv|get-cheapest|{n}", field)
            name = f"{what}, {n} client{'s' if n > 1 else ''}, no worse than etcd's serializable"
            if g is None or e is None:
                chk(name, None, "not both measured")
            else:
                chk(name, g >= e if higher else g <= e, f"{g:,.2f} vs {e:,.2f}")
    return out

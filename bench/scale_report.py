"""bench/scale_bench.py's table: the figures of its runs, median (min-max) where there are
several, one row per figure and phase."""
from __future__ import annotations

import statistics
from typing import Any

from host_stalls import GAP_S

AFTER = 4.5                     # s after a checkpoint its capture may run (apply_thread.PACE_FOR)
CLEAR = 5.0                     # s from any checkpoint: what the load alone does


def summary(runs: list[dict[str, Any]]) -> None:
    def spread(xs: list[float]) -> str:
        xs = [x for x in xs if x is not None]
        if not xs:
            return "-"
        return f"{statistics.median(xs):g} ({min(xs):g}-{max(xs):g})" if len(xs) > 1 \
            else f"{xs[0]:g}"
    print(f"\n| figure ({len(runs)} run(s); median (min-max)) | value |")
    print("|---|---:|")
    names = [p["phase"] for p in runs[0]["phases"]]
    for i, name in enumerate(names):
        ps = [r["phases"][i] for r in runs]
        print(f"| {name}: longest produce, ms | {spread([p['produce_max_ms'] for p in ps])} |")
        print(f"| {name}: produce p50 / p99, ms | "
              f"{spread([p.get('produce_p50_ms') for p in ps])} / "
              f"{spread([p.get('produce_p99_ms') for p in ps])} |")
        print(f"| {name}: produces over 50 / over 100 ms | "
              f"{', '.join(str(p.get('produce_over_50ms')) for p in ps)} / "
              f"{', '.join(str(p.get('produce_over_100ms')) for p in ps)} |")
        print(f"| {name}: longest produce near a checkpoint, ms | "
              f"{spread([p['produce_max_near_checkpoint_ms'] for p in ps])} |")
        for key, what in (("after_checkpoint", f"started within {AFTER:g} s after a checkpoint"),
                          ("clear_of_checkpoints", f"started over {CLEAR:g} s from any")):
            xs = [p.get(f"produce_{key}") or {} for p in ps]
            if any(x.get("calls") for x in xs):
                print(f"| {name}: produces {what}: longest; p99; over 50 ms, ms | "
                      f"{spread([x.get('max_ms') for x in xs])}; "
                      f"{spread([x.get('p99_ms') for x in xs])}; "
                      f"{', '.join(str(x.get('over_50ms')) for x in xs)} |")
        print(f"| {name}: collector passes over 50 / over 100 ms (all replicas) | "
              f"{', '.join(str(p.get('gc_over_50ms')) for p in ps)} / "
              f"{', '.join(str(p.get('gc_over_100ms')) for p in ps)} |")
        print(f"| {name}: produces over 50 ms during such a pass | "
              f"{', '.join(str(p.get('produce_over_50ms_during_long_gc')) for p in ps)} |")
        print(f"| {name}: Raft snapshots written (all replicas); produces over 50 ms in the "
              f"2 s before one | {', '.join(str(p.get('snapshots')) for p in ps)}; "
              f"{', '.join(str(p.get('produce_over_50ms_near_snapshot')) for p in ps)} |")
        print(f"| {name}: host steal; I/O wait, ms (all CPUs); sampler gaps over {GAP_S:g} s; "
              f"produces over 50 ms during which the host took time | "
              f"{', '.join(str(p.get('host_steal_ms')) for p in ps)}; "
              f"{', '.join(str(p.get('host_iowait_ms')) for p in ps)}; "
              f"{', '.join(str(p.get('host_gaps')) for p in ps)}; "
              f"{', '.join(str(p.get('produce_over_50ms_host')) for p in ps)} |")
        print(f"| {name}: longest checkpoint, s | "
              f"{spread([p['checkpoint_seconds_max'] for p in ps])} |")
        sizes = [round(p["checkpoint_bytes"] / 1e6, 2) if p.get("checkpoint_bytes") else None
                 for p in ps]
        print(f"| {name}: largest checkpoint, MB | {spread(sizes)} |")
        terms = ", ".join(f"{p['term_before']:g}->{p['term_after']:g}" for p in ps)
        print(f"| {name}: term before -> after | {terms} |")
        print(f"| {name}: leader changes | {', '.join(str(p['leader_changes']) for p in ps)} |")
        if name == "create":
            print(f"| create: objects/s | {spread([p['rate'] for p in ps])} |")
            print(f"| create: objects/s per tenth (first run) | {ps[0]['rate_per_tenth']} |")
            print(f"| create: RSS bytes per object (first run, per node) | "
                  f"{ps[0]['rss_bytes_per_object']} |")
        if name in ("restart", "wipe"):
            print(f"| {name}: caught up after, s | "
                  f"{spread([p['caught_up_seconds'] for p in ps])} |")
        if name == "waiters":
            print(f"| waiters: RSS bytes per waiter (first run) | "
                  f"{ps[0]['rss_bytes_per_waiter']} |")
            print(f"| waiters: client RSS bytes per waiting call (first run, per holder) | "
                  f"{ps[0].get('client_rss_bytes_per_waiting_call')} |")
        if name == "list":
            print(f"| list: ms per call | {spread([x for p in ps for x in p['list_ms']])} |")

"""bench/paper.py's constants and small helpers, shared by its modules."""
from __future__ import annotations

import os
import sys

from stats import pct


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ITEM = b"paper-item-0123456789abcdef"
OP_TIMEOUT = 30.0
SESSION_TTL = 60.0
ROUTE_ENV = "GESMAS_BENCH_ROUTE"  # --route, handed to the spawned workers
EXPERIMENTS = ["produce", "consume", "mixed", "herd", "barrier", "lock", "latency"]
#: run only when named in --only (not part of the default run nor of its docs/benchmarks.md table)
EXTRA_EXPERIMENTS = ["reads", "map"]
MAP = "paper-map"      # the gesmas Map of the map experiment (bench/paper_map.py)
SYSTEMS = ["gesmas", "zookeeper", "etcd"]
#: the paper's experiments (and their table) compare these two; etcd takes part in "reads"
PAPER_SYSTEMS = ["gesmas", "zookeeper"]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- statistics -------------------------------------------------------------------------------

def stats(lat_ms: list[float]) -> dict[str, float]:
    return {"n": len(lat_ms), "mean_ms": sum(lat_ms) / len(lat_ms) if lat_ms else float("nan"),
            "p50_ms": pct(lat_ms, 50), "p99_ms": pct(lat_ms, 99)}



"""Statistics shared by the benchmark programs."""
from __future__ import annotations

import math


def pct(xs: list[float], q: float) -> float:
    """Nearest-rank q-th percentile of `xs` (any order; nan if empty)."""
    xs = sorted(xs)
    if not xs:
        return float("nan")
    return xs[max(0, min(len(xs) - 1, math.ceil(q / 100 * len(xs)) - 1))]

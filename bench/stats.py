"""Percentiles and process CPU accounting for the benchmarks."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import psutil


def pct(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def cpu_seconds(pids: Iterable[int]) -> dict[int, float]:
    out = {}
    for pid in pids:
        t = psutil.Process(pid).cpu_times()
        out[pid] = t.user + t.system
    return out

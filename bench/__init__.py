"""Benchmarks: each prints its figures (one JSON object with ``--json``); none is a timed test."""

from __future__ import annotations

import json
import os
from typing import Any


def busy_cpu_s() -> float | None:
    """CPU seconds the whole machine has spent busy since boot (Linux ``/proc/stat``), else None."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")   # less idle and iowait


def ms_percentile(seconds: list[float], q: float, digits: int = 3) -> float:
    """The ``q`` quantile (nearest rank) of durations in seconds, in milliseconds."""
    xs = sorted(seconds)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))] * 1000, digits)


def report(figures: dict[str, Any], as_json: bool) -> None:
    """Print the figures: one JSON object, or one aligned line per figure."""
    if as_json:
        print(json.dumps(figures))
        return
    width = max(map(len, figures), default=0)
    for key, value in figures.items():
        print(f"{key:>{width}}: {value}")

"""Latency summaries shared by the benchmark scripts (run as ``python bench/<name>.py``)."""

from __future__ import annotations

import statistics


def summary(samples_s: list[float]) -> dict[str, float]:
    """n, p50, p90 and min of samples given in seconds, reported in milliseconds."""
    ms = sorted(s * 1000 for s in samples_s)
    return {
        "n": len(ms),
        "p50_ms": round(statistics.median(ms), 3),
        "p90_ms": round(ms[max(int(len(ms) * 0.9) - 1, 0)], 3),
        "min_ms": round(ms[0], 3),
    }

"""Latency summaries: percentiles by linear interpolation, in microseconds.

Pure Python so the benchmark's parent process needs no NumPy to merge the latencies of
several load-generator processes.
"""

from __future__ import annotations

from collections.abc import Sequence

PERCENTILES = (50.0, 90.0, 99.0, 99.9)


def percentile(ordered: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of an already sorted sequence; linear interpolation."""
    if not ordered:
        raise ValueError("percentile of an empty sequence")
    rank = (len(ordered) - 1) * q / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize_ns(latencies_ns: Sequence[int]) -> dict[str, float] | None:
    """Mean, min, max and PERCENTILES of nanosecond samples, in microseconds; None if empty."""
    if not latencies_ns:
        return None
    ordered = sorted(latencies_ns)
    summary = {
        "count": float(len(ordered)),
        "mean": sum(ordered) / len(ordered) / 1e3,
        "min": ordered[0] / 1e3,
        "max": ordered[-1] / 1e3,
    }
    for q in PERCENTILES:
        summary[f"p{q:g}"] = percentile(ordered, q) / 1e3
    return summary

"""Shared helpers for the benchmark scripts: JSON + table output, environment facts."""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
from collections.abc import Sequence
from typing import Any

from asyncckpt.engine.runinfo import package_versions
from asyncckpt.results.text import format_table


def directory(value: str) -> str:
    """An argparse type: an existing directory, else a usage error naming it (before any I/O)."""
    if not os.path.isdir(value):
        what = "does not exist" if not os.path.exists(value) else "is not a directory"
        raise argparse.ArgumentTypeError(f"{value!r} {what}")
    return value


def positive_int(value: str) -> int:
    """An argparse type: an integer of at least 1, else a usage error naming the value."""
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a positive integer")
    return n


def rotation(n: int, i: int) -> list[int]:
    """Round ``i``'s order of ``n`` arms: each arm goes first in turn, so none always runs
    after the same neighbour (or first, on a cold machine)."""
    return [(i + k) % n for k in range(n)]


def emit(name: str, rows: Sequence[dict[str, Any]], headers: Sequence[str], extra: dict[str, Any]) -> None:
    """Print a table (for people) and one JSON document (for machines)."""
    print(format_table(headers, [[_fmt(r.get(h)) for h in headers] for r in rows]))
    doc = {
        "benchmark": name,
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "python": platform.python_version(),
        "cpus": len(os.sched_getaffinity(0)),
        "versions": package_versions(),
        **extra,
        "rows": list(rows),
    }
    print(json.dumps(doc, indent=2))


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    return "" if value is None else str(value)


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def rate_stats(rates: Sequence[float], base: Sequence[float], ratio: str) -> dict[str, float]:
    """One arm's GB/s (median, min, max) and, under ``ratio``, the median of its per-round
    ratios to ``base`` (the arm measured beside it in each round)."""
    return {
        "GB/s median": median(rates),
        "GB/s min": min(rates),
        "GB/s max": max(rates),
        ratio: median([a / b for a, b in zip(rates, base, strict=True)]),
    }


def bootstrap_ci(
    values: Sequence[float], *, level: float = 0.95, resamples: int = 10_000
) -> tuple[float, float]:
    """Percentile bootstrap interval of the median (seeded: the same figures give the same
    interval). Few pairs give a wide interval, which is the point: it must clear the target."""
    rng = random.Random(0)
    n = len(values)
    medians = sorted(statistics.median(rng.choices(values, k=n)) for _ in range(resamples))
    tail = (1.0 - level) / 2
    return medians[int(tail * resamples)], medians[min(resamples - 1, int((1.0 - tail) * resamples))]


def ratio_verdict(ratios: Sequence[float], target: float, *, at_most: bool = False) -> dict[str, Any]:
    """Median ratio, its 95 % bootstrap interval, and the verdict the docs report: "met" only
    when the whole interval is on the right side of the target, "not met" when the whole
    interval is on the wrong side, else "not demonstrated" (the interval straddles it)."""
    if len(ratios) < 5:
        raise ValueError(f"{len(ratios)} pairs: a verdict needs at least 5 alternating pairs")
    low, high = bootstrap_ci(ratios)
    good = (lambda x: x <= target) if at_most else (lambda x: x >= target)
    verdict = (
        "met"
        if good(low) and good(high)
        else "not met"
        if not good(low) and not good(high)
        else "not demonstrated"
    )
    return {
        "pairs": len(ratios),
        "ratios": [round(r, 4) for r in ratios],
        "median_ratio": round(statistics.median(ratios), 4),
        "ci95": [round(low, 4), round(high, 4)],
        "target": ("<= " if at_most else ">= ") + str(target),
        "verdict": verdict,
    }

"""Shared helpers for the benchmark scripts: JSON + table output, environment facts."""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
from collections.abc import Sequence
from typing import Any

from asyncckpt.report import format_table
from asyncckpt.runinfo import package_versions


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

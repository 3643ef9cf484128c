"""The library's human-facing units and tables (a result's text block is ``str(result)``).

Sizes are in GiB (2**30) and rates in GB/s (10**9 B/s, as storage vendors and MLPerf
Storage quote them); every figure carries its unit so the two are never confused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

RULE = "=" * 78


def gib(n: float) -> str:
    return f"{n / 2**30:.3f} GiB"


def mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def gbps(bps: float | None) -> str:
    return "n/a" if bps is None or bps == float("inf") else f"{bps / 1e9:.3f} GB/s"


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def format_endpoints(extra: Mapping[str, Any]) -> list[str]:
    """Per-endpoint lines under a result (multi-endpoint runs only; nothing otherwise)."""
    if "endpoint_strategy" not in extra:
        return []
    head = (
        f"Endpoints:         {extra.get('endpoints_configured', '?')}, strategy {extra['endpoint_strategy']}"
    )
    per = extra.get("endpoints")
    if not per:
        return [head + f"; this rank used {extra.get('endpoint_url')}"]
    rows = [
        (
            e["endpoint"],
            e["parts"],
            gib(e["bytes"]),
            e["in_flight_peak"],
            ms(e["latency_p50_s"]),
            ms(e["latency_p99_s"]),
            e["errors"],
            e["retries"],
            e["marked_down"],
        )
        for e in per
    ]
    headers = ("endpoint", "parts", "bytes", "peak", "p50", "p99", "errors", "retries", "down")
    return [
        head + f"; {extra.get('endpoint_retries', 0)} part(s) retried elsewhere",
        format_table(headers, rows),
    ]


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain aligned text table."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    out = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) for row in cells]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)

"""All human-facing formatting: result tables, comparisons, the progress bar.

Sizes are in GiB (2**30) and rates in GB/s (10**9 B/s, as storage vendors and MLPerf
Storage quote them); every figure carries its unit so the two are never confused.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from typing import IO

from .metrics import SaveResult

RULE = "=" * 78


def gib(n: float) -> str:
    return f"{n / 2**30:.3f} GiB"


def mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def gbps(bps: float | None) -> str:
    return "n/a" if bps is None or bps == float("inf") else f"{bps / 1e9:.3f} GB/s"


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def format_result(r: SaveResult) -> str:
    """The results block of one save or load."""
    m = r.metadata
    d = r.to_dict()
    counts = " / ".join(f"{k} {v:,}" for k, v in r.bottleneck_counts.items())
    close = ", ".join(f"{k.removesuffix('_s')} {v:.3f} s" for k, v in r.close_detail.items())
    lat, wlat, lag = r.chunk_latency_s, r.write_latency_s, r.loop_lag_s
    direct = "on" if m.direct_io else "OFF"
    gen = f"{m.generator} (seed {m.seed}, threads {m.gen_threads} of {m.gen_threads_requested} requested)"
    lines = [
        RULE,
        f"{r.operation.upper()} {r.method}: {gib(r.size_bytes)} → {m.uri} [{m.backend}]",
        RULE,
        f"Throughput:        {gbps(r.throughput_bps)}  ({gib(r.size_bytes)} in {r.wall_s:.3f} s, end to end)",
        f"Generation:        {r.gen_s:.3f} s @ {gbps(d['gen_bps'])}  (pure fill time)",
        f"I/O:               {r.io_s:.3f} s @ {gbps(d['io_bps'])}",
        f"  - write:         {r.write_s:.3f} s",
        f"  - close:         {r.close_s:.3f} s ({close or 'no detail'})",
        f"Open:              {r.open_s:.3f} s",
        f"Throughput ratio:  {_ratio(d['gen_io_ratio'])} (gen/io)",
        f"Pipeline overhead: {r.overhead_pct:.1f}%",
        f"Bottleneck:        {r.bottleneck}  (chunks: {counts})",
        f"Waits:             producer for buffers {r.wait_free_s:.3f} s, "
        f"writers for data {r.wait_data_s:.3f} s",
        f"Chunks:            {r.chunks:,} × {mib(m.chunk_size)}; latency p50 {ms(lat.p50)} p90 {ms(lat.p90)} "
        f"p99 {ms(lat.p99)} max {ms(lat.max)}",
        f"Write latency:     p50 {ms(wlat.p50)} p99 {ms(wlat.p99)} max {ms(wlat.max)}",
        f"Event-loop lag:    p50 {ms(lag.p50)} p99 {ms(lag.p99)} max {ms(lag.max)} ({m.event_loop})",
        f"Memory:            peak RSS {mib(r.peak_rss_bytes)} "
        f"(+{mib(r.peak_rss_bytes - r.baseline_rss_bytes)} during the run); pool {mib(m.pool_bytes)}",
        f"Direct I/O:        {direct} — {m.direct_io_reason}; fsync {'on' if m.fsync else 'off'}",
        f"Writer:            {_writer(m.extra)}",
        f"Generator:         {gen}",
        f"Ranks on node:     {m.local_ranks} (from {m.local_ranks_source}); usable CPUs {m.usable_cpus}",
        f"Host:              {m.hostname}, Python {m.python}",
        RULE,
    ]
    return "\n".join(lines)


def _writer(extra: Mapping[str, object]) -> str:
    """Where the sink ran: in-process, or which writer process and why."""
    if extra.get("isolation") != "process":
        return "in-process"
    return (
        f"process pid {extra.get('writer_pid')}, {extra.get('mp_start_method')} "
        f"(from {extra.get('mp_start_method_source')}); {extra.get('isolation_reason')}"
    )


def _ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain aligned text table."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    out = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) for row in cells]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)


def format_comparison(results: Sequence[SaveResult]) -> str:
    """Several runs side by side (e.g. streaming vs preallocate, repeated checkpoints)."""
    rows = [
        (
            i + 1,
            r.operation,
            r.method,
            gib(r.size_bytes),
            f"{r.wall_s:.3f} s",
            gbps(r.throughput_bps),
            gbps(r.to_dict()["gen_bps"]),
            gbps(r.to_dict()["io_bps"]),
            r.bottleneck,
            mib(r.peak_rss_bytes - r.baseline_rss_bytes),
            ms(r.loop_lag_s.p99),
        )
        for i, r in enumerate(results)
    ]
    headers = (
        "#",
        "op",
        "method",
        "size",
        "wall",
        "throughput",
        "gen",
        "io",
        "bottleneck",
        "+RSS",
        "lag p99",
    )
    return format_table(headers, rows)


def format_summary(summary: Mapping[str, Mapping[str, float]]) -> str:
    """Mean and stdev per method across repeated checkpoints."""
    rows = [
        (
            method,
            int(s["runs"]),
            gbps(s["throughput_bps_mean"]),
            gbps(s["throughput_bps_stdev"]),
            f"{s['duration_s_mean']:.3f} s",
            f"{s['duration_s_stdev']:.3f} s",
        )
        for method, s in summary.items()
    ]
    return format_table(("method", "runs", "throughput mean", "stdev", "duration mean", "stdev"), rows)


class Progress:
    """A one-line progress bar on a terminal; silent when ``stream`` is not a TTY."""

    def __init__(self, total: int, label: str, stream: IO[str] | None = None) -> None:
        self.total = total
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self.stream.isatty()
        self.done = 0
        self._start = time.perf_counter()
        self._last = 0.0

    def __call__(self, nbytes: int) -> None:
        self.done += nbytes
        t = time.perf_counter()
        if not self.enabled or (t - self._last < 0.1 and self.done < self.total):
            return
        self._last = t
        frac = self.done / self.total if self.total else 1.0
        bar = "#" * int(frac * 30)
        rate = self.done / max(t - self._start, 1e-9)
        self.stream.write(f"\r{self.label} [{bar:<30}] {frac:6.1%} {gbps(rate)}   ")
        if self.done >= self.total:
            self.stream.write("\n")
        self.stream.flush()

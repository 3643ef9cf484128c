"""All human-facing formatting: result tables, comparisons, the progress bar.

Sizes are in GiB (2**30) and rates in GB/s (10**9 B/s, as storage vendors and MLPerf
Storage quote them); every figure carries its unit so the two are never confused.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .records import LoadResult, Result, RunMetadata, RunResult, SaveResult

RULE = "=" * 78


def gib(n: float) -> str:
    return f"{n / 2**30:.3f} GiB"


def mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def gbps(bps: float | None) -> str:
    return "n/a" if bps is None or bps == float("inf") else f"{bps / 1e9:.3f} GB/s"


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def format_result(r: RunResult) -> str:
    """The results block of one save or load."""
    if isinstance(r, LoadResult):
        return format_load(r)
    assert isinstance(r, SaveResult)
    return format_save(r)


def format_cpu(r: RunResult) -> str:
    """CPU-s per GB in total (and what it covers), then per measured stage."""
    total = r.cpu_s_per_gb
    if total is None:
        return "not measured (result written before schema 2.2)"
    scope = "this process + writer process" if r.writer_cpu_s is not None else "this process"
    stages = ", ".join(f"{k} {v:.3f}" for k, v in r.cpu_stages_s_per_gb.items())
    return f"{total:.3f} CPU-s/GB ({scope}){'; stages: ' + stages if stages else ''}"


def _cpu_priority(m: RunMetadata) -> str:
    if m.cpu_nice is None:  # a file older than 2.3
        return ""
    beside = ", beside the loop's CPU" if m.cpu_pinned else ""
    return f"; CPU work at nice {m.cpu_nice}{', SCHED_IDLE' if m.cpu_idle else ''}{beside}"


def format_save(r: SaveResult) -> str:
    """The results block of one save: generation, checksums and writes kept apart."""
    m = r.metadata
    d = r.to_dict()
    counts = " / ".join(f"{k} {v:,}" for k, v in r.bottleneck_counts.items())
    close = ", ".join(f"{k.removesuffix('_s')} {v:.3f} s" for k, v in r.close_detail.items())
    lat, wlat, lag = r.chunk_latency_s, r.write_latency_s, r.loop_lag_s
    direct = "on" if m.direct_io else "OFF"
    gen = (
        f"{m.generator} (seed {m.seed}, threads {m.gen_threads} of {m.gen_threads_requested} requested; "
        f"budget {m.thread_budget_threads} by the {m.thread_budget_rule} rule{_cpu_priority(m)})"
    )
    lines = [
        RULE,
        f"{r.operation.upper()} {r.method}: {gib(r.size_bytes)} → {m.uri} [{m.backend}]",
        RULE,
        f"Throughput:        {gbps(r.throughput_bps)}  ({gib(r.size_bytes)} in {r.wall_s:.3f} s, end to end)",
        f"Generation:        {r.gen_s:.3f} s @ {gbps(d['gen_bps'])}  (pure fill time)",
        _checksum_line(r, d),
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
        f"CPU:               {format_cpu(r)}",
        f"Memory:            peak RSS {mib(r.peak_rss_bytes)} "
        f"(+{mib(r.peak_rss_bytes - r.baseline_rss_bytes)} during the run); pool {mib(m.pool_bytes)}",
        f"Direct I/O:        {direct} — {m.direct_io_reason}; fsync {'on' if m.fsync else 'off'}",
        f"Writer:            {_writer(m.extra)}",
        f"Generator:         {gen}",
        f"Ranks on node:     {m.local_ranks} (from {m.local_ranks_source}); usable CPUs {m.usable_cpus}",
        f"Host:              {m.hostname}, Python {m.python}",
        RULE,
    ]
    return "\n".join(lines + format_endpoints(m.extra))


def _checksum_line(r: SaveResult, d: Mapping[str, Any]) -> str:
    if r.integrity == "none":
        return "Checksum:          no checksums (integrity none: a load can verify only by regeneration)"
    return f"Checksum:          {r.checksum_s:.3f} s @ {gbps(d['checksum_bps'])}  (CRC32C, beside each write)"


def format_load(r: LoadResult) -> str:
    """The results block of one load: reads, verification and the caller kept apart."""
    m, d, x = r.metadata, r.to_dict(), r.metadata.extra
    counts = " / ".join(f"{k} {v:,}" for k, v in r.bottleneck_counts.items())
    rl, lag = r.read_latency_s, r.loop_lag_s
    verify = x.get("verify", "?")
    regen = f", of which regeneration {x.get('regenerate_s', 0.0):.3f} s" if verify == "regenerate" else ""
    lines = [
        RULE,
        f"LOAD: {gib(r.size_bytes)} ← {m.uri} [{m.backend}]",
        RULE,
        f"Throughput:        {gbps(r.throughput_bps)}  ({gib(r.size_bytes)} in {r.wall_s:.3f} s, end to end)",
        f"Read (I/O):        {r.read_s:.3f} s @ {gbps(d['read_bps'])}"
        f"  ({m.max_in_flight} reader(s) × {mib(m.chunk_size)})",
        f"Verify:            {verify}: {r.verify_s:.3f} s @ {gbps(d['verify_bps'])}{regen}",
        f"Consumer:          {r.consume_s:.3f} s  (verification + caller, per chunk, summed)",
        f"Open:              {r.open_s:.3f} s (stat + manifest + open)",
        f"Bottleneck:        {r.bottleneck}  (chunks: {counts})",
        f"Waits:             for free buffers {r.wait_free_s:.3f} s, "
        f"consumer for reads {r.wait_data_s:.3f} s",
        f"Read latency:      p50 {ms(rl.p50)} p90 {ms(rl.p90)} p99 {ms(rl.p99)} max {ms(rl.max)} "
        f"({r.chunks:,} reads)",
        f"Event-loop lag:    p50 {ms(lag.p50)} p99 {ms(lag.p99)} max {ms(lag.max)} ({m.event_loop})",
        f"CPU:               {format_cpu(r)}",
        f"Memory:            peak RSS {mib(r.peak_rss_bytes)} "
        f"(+{mib(r.peak_rss_bytes - r.baseline_rss_bytes)} during the run); pool {mib(m.pool_bytes)}",
        f"Cache defeat:      {'O_DIRECT' if m.direct_io else 'no O_DIRECT'} — {m.direct_io_reason}",
        f"Manifest:          {m.generator} (seed {m.seed}), chunk {mib(x.get('manifest_chunk_size', 0))}"
        + ("; no checksums (saved with integrity none)" if x.get("manifest_integrity") == "none" else ""),
        RULE,
    ]
    if "identity_note" in x:
        lines.insert(-1, f"Note:              {x['identity_note']}")
    return "\n".join(lines + format_endpoints(x))


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


def format_comparison(results: Sequence[Result]) -> str:
    """Several runs side by side (e.g. streaming vs preallocate, repeated checkpoints)."""
    rows = [
        (
            i + 1,
            r.operation,
            r.method,
            gib(r.size_bytes),
            f"{r.wall_s:.3f} s",
            gbps(r.throughput_bps),
            gbps(r.verify_bps if isinstance(r, LoadResult) else r.gen_bps),
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
        "gen/verify",
        "io",
        "bottleneck",
        "+RSS",
        "lag p99",
    )
    return format_table(headers, rows) + integrity_note(results)


def integrity_note(results: Sequence[Result]) -> str:
    """A line under a table whose saves computed no checksums: their figures are not those of
    a checksummed save, and their objects can be verified only by regeneration."""
    unchecked = [r for r in results if isinstance(r, SaveResult) and r.integrity == "none"]
    if not unchecked:
        return ""
    return (
        f"\nnote: {len(unchecked)} save(s) made no checksums (integrity none): pure storage "
        "figures; their objects can be verified only by regeneration"
    )


def format_backend_comparison(results: Sequence[Result]) -> str:
    """One row per backend (``--compare-backends``): same size, same chunking, same window."""
    rows = []
    for r in results:
        extra = r.metadata.extra
        rows.append(
            (
                r.metadata.backend,
                r.operation,
                r.method,
                gib(r.size_bytes),
                f"{r.wall_s:.3f} s",
                gbps(r.throughput_bps),
                gbps(r.to_dict()["io_bps"]),
                extra.get("parts", "?"),
                ms(float(extra.get("part_latency_p50_s", 0.0))),
                ms(float(extra.get("part_latency_p99_s", 0.0))),
                "n/a" if extra.get("retries") is None else extra["retries"],
                r.bottleneck,
            )
        )
    headers = ("backend", "op", "method", "size", "wall", "throughput", "io", "parts", "part p50", "part p99")
    return format_table((*headers, "retries", "bottleneck"), rows) + integrity_note(results)


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


def format_phases(summary: Mapping[str, Mapping[str, float]]) -> str:
    """Save and load side by side: mean ± stdev across checkpoints (MLPerf Storage style)."""
    rows = [
        (
            "load" if name == "load" else f"save ({name})",
            int(s["runs"]),
            f"{gbps(s['throughput_bps_mean'])} ± {gbps(s['throughput_bps_stdev'])}",
            f"{s['duration_s_mean']:.3f} ± {s['duration_s_stdev']:.3f} s",
            f"{gbps(s['io_bps_mean'])} ± {gbps(s['io_bps_stdev'])}",
            f"{s['cpu_s_per_gb_mean']:.3f}" if "cpu_s_per_gb_mean" in s else "—",
        )
        for name, s in summary.items()
    ]
    headers = ("phase", "checkpoints", "throughput (mean ± stdev)", "duration", "I/O only", "CPU-s/GB")
    return format_table(headers, rows)


def _secs(x: float) -> str:
    return f"{x:.3f} s"


def _mean_sd(s: Mapping[str, float], key: str, fmt: Callable[[float], str]) -> str:
    return f"{fmt(s[f'{key}_mean'])} ± {fmt(s[f'{key}_stdev'])}"


#: how a multi-rank report names the collectives' transport (``engine``)
ENGINE_NAMES = {"mpi": "MPI", "torch": "torch.distributed"}


def format_distributed(report: Mapping[str, Any]) -> str:
    """Rank 0's report of an MPI run: per-checkpoint job figures, stragglers, mean ± stdev."""
    nodes = ", ".join(f"{h} ({n} ranks)" for h, n in report["nodes"].items())
    engine = ENGINE_NAMES.get(report.get("engine", "mpi"), "MPI")
    head = [
        RULE,
        f"{engine} run: {report['world_size']} ranks on {len(report['nodes'])} node(s): {nodes}",
        f"Target:  {report['target']}  layout {report['layout']}; "
        f"{gib(report['size_bytes_per_rank'])} per rank, data seed {report['seed_base']} + rank",
    ]
    if report.get("preset"):
        p = report["preset"]
        head.append(
            f"Preset:  {p['model']} ({p['checkpoint_bytes'] / 1e9:g} GB over {p['preset_ranks']} ranks), "
            f"scale {p['scale']:g}; this run writes {p['written_fraction']:.1%} of the scaled checkpoint"
        )
    if report.get("config_file"):
        unused = report.get("config_unused_keys") or []
        head.append(
            f"Config:  {report['config_file']}" + (f" (not used: {', '.join(unused)})" if unused else "")
        )
    head.append(RULE)
    blocks = ["\n".join(head)]
    for ph in report["phases"]:
        rows = [
            (
                i + 1,
                gib(c["total_bytes"]),
                f"{c['duration_s']:.3f} s",
                gbps(c["throughput_bps"]),
                gbps(c["min_rank_throughput_bps"]),
                gbps(c["aggregate_bandwidth_bps"]),
                f"{c['slowest_rank']['rank']} ({c['slowest_rank']['wall_s']:.3f} s)",
                f"{c['fastest_rank']['rank']} ({c['fastest_rank']['wall_s']:.3f} s)",
                f"{c['straggler_ratio']:.2f}x",
                " / ".join(f"{k} {v}" for k, v in c["rank_bottlenecks"].items()),
            )
            for i, c in enumerate(ph["checkpoints"])
        ]
        headers = (
            "#",
            "total",
            "duration",
            "throughput",
            "min rank",
            "aggregate",
            "slowest",
            "fastest",
            "spread",
            "rank bottlenecks",
        )
        s = ph["summary"]
        counts = " / ".join(f"{k} {v:,}" for k, v in s["bottleneck_counts"].items())
        mean = (
            f"mean ± stdev over {s['checkpoints']} checkpoint(s): "
            f"throughput {_mean_sd(s, 'throughput_bps', gbps)}, "
            f"duration {_mean_sd(s, 'duration_s', _secs)}, "
            f"min rank {_mean_sd(s, 'min_rank_throughput_bps', gbps)}"
        )
        title = f"{ph['phase'].upper()} {ph['method']}: throughput = total ÷ max duration over ranks (MLPerf)"
        table = format_table(headers, rows)
        blocks.append(f"{title}\n{table}\n{mean}\nchunk bottlenecks (all ranks): {counts}")
    return "\n\n".join(blocks)

"""The bench CLI's tables over several runs: comparisons, per-method summaries, MPI jobs.

Only the CLI and the benchmark scripts print these; the library's own text (one result's
block, the units) is :mod:`asyncckpt.results.text`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..results.records import LoadResult, Result, SaveResult
from ..results.text import RULE, format_table, gbps, gib, mib, ms


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

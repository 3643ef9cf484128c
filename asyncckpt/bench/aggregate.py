"""Combining per-rank results into job-level figures. Plain data in, plain data out.

MLPerf Storage's rule for a checkpoint written by N ranks at once: the checkpoint is done
when the *slowest* rank is done, so throughput = total bytes ÷ max duration over ranks. The
stricter view also reports the minimum per-rank throughput. The sum of per-rank throughputs
("aggregate bandwidth") is shown beside them because it is what naive tools report; it
overstates the job's rate whenever ranks finish at different times.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

#: keys of one checkpoint's aggregate (JSON summary contract)
CHECKPOINT_KEYS = (
    "ranks",
    "total_bytes",
    "duration_s",
    "throughput_bps",
    "min_rank_throughput_bps",
    "aggregate_bandwidth_bps",
    "slowest_rank",
    "fastest_rank",
    "straggler_ratio",
    "bottleneck_counts",
    "rank_bottlenecks",
)
#: run facts carried per rank (the thread budget is what the seed bug got wrong)
RANK_METADATA = ("uri", "hostname", "seed", "gen_threads", "local_ranks", "local_ranks_source")
#: figures averaged over repeated checkpoints
SUMMARY_FIGURES = ("throughput_bps", "duration_s", "min_rank_throughput_bps", "aggregate_bandwidth_bps")


def rank_throughput(result: Mapping[str, Any]) -> float:
    wall = float(result["wall_s"])
    return float(result["size_bytes"]) / wall if wall > 0 else 0.0


def aggregate_checkpoint(
    results: Sequence[Mapping[str, Any]], phase_wall_s: float | None = None
) -> dict[str, Any]:
    """One checkpoint: ``results[r]`` is rank r's ``SaveResult.to_dict()`` (or the load result).

    ``phase_wall_s`` is the barrier-to-barrier time seen by rank 0, which also includes the
    ranks' open/setup skew; it is reported beside the per-rank maximum, never instead of it.
    """
    if not results:
        raise ValueError("aggregate_checkpoint needs at least one rank's result")
    walls = [float(r["wall_s"]) for r in results]
    rates = [rank_throughput(r) for r in results]
    total = sum(int(r["size_bytes"]) for r in results)
    duration = max(walls)
    counts: dict[str, int] = {}
    per_rank_label: dict[str, int] = {}
    for r in results:
        for label, n in r.get("bottleneck_counts", {}).items():
            counts[label] = counts.get(label, 0) + int(n)
        label = str(r.get("bottleneck", "?"))
        per_rank_label[label] = per_rank_label.get(label, 0) + 1
    slowest = max(range(len(walls)), key=walls.__getitem__)
    fastest = min(range(len(walls)), key=walls.__getitem__)
    return {
        "ranks": len(results),
        "total_bytes": total,
        "duration_s": duration,
        "throughput_bps": total / duration if duration > 0 else 0.0,
        "min_rank_throughput_bps": min(rates),
        "aggregate_bandwidth_bps": sum(rates),
        "slowest_rank": {"rank": slowest, "wall_s": walls[slowest], "throughput_bps": rates[slowest]},
        "fastest_rank": {"rank": fastest, "wall_s": walls[fastest], "throughput_bps": rates[fastest]},
        "straggler_ratio": walls[slowest] / walls[fastest] if walls[fastest] > 0 else 0.0,
        "bottleneck_counts": counts,
        "rank_bottlenecks": per_rank_label,
        "phase_wall_s": phase_wall_s,
        "per_rank": [
            {
                "rank": i,
                "size_bytes": int(r["size_bytes"]),
                "wall_s": walls[i],
                "throughput_bps": rates[i],
                "bottleneck": r.get("bottleneck"),
                "bottleneck_counts": dict(r.get("bottleneck_counts", {})),
                "cpu_s_per_gb": r.get("cpu_s_per_gb"),  # null from a rank older than 2.2
                **{k: r.get("metadata", {}).get(k) for k in RANK_METADATA},
            }
            for i, r in enumerate(results)
        ],
    }


def summarize(checkpoints: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Mean and sample stdev (0 for one checkpoint) of each figure over repeated checkpoints."""
    if not checkpoints:
        raise ValueError("summarize needs at least one checkpoint")
    out: dict[str, Any] = {"checkpoints": len(checkpoints), "total_bytes": checkpoints[0]["total_bytes"]}
    for key in SUMMARY_FIGURES:
        values = [float(c[key]) for c in checkpoints]
        out[f"{key}_mean"] = statistics.fmean(values)
        out[f"{key}_stdev"] = statistics.stdev(values) if len(values) > 1 else 0.0
    slow: dict[int, int] = {}
    for c in checkpoints:
        r = int(c["slowest_rank"]["rank"])
        slow[r] = slow.get(r, 0) + 1
    out["slowest_rank_counts"] = {str(k): v for k, v in sorted(slow.items())}
    counts: dict[str, int] = {}
    for c in checkpoints:
        for label, n in c["bottleneck_counts"].items():
            counts[label] = counts.get(label, 0) + int(n)
    out["bottleneck_counts"] = counts
    return out

"""Runs a benchmark plan through :class:`AsyncCheckpointer` and collects the results."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from typing import Any

from ..checkpointer import AsyncCheckpointer
from ..config import CheckpointConfig
from ..metrics import SaveResult
from ..report import Progress, format_comparison, format_summary


@dataclass(frozen=True, kw_only=True)
class BenchPlan:
    target: str | None
    size: int
    config: CheckpointConfig
    methods: tuple[str, ...] = ("streaming",)
    repeat: int = 1
    keep: bool = False
    progress: bool = True
    verbose: bool = True

    def with_target(self, target: str) -> BenchPlan:
        return replace(self, target=target)


@dataclass(frozen=True)
class BenchReport:
    plan: BenchPlan
    results: list[SaveResult]
    text: str

    def summary(self) -> dict[str, dict[str, float]]:
        """Mean and stdev of throughput and duration per method (MLPerf reports both)."""
        out: dict[str, dict[str, float]] = {}
        for method in self.plan.methods:
            rs = [r for r in self.results if r.method == method]
            tput = [r.throughput_bps for r in rs]
            dur = [r.wall_s for r in rs]
            out[method] = {
                "runs": len(rs),
                "throughput_bps_mean": statistics.fmean(tput),
                "throughput_bps_stdev": statistics.stdev(tput) if len(tput) > 1 else 0.0,
                "duration_s_mean": statistics.fmean(dur),
                "duration_s_stdev": statistics.stdev(dur) if len(dur) > 1 else 0.0,
            }
        return out

    def to_json(self, *, records: bool = False) -> dict[str, Any]:
        return {
            "size_bytes": self.plan.size,
            "target": self.plan.target,
            "summary": self.summary(),
            "results": [r.to_dict(include_records=records) for r in self.results],
        }


async def run_plan(plan: BenchPlan) -> BenchReport:
    """Save ``repeat`` checkpoints per method; remove them afterwards unless ``keep``."""
    assert plan.target is not None
    results: list[SaveResult] = []
    async with AsyncCheckpointer(plan.config) as ckpt:
        for method in plan.methods:
            for i in range(plan.repeat):
                progress = Progress(plan.size, f"{method} {i + 1}/{plan.repeat}") if plan.progress else None
                results.append(await ckpt.save(plan.target, plan.size, method=method, progress=progress))
        if not plan.keep:
            await ckpt.delete(plan.target)
    blocks = [str(r) for r in results] if plan.verbose else []
    blocks.append(format_comparison(results))
    if len(results) > 1:
        blocks.append(format_summary(BenchReport(plan, results, "").summary()))
    return BenchReport(plan, results, "\n\n".join(blocks))

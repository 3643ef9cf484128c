"""Runs a benchmark plan through :class:`AsyncCheckpointer` and collects the results."""

from __future__ import annotations

import statistics
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from ..blocking import run_blocking
from ..checkpointer import AsyncCheckpointer
from ..config import CheckpointConfig
from ..results.records import LoadResult, Result
from ..results.schema import SCHEMA_VERSION
from .guard import Writes
from .load_args import drop_caches
from .progress import progress_bar
from .report import format_comparison, format_phases, format_summary


@dataclass(frozen=True, kw_only=True)
class BenchPlan:
    target: str | None
    size: int
    config: CheckpointConfig
    methods: tuple[str, ...] = ("streaming",)
    repeat: int = 1
    keep: bool = False
    overwrite: bool = False  # replace a target that is not an asyncckpt checkpoint
    progress: bool = True
    verbose: bool = True
    # load phase (--mode): "save" (writes only), "load" (reads an existing target), "both"
    mode: str = "save"
    reads: int = 1
    verify: bool | str = "checksum"
    num_readers: int | None = None
    read_chunk_size: int | None = None
    drop_caches: bool = False
    defeat_cache: bool = True

    def with_target(self, target: str) -> BenchPlan:
        return replace(self, target=target)


@dataclass(frozen=True)
class BenchReport:
    plan: BenchPlan
    results: list[Result]
    text: str

    def summary(self) -> dict[str, dict[str, float]]:
        """Mean and stdev of throughput and duration per method (MLPerf reports both)."""
        out: dict[str, dict[str, float]] = {}
        for method in self.plan.methods:
            rs = [r for r in self.results if r.method == method and r.operation == "save"]
            if rs:
                out[method] = method_stats(rs)
        loads = [r for r in self.results if r.operation == "load"]
        if loads:
            out["load"] = method_stats(loads)
        return out

    def to_json(self, *, records: bool = False) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "mode": "single",
            "size_bytes": self.plan.size,
            "target": self.plan.target,
            "summary": self.summary(),
            "results": [r.to_dict(include_records=records) for r in self.results],
        }


def method_stats(rs: list[Result]) -> dict[str, float]:
    """Mean and stdev of one method's runs (what ``format_phases``/``format_summary`` show)."""
    tput = [r.throughput_bps for r in rs]
    dur = [r.wall_s for r in rs]
    io = [r.size_bytes / r.io_s if r.io_s > 0 else 0.0 for r in rs]
    cpu = [c for r in rs if (c := r.cpu_s_per_gb) is not None]
    return {
        "runs": len(rs),
        "throughput_bps_mean": statistics.fmean(tput),
        "throughput_bps_stdev": statistics.stdev(tput) if len(tput) > 1 else 0.0,
        "duration_s_mean": statistics.fmean(dur),
        "duration_s_stdev": statistics.stdev(dur) if len(dur) > 1 else 0.0,
        "io_bps_mean": statistics.fmean(io),
        "io_bps_stdev": statistics.stdev(io) if len(io) > 1 else 0.0,
        **({"cpu_s_per_gb_mean": statistics.fmean(cpu)} if cpu else {}),
    }


async def run_plan(plan: BenchPlan) -> BenchReport:
    """Save ``repeat`` checkpoints per method, then (per ``mode``) load ``reads`` times;
    remove what its saves published unless ``keep`` (a load-only run publishes nothing)."""
    assert plan.target is not None
    results: list[Result] = []
    async with AsyncCheckpointer(plan.config) as ckpt:
        writes = Writes(ckpt, overwrite=plan.overwrite)
        try:
            if plan.mode in ("save", "both"):
                for method in plan.methods:
                    for i in range(plan.repeat):
                        # untimed: the freeing of a checkpoint the last save replaced runs after
                        # that save returned (issue 29); it must not slow the next measurement
                        await ckpt.storage.settle()
                        label = f"{method} {i + 1}/{plan.repeat}"
                        with progress_bar(plan.size, label, plan.progress) as bar:
                            results.append(
                                await writes.save(plan.target, plan.size, method=method, progress=bar)
                            )
            if plan.mode in ("load", "both"):
                await ckpt.storage.settle()  # untimed, as above: the reads measure the device alone
                results.extend(await run_loads(ckpt, plan))
        finally:
            if not plan.keep:
                await writes.remove_created()
    blocks = [str(r) for r in results] if plan.verbose else []
    blocks.append(format_comparison(results))
    summary = BenchReport(plan, results, "").summary()
    if "load" in summary:
        blocks.append(format_phases(summary))
    elif len(results) > 1:
        blocks.append(format_summary(summary))
    return BenchReport(plan, results, "\n\n".join(blocks))


async def run_loads(ckpt: AsyncCheckpointer, plan: BenchPlan) -> list[LoadResult]:
    """The read phase: optionally drop the page cache once, then ``reads`` verified loads."""
    assert plan.target is not None
    if plan.drop_caches:
        with ThreadPoolExecutor(1, thread_name_prefix="asyncckpt-bench") as pool:
            await run_blocking(pool, drop_caches)
    out = []
    for i in range(plan.reads):
        size = plan.size if plan.mode == "both" else 0
        with progress_bar(size, f"load {i + 1}/{plan.reads}", plan.progress) as bar:
            loaded = await ckpt.load(
                plan.target,
                verify=plan.verify,
                num_readers=plan.num_readers,
                read_chunk_size=plan.read_chunk_size,
                defeat_cache=plan.defeat_cache,
                progress=bar,
            )
        out.append(loaded)
    return out

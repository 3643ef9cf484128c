"""``--plan``: which rank writes which DLIO objects, before (or instead of) any I/O."""

from __future__ import annotations

from dataclasses import replace

from ..errors import ConfigError
from ..results.text import format_table
from .dlio_layout import (
    DLIO_COMMIT,
    DLIO_GB,
    KIND_TEXT,
    CheckpointPlan,
    DlioModel,
    kinds_in,
    num_parameters,
    plan_checkpoint,
    rank_groups,
    step_directory,
)


def resolve_model(m: DlioModel, ranks: int, reference_ranks: int | None = None) -> DlioModel:
    """Fill in ``data`` when ``ranks`` is a subset of the workload's world.

    Without ``model.parallelism.data``: a preset's full run (``reference_ranks``) sets it as
    mlpstorage does (closed rank count ÷ tensor × pipeline), and a rank count that is not a
    multiple of tensor × pipeline becomes a subset of the smallest whole world above it.
    """
    mp = m.model_parallelism
    if m.data > 0:
        return m
    if reference_ranks and ranks < reference_ranks:
        return replace(m, data=max(1, reference_ranks // mp))
    if ranks % mp:
        return replace(m, data=-(-ranks // mp))
    return m


def plan_ranks(m: DlioModel, asked: int | None, reference_ranks: int | None, world_size: int) -> int:
    """The rank count a plan is for: asked, else the workload's, else the job's, else one group."""
    if asked is not None:
        return asked
    if m.data > 0:
        return m.data * m.model_parallelism
    if reference_ranks:
        return reference_ranks
    return world_size if world_size > 1 else m.model_parallelism


def make_plan(m: DlioModel, ranks: int, reference_ranks: int | None = None) -> CheckpointPlan:
    if ranks < 1:
        raise ConfigError(f"--ranks must be >= 1, got {ranks}")
    return plan_checkpoint(resolve_model(m, ranks, reference_ranks), ranks)


def world_note(
    plan: CheckpointPlan, m: DlioModel, reference_ranks: int | None, reference_source: str | None
) -> str:
    """Where the workload's rank count came from (said on every plan and run of the workload
    ``m``, as written): a run on fewer ranks is a subset of it."""
    if m.data > 0:
        why = f"model.parallelism.data {m.data} x tensor {m.tensor} x pipeline {m.pipeline}"
    elif reference_source and plan.full_ranks == reference_ranks:
        why = reference_source
    elif plan.full_ranks == plan.ranks:
        why = "no model.parallelism.data and no MLPerf Storage workload of this model: this job's ranks"
    else:
        why = (
            "no model.parallelism.data: the smallest multiple of tensor x pipeline "
            f"({m.model_parallelism}) that holds this job"
        )
    return f"the workload's world: {plan.full_ranks} ranks: {why}"


def subset_note(plan: CheckpointPlan, full_bytes: int) -> str:
    """How a subset run's score relates to the full run's (said on every subset run)."""
    share = plan.total_bytes / full_bytes if full_bytes else 0.0
    return (
        f"subset: {plan.ranks} of the workload's {plan.full_ranks} ranks write {plan.total_bytes:,} of "
        f"{full_bytes:,} B per checkpoint ({share:.1%}); ranks 0..{plan.ranks - 1} write exactly what they "
        f"write in the full run. The throughput is these ranks' bytes ÷ their slowest rank's time; it "
        f"equals a full run's only if the storage scales linearly with the number of writing clients"
    )


def format_plan(plan: CheckpointPlan, scale: float = 1.0) -> str:
    m = plan.model
    dp = plan.data_parallelism
    full = plan_checkpoint(replace(m, data=dp), plan.full_ranks) if plan.subset else plan
    lines = [
        f"DLIO checkpoint layout (dlio_benchmark {DLIO_COMMIT[:8]}): {m.name}, "
        f"{num_parameters(m):,} parameters, {m.num_layers} layers",
        f"  tensor {m.tensor} x pipeline {m.pipeline} x data {dp} = {plan.full_ranks} ranks, "
        f"ZeRO {m.zero_stage}, "
        f"model {m.model_datatype}, optimizer {m.optimizer_datatype}",
        f"  this plan: {plan.ranks} rank(s)"
        + (" (full run)" if not plan.subset else f" of {plan.full_ranks}"),
        f"  per checkpoint: {plan.num_objects:,} objects in {step_directory(1, 1)}/ (step 1; the next "
        f"checkpoints in {step_directory(1, 2)}/, ...)",
        f"  total: {plan.total_bytes:,} B = {plan.total_bytes / DLIO_GB:,.2f} GiB (DLIO's 'GB') = "
        f"{plan.total_bytes / 1e9:,.2f} GB (10^9)",
    ]
    for kind, nbytes in plan.bytes_by_kind().items():
        count = sum(1 for r in plan.rank_plans for o in r.objects if o.kind == kind)
        lines.append(f"    {KIND_TEXT[kind]}: {count:,} objects, {nbytes:,} B ({nbytes / DLIO_GB:,.2f} GiB)")
    big = plan.largest()
    lines.append(
        f"  largest rank: {big.rank} with {big.nbytes:,} B "
        f"({big.nbytes / plan.total_bytes:.2%} of the total); "
        f"mean {plan.mean_rank_bytes:,.0f} B; imbalance (largest / mean) {plan.imbalance:.3f}"
        if plan.total_bytes
        else "  no rank writes anything"
    )
    if plan.subset:
        lines.append("  " + subset_note(plan, full.total_bytes))
    if scale != 1.0:
        lines.append(f"  --scale {scale:g}: a run writes every object at {scale:g} x its size")
    rows = []
    for first, last, sample in rank_groups(plan):
        kinds = kinds_in(sample.objects)
        what = ", ".join(f"{sum(1 for o in sample.objects if o.kind == k)} {k}" for k in kinds) or "nothing"
        rows.append(
            (
                f"{first}" if first == last else f"{first}-{last}",
                last - first + 1,
                len(sample.objects),
                f"{sample.nbytes:,}",
                f"{sample.nbytes / DLIO_GB:.3f}",
                what,
            )
        )
    table = format_table(("ranks", "count", "objects/rank", "bytes/rank", "GiB/rank", "objects"), rows)
    return "\n".join(lines) + "\n" + table

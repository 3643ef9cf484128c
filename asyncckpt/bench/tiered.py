"""``python -m asyncckpt.bench TARGET --local DIR``: a tiered checkpoint, measured.

A synthetic state of ``--size`` bytes (one array of seeded random bytes, made before anything
is timed) is saved ``--repeat`` times as steps of a tiered :class:`CheckpointManager`: each
commits under ``DIR``, then drains to ``TARGET`` (a directory or ``s3://bucket/prefix``). The
report gives, per step, the time to local durable (the save's start to its local commit), the
time to remote durable (to its remote commit) and the drain's throughput, and their medians
over the steps that were remote-committed (what a report quotes). Both roots must hold
no steps yet (nothing the bench did not create is overwritten); the steps it wrote are removed
afterwards unless ``--keep``.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..blocking import Offload, run_blocking
from ..config import CheckpointConfig
from ..errors import ConfigError
from ..manager import CheckpointManager
from ..results.schema import SCHEMA_VERSION
from ..results.text import format_table
from ..steps import delete_step, steps_under
from ..tiers import StepTiers


@dataclass(frozen=True)
class TieredPlan:
    remote: str
    local: str
    size: int
    config: CheckpointConfig
    steps: int = 1
    keep: bool = False


@dataclass(frozen=True)
class TieredReport:
    plan: TieredPlan
    steps: list[StepTiers]

    def summary(self) -> dict[str, float]:
        done = [s for s in self.steps if s.remote_commit_s is not None]
        if not done:
            return {"steps": len(self.steps), "remote_committed": 0}
        return {
            "steps": len(self.steps),
            "remote_committed": len(done),
            "local_commit_s_median": statistics.median(s.local_commit_s or 0.0 for s in done),
            "remote_commit_s_median": statistics.median(s.remote_commit_s or 0.0 for s in done),
            "drain_gb_per_s_median": statistics.median(s.drain_gb_per_s for s in done),
        }

    @property
    def text(self) -> str:
        rows: list[tuple[str, ...]] = [
            (
                str(s.step),
                _s(s.local_commit_s),
                _s(s.remote_commit_s),
                f"{s.bytes_drained / 1e9:.3f}",
                f"{s.drain_gb_per_s:.3f}",
                s.state + (f": {s.error}" if s.error else ""),
            )
            for s in self.steps
        ]
        summary = self.summary()
        if summary["remote_committed"] > 1:  # what a report quotes: the median over the steps
            done = f"{summary['remote_committed']:.0f} of {summary['steps']:.0f} remote-committed"
            rows.append(
                (
                    "median",
                    _s(summary["local_commit_s_median"]),
                    _s(summary["remote_commit_s_median"]),
                    "",
                    f"{summary['drain_gb_per_s_median']:.3f}",
                    done,
                )
            )
        headers = ("step", "local durable s", "remote durable s", "drained GB", "drain GB/s", "state")
        head = f"tiered: {self.plan.size} B per step, local {self.plan.local} -> remote {self.plan.remote}"
        return head + "\n" + format_table(headers, rows)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "mode": "tiered",
            "size_bytes": self.plan.size,
            "target": self.plan.remote,
            "local": self.plan.local,
            "summary": self.summary(),
            "steps": [asdict(s) for s in self.steps],
        }


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _state(size: int, seed: int) -> dict[str, Any]:
    """Seeded random bytes (incompressible: no store or link can shrink them)."""
    return {"data": np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)}


async def run_tiered(plan: TieredPlan) -> TieredReport:
    """Save ``plan.steps`` tiered steps and collect their figures; remove them unless ``keep``."""
    state = await run_blocking(Offload(1), _state, plan.size, plan.config.seed)
    async with CheckpointManager(plan.remote, local=plan.local, config=plan.config) as mgr:
        for root in (plan.remote, plan.local):
            if found := await steps_under(mgr.ckpt, root):
                raise ConfigError(
                    f"{root!r} already holds steps {found}: give an empty root (nothing is overwritten)"
                )
        try:
            for step in range(1, plan.steps + 1):
                await mgr.maybe_save(step, state)
                await mgr.wait()  # one step at a time: each measured alone
            assert mgr.tiers is not None
            figures = [mgr.tiers.stats.steps[s] for s in sorted(mgr.tiers.stats.steps)]
        finally:
            if not plan.keep:
                await mgr.wait()
                assert mgr.tiers is not None
                for root in (mgr.tiers.local, mgr.tiers.remote):
                    for step in await steps_under(mgr.ckpt, root):
                        await delete_step(mgr.ckpt, root, step)
    return TieredReport(plan, figures)

"""MLPerf Storage checkpoint workloads as presets: the workload files, not flat totals.

Each preset is the content of MLPerf Storage's ``configs/dlio/workload/llama3_*.yaml``
(mlcommons/storage; the same four files are kept in tests/fixtures/dlio/ and a test checks
they agree) plus the rank count of a full ("closed") run. What a rank writes comes from
:mod:`.dlio_layout`, so per-rank objects and bytes are uneven exactly as DLIO's are.
``published_dlio_gb`` is the checkpoint size MLPerf Storage states, in DLIO's unit
(1024**3 bytes per "GB"); docs/scaleout.md compares it with the planned total.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from typing import Any

from ..errors import ConfigError
from .dlio import parse_workload
from .dlio_layout import CheckpointPlan, DlioModel
from .dlio_plan import make_plan


def _workload(
    name: str, layers: int, tp: int, pp: int, zero: int, h: int, ffn: int, heads: int, kv: int
) -> dict[str, Any]:
    return {
        "model": {
            "name": name,
            "type": "transformer",
            "num_layers": layers,
            "model_datatype": "fp16",
            "optimizer_datatype": "fp32",
            "parallelism": {"tensor": tp, "pipeline": pp, "zero_stage": zero},
            "transformer": {
                "vocab_size": 128256,
                "hidden_size": h,
                "ffn_hidden_size": ffn,
                "num_attention_heads": heads,
                "num_kv_heads": kv,
            },
        },
        "framework": "pytorch",
        "workflow": {"generate_data": False, "train": False, "checkpoint": True},
        "checkpoint": {
            "checkpoint_folder": f"checkpoints/{name}",
            "time_between_checkpoints": 5,
            "num_checkpoints_write": 10,
            "num_checkpoints_read": 10,
            "fsync": True,
        },
    }


@dataclass(frozen=True)
class ModelPreset:
    name: str
    workload: dict[str, Any]  # the workload file's content
    ranks: int  # processes of a full (closed) MLPerf Storage run
    published_dlio_gb: float

    def document(self) -> dict[str, Any]:
        """A fresh copy of the workload document (overrides may change it)."""
        return copy.deepcopy(self.workload)

    def model(self) -> DlioModel:
        """The workload file's ``model:`` section, read."""
        model = parse_workload(self.document(), self.name).model
        assert model is not None
        return model

    def plan(self, ranks: int | None = None) -> CheckpointPlan:
        """The layout on ``ranks`` (default: the full run); fewer ranks are a subset of it."""
        return make_plan(
            self.model(), ranks or self.ranks, self.ranks
        )  # fewer ranks: a subset, as mlpstorage

    @property
    def checkpoint_bytes(self) -> int:
        """Planned bytes of one checkpoint of the full run."""
        return self.plan().total_bytes

    def describe(self, scale: float, world_size: int) -> dict[str, Any]:
        """What was used, for the output: preset, scale, and how the job compares."""
        if not 0 < scale <= 1:
            raise ConfigError(f"--scale must be in (0, 1], got {scale!r}")
        return {
            "model": self.name,
            "checkpoint_bytes": self.checkpoint_bytes,
            "published_dlio_gb": self.published_dlio_gb,
            "preset_ranks": self.ranks,
            "scale": scale,
            "world_size": world_size,
            "written_fraction": world_size / self.ranks,  # ranks of the full run this job has
        }


PRESETS: dict[str, ModelPreset] = {
    p.name: p
    for p in (
        ModelPreset("llama3-8b", _workload("llama_8b", 32, 1, 1, 3, 4096, 14336, 32, 8), 8, 105),
        ModelPreset("llama3-70b", _workload("llama_70b", 80, 8, 1, 3, 8192, 28672, 128, 8), 64, 912),
        ModelPreset("llama3-405b", _workload("llama_405b", 126, 8, 32, 1, 16384, 53248, 128, 8), 512, 5290),
        ModelPreset("llama3-1t", _workload("llama_1t", 128, 8, 64, 1, 25872, 98304, 192, 32), 1024, 18000),
    )
}


def preset_of(model: DlioModel) -> ModelPreset | None:
    """The preset whose workload has this model (a ``--config`` of MLPerf Storage's file): its
    full-run rank count then applies, as to ``--model``. ``parallelism.data`` is left out of the
    comparison: when a file sets it, it fixes the rank count itself."""
    for preset in PRESETS.values():
        if replace(preset.model(), data=-1) == replace(model, data=-1):
            return preset
    return None


def get_preset(name: str) -> ModelPreset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown model preset {name!r}; choose one of {', '.join(PRESETS)}") from None

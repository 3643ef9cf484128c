"""MLPerf Storage checkpoint workloads as presets: total checkpoint size and rank count.

Sizes are decimal (10**9 B per GB, 10**12 per TB) as MLPerf Storage states them. Each rank
writes ``checkpoint_bytes / ranks``; ``scale`` shrinks the whole checkpoint for a small
machine while keeping its shape (same rank count, every share scaled alike).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError

GB = 10**9
TB = 10**12


@dataclass(frozen=True)
class ModelPreset:
    name: str
    checkpoint_bytes: int
    ranks: int

    def per_rank_bytes(self, scale: float = 1.0) -> int:
        """One rank's share of the (scaled) checkpoint, in whole bytes."""
        if not 0 < scale <= 1:
            raise ConfigError(f"--scale must be in (0, 1], got {scale!r}")
        share = int(self.checkpoint_bytes * scale) // self.ranks
        if share < 1:
            raise ConfigError(f"--scale {scale!r} leaves {self.name} with less than one byte per rank")
        return share

    def describe(self, scale: float, world_size: int) -> dict[str, Any]:
        """What was used, for the output: preset, scale, shares, and how the job compares."""
        share = self.per_rank_bytes(scale)
        return {
            "model": self.name,
            "checkpoint_bytes": self.checkpoint_bytes,
            "preset_ranks": self.ranks,
            "scale": scale,
            "per_rank_bytes": share,
            "scaled_checkpoint_bytes": share * self.ranks,
            "world_size": world_size,
            "written_fraction": world_size / self.ranks,
        }


PRESETS: dict[str, ModelPreset] = {
    p.name: p
    for p in (
        ModelPreset("llama3-8b", 105 * GB, 8),
        ModelPreset("llama3-70b", 912 * GB, 64),
        ModelPreset("llama3-405b", 5290 * GB, 512),
        ModelPreset("llama3-1t", 18 * TB, 1024),
    )
}


def get_preset(name: str) -> ModelPreset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown model preset {name!r}; choose one of {', '.join(PRESETS)}") from None

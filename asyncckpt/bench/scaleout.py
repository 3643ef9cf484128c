"""Bench options for scale-out runs: MLPerf model presets, DLIO YAML configs, shard layout.

Presets and config files only supply *defaults*; anything on the command line wins. The
parser is run twice: once to find ``--config``/``--model``/``--scale``, then for real with
the new defaults installed, so ``--config w.yaml --num-buffers 4`` means what it says.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from .dlio import load_workload
from .presets import PRESETS, get_preset

DEFAULT_LAYOUT = "rank{rank:05d}.bin"


@dataclass
class ScaleoutInfo:
    """What presets/config files did to the arguments, for the output and the JSON."""

    notes: list[str] = field(default_factory=list)  # said on stderr by rank 0
    preset: dict[str, Any] | None = None
    config_file: str | None = None
    config_defaults: dict[str, Any] = field(default_factory=dict)
    config_unused: list[str] = field(default_factory=list)


def add_scaleout_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("scale-out (mpirun -np N python -m asyncckpt.bench ...)")
    g.add_argument("--model", choices=sorted(PRESETS), default=None, help="MLPerf checkpoint preset")
    g.add_argument("--scale", type=float, default=1.0, help="shrink the preset checkpoint (0 < s <= 1)")
    g.add_argument("--config", default=None, metavar="FILE", help="DLIO-style workload YAML")
    g.add_argument(
        "--layout",
        default=DEFAULT_LAYOUT,
        help="shard name under TARGET per rank; fields {rank} {size} {local_rank} (rank{rank:05d}.bin)",
    )
    g.add_argument("--mkdirs", action="store_true", help="rank 0 creates the layout's subdirectories")


def _dests(p: argparse.ArgumentParser) -> set[str]:
    return {a.dest for a in p._actions}


def parse_with_presets(
    p: argparse.ArgumentParser, argv: Sequence[str] | None, world_size: int = 1
) -> tuple[argparse.Namespace, ScaleoutInfo]:
    """Parse ``argv`` with defaults from ``--config`` then ``--model`` (later wins)."""
    first, _ = p.parse_known_args(argv)
    info = ScaleoutInfo()
    dests = _dests(p)
    defaults: dict[str, Any] = {}
    if first.config:
        wl = load_workload(first.config)
        info.config_file, info.config_defaults = wl.path, dict(wl.defaults)
        info.config_unused = wl.unknown + wl.unused
        info.notes += wl.warnings()
        if wl.defaults.get("num_checkpoints_write") == 0 == wl.defaults.get("num_checkpoints_read"):
            raise ConfigError(f"{wl.path}: num_checkpoints_write and num_checkpoints_read are both 0")
        for key, value in wl.defaults.items():
            dest = key
            if key == "num_checkpoints_write" and key not in dests:
                dest = "repeat"  # the save loop's count (the load path names it --num-checkpoints-write)
            if key in ("num_checkpoints_write", "num_checkpoints_read") and value == 0:
                if "mode" not in dests and key == "num_checkpoints_write":
                    raise ConfigError(f"{wl.path}: num_checkpoints_write=0 but this build only saves")
                if "mode" in dests:  # 0 writes: read an existing checkpoint; 0 reads: only save
                    defaults["mode"] = "load" if key == "num_checkpoints_write" else "save"
                continue
            if dest in dests:
                defaults[dest] = value
            else:
                info.notes.append(f"{wl.path}: {key}={value!r} has no effect (this build has no such option)")
    if first.model:
        preset = get_preset(first.model)
        defaults["size"] = preset.per_rank_bytes(first.scale)
        info.preset = preset.describe(first.scale, world_size)
        share = defaults["size"]
        info.notes.append(
            f"preset {preset.name}: checkpoint {preset.checkpoint_bytes / 1e9:g} GB over {preset.ranks} "
            f"ranks, scale {first.scale:g} → {share:,} B per rank; this run has {world_size} rank(s)"
        )
    elif first.scale != 1.0:
        raise ConfigError("--scale applies to a --model preset; give --model too")
    p.set_defaults(**defaults)
    args = p.parse_args(argv)
    if args.model and args.size != defaults.get("size"):
        info.notes.append(f"--size {args.size:,} B overrides the {args.model} per-rank share")
    return args, info

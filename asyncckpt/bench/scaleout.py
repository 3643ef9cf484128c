"""Bench options for scale-out runs: MLPerf model presets, DLIO YAML configs, shard layout.

Presets and config files only supply *defaults*; anything on the command line wins. The
parser is run twice: once to find ``--config``/``--model``/``--scale``, then for real with
the new defaults installed, so ``--config w.yaml --num-buffers 4`` means what it says.
A preset is a workload document; ``--config`` is merged over it, then the Hydra-style
``+``/``++`` overrides (:mod:`.overrides`) are applied, then the result is read once.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from .dlio import WorkloadConfig, parse_workload, read_workload
from .dlio_layout import DlioModel
from .overrides import apply_overrides, split_overrides
from .presets import PRESETS, get_preset, preset_of

DEFAULT_LAYOUT = "rank{rank:05d}.bin"


@dataclass
class ScaleoutInfo:
    """What presets/config files did to the arguments, for the output and the JSON."""

    notes: list[str] = field(default_factory=list)  # said on stderr by rank 0
    preset: dict[str, Any] | None = None
    config_file: str | None = None
    config_defaults: dict[str, Any] = field(default_factory=dict)
    config_unused: list[str] = field(default_factory=list)
    workload: WorkloadConfig | None = None  # set when DLIO's layout is to be planned or written
    reference_ranks: int | None = None  # a preset's full-run rank count
    reference_source: str | None = None  # where reference_ranks came from (said to the user)
    overrides: list[str] = field(default_factory=list)  # the +/++ tokens as given
    command: list[str] = field(default_factory=list)  # argv as given (for results metadata)


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
    g.add_argument(
        "--plan", action="store_true", help="print the workload's per-rank objects and bytes; write nothing"
    )
    g.add_argument("--ranks", type=int, default=None, help="rank count for --plan (default: the workload's)")
    g.add_argument(
        "--results-dir",
        default=None,
        metavar="DIR",
        help="write MLPerf-style summary.json and metadata to DIR",
    )


def _dests(p: argparse.ArgumentParser) -> set[str]:
    return {a.dest for a in p._actions}


def _merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _load(first: argparse.Namespace, overrides: list[Any], info: ScaleoutInfo) -> WorkloadConfig | None:
    """Preset document, ``--config`` merged over it, then the overrides: read once."""
    doc: dict[str, Any] | None = None
    path = ""
    if first.model:
        preset = get_preset(first.model)
        doc, path, info.reference_ranks = preset.document(), f"preset {preset.name}", preset.ranks
        del doc["checkpoint"]["checkpoint_folder"]  # a preset writes to TARGET, not to ./checkpoints
    if first.config:
        file_doc = read_workload(first.config)
        doc = file_doc if doc is None else _merge(doc, file_doc)
        path = str(first.config)
    if overrides:
        if doc is None:
            raise ConfigError(
                f"override {overrides[0].text!r} applies to a workload: give --config FILE or --model NAME"
            )
        doc = apply_overrides(doc, overrides)
    return None if doc is None else parse_workload(doc, path)


def _reference(model_flag: str | None, model: DlioModel, path: str, info: ScaleoutInfo) -> None:
    """The full-run rank count of MLPerf Storage's workload: from ``--model``, or from a
    ``--config`` file whose model is one of the presets' (the same workload, the same ranks)."""
    if model_flag:
        info.reference_source = f"MLPerf Storage's full run of {model_flag}"
        return
    preset = preset_of(model)
    if preset is not None:
        info.reference_ranks = preset.ranks
        info.reference_source = (
            f"MLPerf Storage's full run of {preset.name} ({path} has that workload's model)"
        )


def parse_with_presets(
    p: argparse.ArgumentParser, argv: Sequence[str] | None, world_size: int = 1
) -> tuple[argparse.Namespace, ScaleoutInfo]:
    """Parse ``argv`` with defaults from ``--model``, ``--config`` and overrides (later wins)."""
    info = ScaleoutInfo(command=list(sys.argv[1:] if argv is None else argv))
    argv, overrides, ignored = split_overrides(info.command)
    info.overrides = [o.text for o in overrides]
    info.notes += [f"{t}: Hydra's own setting, no effect here" for t in ignored]
    first, _ = p.parse_known_args(argv)
    dests = _dests(p)
    defaults: dict[str, Any] = {}
    wl = _load(first, overrides, info)
    if wl is not None and wl.model is not None:
        info.workload = wl
        _reference(first.model, wl.model, wl.path, info)
    if wl is not None:
        info.config_file, info.config_defaults = wl.path, dict(wl.defaults)
        if first.config:  # a preset's own sections are known; its overrides may add unknown keys
            info.config_unused = wl.unknown + wl.unused
            info.notes += wl.warnings()
        elif wl.unknown:
            info.config_unused = list(wl.unknown)
            info.notes += wl.warnings()[:1]
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
        target = wl.defaults.get("target")
        if target and info.workload is None and world_size == 1:  # a folder: one shard inside it
            defaults["target"] = target.rstrip("/") + "/checkpoint.bin"
    if first.model:
        preset = get_preset(first.model)
        info.preset = preset.describe(first.scale, world_size)
    if first.scale != 1.0 and info.workload is None:
        raise ConfigError("--scale applies to a --model preset or a workload's model: give --model too")
    if not 0 < first.scale <= 1:
        raise ConfigError(f"--scale must be in (0, 1], got {first.scale!r}")
    if (first.plan or first.ranks is not None) and info.workload is None:
        raise ConfigError(
            "--plan/--ranks need a workload: --model NAME or --config FILE with a model: section"
        )
    if first.ranks is not None and first.ranks < 1:
        raise ConfigError(f"--ranks must be >= 1, got {first.ranks}")
    p.set_defaults(**defaults)
    args = p.parse_args(argv)
    if info.workload is not None and any(a == "--size" or a.startswith("--size=") for a in argv):
        info.notes.append("--size is not used: the workload's layout sets every object's size")
    return args, info

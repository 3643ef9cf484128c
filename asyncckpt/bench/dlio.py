"""DLIO-style workload YAML (the ``checkpoint:`` section) → benchmark argument defaults.

Existing workload files run unchanged: the keys asyncckpt understands become defaults that
the command line can still override; every key it does not use is *reported* (a warning
listing them), never dropped silently, so a user knows which part of the file had no effect.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..units import parse_size

#: checkpoint keys → argument destination (values converted by the functions below)
CHECKPOINT_KEYS = ("checkpoint_folder", "num_checkpoints_write", "num_checkpoints_read", "fsync", "streaming")
STREAMING_KEYS = ("enabled", "chunk_size", "num_buffers", "use_dgen", "backend")
#: DLIO keys that describe training cadence, meaningless for a storage benchmark
CADENCE_KEYS = (
    "steps_between_checkpoints",
    "epochs_between_checkpoints",
    "checkpoint_after_epoch",
    "checkpoint_mechanism",
    "model_size",
    "optimization_groups",
    "num_layers",
    "layer_parameters",
    "type",
)


@dataclass
class WorkloadConfig:
    """Defaults taken from a file, plus what in it had no effect (for the warning)."""

    path: str
    defaults: dict[str, Any] = field(default_factory=dict)
    unknown: list[str] = field(default_factory=list)  # keys asyncckpt does not know
    unused: list[str] = field(default_factory=list)  # known DLIO keys/sections with no meaning here

    def warnings(self) -> list[str]:
        out = []
        if self.unknown:
            out.append(f"{self.path}: unknown keys ignored: {', '.join(self.unknown)}")
        if self.unused:
            out.append(f"{self.path}: not used by this benchmark: {', '.join(self.unused)}")
        return out


def _int(key: str, value: object, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{key} must be an integer >= {minimum}, got {value!r}")
    return value


def _bool(key: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{key} must be true or false, got {value!r}")
    return value


def _size(key: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigError(f"{key} must be a byte count such as 33554432 or 32MiB, got {value!r}")
    return parse_size(value, name=key)


def parse_workload(data: object, path: str = "<config>") -> WorkloadConfig:
    """Map a loaded YAML document to argument defaults (``dest`` names of the bench CLI)."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    out = WorkloadConfig(path)
    out.unused += sorted(f"{k}:" for k in data if k != "checkpoint")
    ckpt = data.get("checkpoint")
    if ckpt is None:
        raise ConfigError(f"{path}: no 'checkpoint:' section")
    if not isinstance(ckpt, Mapping):
        raise ConfigError(f"{path}: 'checkpoint' must be a mapping, got {ckpt!r}")
    d = out.defaults
    for key, value in ckpt.items():
        name = f"checkpoint.{key}"
        if key == "checkpoint_folder":
            if not isinstance(value, str) or not value:
                raise ConfigError(f"{name} must be a path or URI, got {value!r}")
            d["target"] = value
        elif key == "num_checkpoints_write":
            d["num_checkpoints_write"] = _int(name, value, 0)
        elif key == "num_checkpoints_read":
            d["num_checkpoints_read"] = _int(name, value, 0)
        elif key == "fsync":
            d["no_fsync"] = not _bool(name, value)
        elif key == "streaming":
            _streaming(value, out)
        elif key in CADENCE_KEYS:
            out.unused.append(name)
        else:
            out.unknown.append(name)
    return out


def _streaming(block: object, out: WorkloadConfig) -> None:
    if not isinstance(block, Mapping):
        raise ConfigError(f"{out.path}: checkpoint.streaming must be a mapping, got {block!r}")
    d = out.defaults
    for key, value in block.items():
        name = f"checkpoint.streaming.{key}"
        if key == "enabled":
            d["method"] = "streaming" if _bool(name, value) else "preallocate"
        elif key == "chunk_size":
            d["chunk_size"] = _size(name, value)
        elif key == "num_buffers":
            d["num_buffers"] = _int(name, value)
        elif key == "use_dgen":
            d["generator"] = "dgen" if _bool(name, value) else "numpy"
        elif key == "backend":
            if not isinstance(value, str) or not value:
                raise ConfigError(f"{name} must be a backend name, got {value!r}")
            d["backend"] = value
        else:
            out.unknown.append(name)


def load_workload(path: str | Path) -> WorkloadConfig:
    """Read and map a YAML workload file (clear errors for a missing or malformed file)."""
    import yaml

    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"--config {str(p)!r}: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"--config {str(p)!r} is not valid YAML: {exc}") from None
    return parse_workload(data, str(p))

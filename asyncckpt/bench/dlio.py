"""DLIO-style workload YAML (``checkpoint:`` and ``model:``) → benchmark settings.

Existing workload files run unchanged: the keys asyncckpt understands become defaults that
the command line can still override; every key it does not use is *reported* (a warning
listing them), never dropped silently, so a user knows which part of the file had no effect.
A ``model:`` section with a shape (``num_layers`` or ``model_size_bytes``) makes the run
write DLIO's checkpoint layout (:mod:`.dlio_layout`) instead of one shard per rank.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..units import parse_size
from .dlio_layout import DlioModel

#: checkpoint keys → argument destination (values converted by the functions below)
CHECKPOINT_KEYS = (
    "checkpoint_folder",
    "num_checkpoints_write",
    "num_checkpoints_read",
    "fsync",
    "streaming",
    "time_between_checkpoints",
    "mode",
)
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
    "recovery_rank_shift",
    "rank_sync",
    "randomize_tensor",
    "checkpoint_mechanism_classname",
    "ksm",
)
#: ``model:`` keys → DlioModel fields (``parallelism:`` and ``transformer:`` are nested)
MODEL_KEYS = ("name", "type", "num_layers", "model_datatype", "optimizer_datatype", "model_size_bytes")
PARALLELISM_KEYS = {"tensor": "tensor", "pipeline": "pipeline", "zero_stage": "zero_stage", "data": "data"}
TRANSFORMER_KEYS = ("vocab_size", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_kv_heads")
#: DLIO's legacy hand-written layouts: a plan from them would not match what DLIO writes here
LEGACY_MODEL_KEYS = ("optimization_groups", "layer_parameters")


@dataclass
class WorkloadConfig:
    """Defaults taken from a file, plus what in it had no effect (for the warning)."""

    path: str
    defaults: dict[str, Any] = field(default_factory=dict)
    unknown: list[str] = field(default_factory=list)  # keys asyncckpt does not know
    unused: list[str] = field(default_factory=list)  # known DLIO keys/sections with no meaning here
    model: DlioModel | None = None  # set when ``model:`` describes a shape: DLIO's layout is written
    time_between_checkpoints: float = 0.0  # emulated compute before each checkpoint (seconds)
    subset: bool = False  # ``checkpoint.mode: subset``
    document: dict[str, Any] = field(default_factory=dict)  # the file as loaded (+ overrides)

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
    out = WorkloadConfig(path, document=dict(data))
    out.unused += sorted(f"{k}:" for k in data if k not in ("checkpoint", "model"))
    if data.get("model") is not None:
        _model(data["model"], out)
    ckpt = data.get("checkpoint")
    if ckpt is None:
        raise ConfigError(f"{path}: no 'checkpoint:' section")
    d = out.defaults
    for key, value, name in _entries(ckpt, f"{path}: 'checkpoint'", "checkpoint"):
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
        elif key == "time_between_checkpoints":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"{name} must be a number of seconds, got {value!r}")
            out.time_between_checkpoints = max(0.0, float(value))  # DLIO's default -1: none
        elif key == "mode":
            if value not in ("default", "subset"):
                raise ConfigError(f"{name} must be default or subset, got {value!r}")
            out.subset = value == "subset"
        elif key in CADENCE_KEYS:
            out.unused.append(name)
        else:
            out.unknown.append(name)
    return out


def _model(block: object, out: WorkloadConfig) -> None:
    """``model:`` → :class:`DlioModel` when it describes a shape, else reported as unused."""
    if not isinstance(block, Mapping):
        raise ConfigError(f"{out.path}: 'model' must be a mapping, got {block!r}")
    fields: dict[str, Any] = {}
    for key, value in block.items():
        name = f"model.{key}"
        if key in ("name", "type", "model_datatype", "optimizer_datatype"):
            if not isinstance(value, str):
                raise ConfigError(f"{name} must be a string, got {value!r}")
            fields[key] = value
        elif key in ("num_layers", "model_size_bytes"):
            fields[key] = _int(name, value, -1)
        elif key == "parallelism":
            fields.update(_ints(value, f"{name}", PARALLELISM_KEYS, out))
        elif key == "transformer":
            fields.update(_ints(value, f"{name}", {k: k for k in TRANSFORMER_KEYS}, out))
        elif key in LEGACY_MODEL_KEYS:
            raise ConfigError(
                f"{name}: DLIO's hand-written legacy layout is not modelled; describe the transformer "
                "(num_layers, transformer:, parallelism:) instead"
            )
        else:
            out.unknown.append(name)
    if fields.get("num_layers", -1) > 0 or "model_size_bytes" in fields:
        out.model = DlioModel(**fields)
    else:
        out.unused.append("model: (no num_layers or model_size_bytes: no DLIO layout)")


def _ints(block: object, where: str, keys: Mapping[str, str], out: WorkloadConfig) -> dict[str, int]:
    if not isinstance(block, Mapping):
        raise ConfigError(f"{out.path}: {where} must be a mapping, got {block!r}")
    found: dict[str, int] = {}
    for key, value in block.items():
        if key in keys:
            found[keys[key]] = _int(f"{where}.{key}", value, -1 if key == "data" else 0)
        else:
            out.unknown.append(f"{where}.{key}")
    return found


def _entries(block: object, what: str, section: str) -> Iterator[tuple[str, Any, str]]:
    """(key, value, dotted name) of a mapping section of the workload; ``what`` names it in the
    error when it is not a mapping."""
    if not isinstance(block, Mapping):
        raise ConfigError(f"{what} must be a mapping, got {block!r}")
    for key, value in block.items():
        yield key, value, f"{section}.{key}"


def _streaming(block: object, out: WorkloadConfig) -> None:
    d = out.defaults
    for key, value, name in _entries(block, f"{out.path}: checkpoint.streaming", "checkpoint.streaming"):
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


def read_workload(path: str | Path) -> dict[str, Any]:
    """The YAML document of a workload file (clear errors for a missing or malformed file)."""
    import yaml

    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as exc:
        raise ConfigError(f"--config {str(p)!r}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"--config {str(p)!r} is not valid YAML: {exc}") from None
    if not isinstance(data, Mapping):
        raise ConfigError(f"{p}: expected a mapping at the top level, got {type(data).__name__}")
    return dict(data)


def load_workload(path: str | Path) -> WorkloadConfig:
    """Read and map a YAML workload file."""
    return parse_workload(read_workload(path), str(path))

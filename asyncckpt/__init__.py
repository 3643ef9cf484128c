"""asyncckpt: stream ML checkpoints to files and object stores from asyncio, and measure
the storage honestly (per-chunk bottlenecks, pure generation vs pure I/O time)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from . import moved
from .errors import (
    AsyncCkptError,
    ChecksumMismatchError,
    CollectiveError,
    ConfigError,
    DirectIOError,
    DirectIOUnavailableError,
    IntegrityError,
    ManifestError,
    ManifestMissingError,
    MissingDependencyError,
    NoSpaceError,
    PreemptDeadlineError,
    PreemptedError,
    SaveAbandonedError,
    SourceChangedError,
    StallError,
    StateFormatError,
    StepNotCommittedError,
    StorageError,
    StoragePermissionError,
    TargetNotFoundError,
    TruncatedError,
    UnsupportedSchemeError,
    UnverifiableError,
    WriterProcessError,
)
from .secrets import Secret
from .units import GiB, KiB, MiB, parse_size

if TYPE_CHECKING:
    from .checkpointer import AsyncCheckpointer
    from .config import CheckpointConfig
    from .manager import CheckpointManager, ManagerStats
    from .results.metrics import ChunkRecord, ReadRecord
    from .results.records import LoadResult, RunMetadata, SaveResult
    from .state.shard import Shard

#: the classes of the engine, imported on first use (PEP 562): ``import asyncckpt`` (which
#: every submodule's import runs first, in writer processes and in ``python -m
#: asyncckpt.bench`` before its CLI can catch a Ctrl-C) then loads no pipeline, numpy or sinks
_LAZY = {
    "AsyncCheckpointer": "checkpointer",
    "CheckpointConfig": "config",
    "CheckpointManager": "manager",
    "ManagerStats": "manager",
    "ChunkRecord": "results.metrics",
    "ReadRecord": "results.metrics",
    "LoadResult": "results.records",
    "RunMetadata": "results.records",
    "SaveResult": "results.records",
    "Shard": "state.shard",
}


def __getattr__(name: str) -> Any:
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{where}"), name)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


moved.install()  # the pre-0.2 module paths (asyncckpt.collectives, ...) keep importing

__version__ = "0.1.0"

__all__ = [
    "AsyncCheckpointer",
    "AsyncCkptError",
    "CheckpointConfig",
    "CheckpointManager",
    "ChecksumMismatchError",
    "ChunkRecord",
    "CollectiveError",
    "ConfigError",
    "DirectIOError",
    "DirectIOUnavailableError",
    "GiB",
    "IntegrityError",
    "KiB",
    "LoadResult",
    "ManagerStats",
    "ManifestError",
    "ManifestMissingError",
    "MiB",
    "MissingDependencyError",
    "NoSpaceError",
    "PreemptDeadlineError",
    "PreemptedError",
    "ReadRecord",
    "RunMetadata",
    "SaveAbandonedError",
    "SaveResult",
    "Secret",
    "Shard",
    "SourceChangedError",
    "StallError",
    "StateFormatError",
    "StepNotCommittedError",
    "StorageError",
    "StoragePermissionError",
    "TargetNotFoundError",
    "TruncatedError",
    "UnsupportedSchemeError",
    "UnverifiableError",
    "WriterProcessError",
    "__version__",
    "parse_size",
]

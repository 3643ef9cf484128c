"""asyncckpt: stream ML checkpoints to files and object stores from asyncio, and measure
the storage honestly (per-chunk bottlenecks, pure generation vs pure I/O time)."""

from __future__ import annotations

from . import moved
from .checkpointer import AsyncCheckpointer
from .config import CheckpointConfig
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
from .manager import CheckpointManager, ManagerStats
from .results.metrics import ChunkRecord, ReadRecord
from .results.records import LoadResult, RunMetadata, SaveResult
from .secrets import Secret
from .state.shard import Shard
from .units import GiB, KiB, MiB, parse_size

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

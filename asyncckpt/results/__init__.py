"""Results: the per-chunk records, the run results built from them, their text form and schema.

Plain data only: everything below this layer produces these, everything above reads them.
"""

from __future__ import annotations

from .metrics import ChunkRecord, ReadRecord
from .records import LoadResult, Result, RunMetadata, RunResult, RunSetup, SaveResult, result_from_dict

__all__ = [
    "ChunkRecord",
    "LoadResult",
    "ReadRecord",
    "Result",
    "RunMetadata",
    "RunResult",
    "RunSetup",
    "SaveResult",
    "result_from_dict",
]

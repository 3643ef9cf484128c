"""Writer-process isolation: run any sink in a child process fed from a shared-memory pool."""

from __future__ import annotations

from ..shm import SharedArena, SharedBufferPool
from .policy import ISOLATIONS, START_METHOD_ENV, START_METHODS, WriterPolicy, resolve_policy
from .process_sink import ProcessSink

__all__ = [
    "ISOLATIONS",
    "START_METHODS",
    "START_METHOD_ENV",
    "ProcessSink",
    "SharedArena",
    "SharedBufferPool",
    "WriterPolicy",
    "resolve_policy",
]

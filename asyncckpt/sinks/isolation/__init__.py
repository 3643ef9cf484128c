"""Writer-process isolation: run any sink in a child process fed from a shared-memory pool.

Importing this package stays light (``config`` imports the policy): ``ProcessSink``, which
pulls in the sink registry, is loaded on first use, so a sinks module may import ``config``
without an import cycle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .policy import ISOLATIONS, START_METHOD_ENV, START_METHODS, WriterPolicy, resolve_policy
from .shm import SharedArena, SharedBufferPool

if TYPE_CHECKING:
    from .process_sink import ProcessSink


def __getattr__(name: str) -> Any:
    if name == "ProcessSink":
        from .process_sink import ProcessSink

        return ProcessSink
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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

"""The part of :class:`~asyncckpt.checkpointer.AsyncCheckpointer` that its load and state-dict
methods build on, as an explicit interface.

Those methods live in mixins (``LoadsMixin``, ``StateMixin``) to keep the save path's module
small; they subclass this protocol instead of stubbing the host, so mypy refuses a host that
lacks a member (the checkpointer could not be instantiated) and nothing raises at run time.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from ..blocking import Offload
from ..config import CheckpointConfig
from ..node.topology import ThreadBudget
from ..pool import BufferPool
from ..sinks.base import Sink


class CheckpointerCore(Protocol):
    """Configuration, thread budget, and the lock, pool, executor and sinks saves and loads share."""

    config: CheckpointConfig
    _budget: ThreadBudget
    _lock: asyncio.Lock  # one operation at a time per pool

    async def _sink(self, uri: str) -> Sink:
        """A sink for ``uri`` (watched for stalls, in a writer process when isolated)."""
        ...

    def _new_sink(self, uri: str) -> Sink:
        """:meth:`_sink` for synchronous callers (the backend may get imported on the loop)."""
        ...

    async def _import_for(self, uri: object) -> None:
        """Import ``uri``'s backend in a thread, once."""
        ...

    def _ensure_executor(self) -> Offload:
        """The executor of blocking work (created on first use)."""
        ...

    async def _ensure_pool(self, shared: bool = False) -> BufferPool:
        """The buffer pool, in shared memory when ``shared`` (a writer process reads it)."""
        ...

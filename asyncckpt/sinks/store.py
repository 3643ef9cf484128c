"""A store: one backend at one configuration, and what all its objects share.

A sink is one object (a writer and reader handle); the store owns what must not be rebuilt
for each of them: the resolved settings (read once, ``.env`` included), the client library's
client and its connection pool. The checkpointer keeps one store per backend and closes it in
``aclose()``; a sink made without a store (a writer process, a one-off call) gets a private
one and closes it itself. What a store shares belongs to one event loop: the router closes it
when that loop ends and the next loop builds it again (``sinks/loops.py``). Models: zarr's
``Store`` over keys, obstore's one store per bucket.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor

from .base import Sink, SinkOptions
from .shared import Shared


class Store:
    """Backend ``name`` with ``options``: makes the handle (sink) for each object URI."""

    def __init__(self, name: str, factory: Callable[..., Sink], *, executor: Executor, options: SinkOptions):
        self.name = name
        self.factory = factory
        self.executor = executor
        self.options = options
        self.shared = Shared()

    def handle(self, uri: str) -> Sink:
        """The sink for one object (no I/O)."""
        return self.factory(uri, executor=self.executor, options=self.options, shared=self.shared)

    async def settle(self) -> None:
        """Wait for what this store's handles left running after they returned."""
        await self.shared.settle()

    async def aclose(self) -> None:
        await self.shared.aclose()

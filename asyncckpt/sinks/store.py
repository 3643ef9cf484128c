"""A store: one backend at one configuration, and what all its objects share.

A sink is one object (a writer and reader handle); the store owns what must not be rebuilt
for each of them: the resolved settings (read once, ``.env`` included), the client library's
client and its connection pool. The checkpointer keeps one store per backend and closes it in
``aclose()``; a sink made without a store (a writer process, a one-off call) gets a private
one and closes it itself. Models: zarr's ``Store`` over keys, obstore's one store per bucket.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import Executor
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from .base import Sink, SinkOptions

T = TypeVar("T")

log = logging.getLogger("asyncckpt")


class Shared:
    """Things built once and closed together: ``get`` for plain objects, ``enter`` for async
    context managers (clients); ``aclose`` runs every closer, last built first. Work a handle
    leaves behind (``in_background``) is awaited first."""

    def __init__(self) -> None:
        self._items: dict[object, Any] = {}
        self._stack = contextlib.AsyncExitStack()
        self._lock = asyncio.Lock()
        self._background: set[asyncio.Task[None]] = set()
        self.built = 0  # how many things were built (tests count clients with it)

    def in_background(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` (which handles its own errors) after the caller returned, off a save's
        critical path: the unlink of a replaced file. ``settle`` and ``aclose`` await it."""
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:  # a bug: say so, once
            log.error("background storage work failed", exc_info=task.exception())

    @property
    def pending(self) -> int:
        """Background tasks not finished yet."""
        return len(self._background)

    async def settle(self) -> None:
        """Wait for the background work started so far (and any it started meanwhile)."""
        while self._background:
            await asyncio.wait(set(self._background))

    def get(self, key: object, make: Callable[[], T], close: Callable[[T], object] | None = None) -> T:
        if key not in self._items:
            item = make()
            self.built += 1
            if close is not None:
                self._stack.callback(close, item)
            self._items[key] = item
        found: T = self._items[key]
        return found

    async def enter(self, key: object, make: Callable[[], Awaitable[AbstractAsyncContextManager[T]]]) -> T:
        if key not in self._items:
            async with self._lock:
                if key not in self._items:
                    self._items[key] = await self._stack.enter_async_context(await make())
                    self.built += 1
        found: T = self._items[key]
        return found

    async def aclose(self) -> None:
        await self.settle()
        self._items = {}
        stack, self._stack = self._stack, contextlib.AsyncExitStack()
        await stack.aclose()


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
        return self.factory(uri, executor=self.executor, options=self.options, store=self)

    async def settle(self) -> None:
        """Wait for what this store's handles left running after they returned."""
        await self.shared.settle()

    async def aclose(self) -> None:
        await self.shared.aclose()

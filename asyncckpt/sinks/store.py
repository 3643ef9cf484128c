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

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from .base import Sink, SinkOptions

T = TypeVar("T")


class Shared:
    """Things built once and closed together: ``get`` for plain objects, ``enter`` for async
    context managers (clients); ``aclose`` runs every closer, last built first."""

    def __init__(self) -> None:
        self._items: dict[object, Any] = {}
        self._stack = contextlib.AsyncExitStack()
        self._lock = asyncio.Lock()
        self.built = 0  # how many things were built (tests count clients with it)

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
        """Close everything built so far; the next ``get``/``enter`` builds anew."""
        await self.abandon().aclose()

    def abandon(self) -> contextlib.AsyncExitStack:
        """Forget everything built so far (its event loop ended) and return its closers,
        unrun: the caller runs them where no dead loop is needed, or drops them."""
        self._items, self._lock = {}, asyncio.Lock()  # a lock binds to the loop that waits on it
        stack, self._stack = self._stack, contextlib.AsyncExitStack()
        return stack


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

    async def aclose(self) -> None:
        await self.shared.aclose()

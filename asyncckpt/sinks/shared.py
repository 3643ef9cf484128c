"""What the objects of one store share: clients and settings built once, closed together.

Its own module so that a sink (``base``) and a store (``store``) can both use it without
importing each other.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar

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
        """Wait for the background work, then close everything built so far; the next
        ``get``/``enter`` builds anew."""
        await self.settle()
        await self.abandon().aclose()

    def abandon(self) -> contextlib.AsyncExitStack:
        """Forget everything built so far (its event loop ended) and return its closers,
        unrun: the caller runs them where no dead loop is needed, or drops them. Background
        work of the dead loop is forgotten too: it can no longer run."""
        self._items, self._lock = {}, asyncio.Lock()  # a lock binds to the loop that waits on it
        self._background = set()
        stack, self._stack = self._stack, contextlib.AsyncExitStack()
        return stack

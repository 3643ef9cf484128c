"""What the objects of one store share: clients and settings built once, closed together.

Its own module so that a sink (``base``) and a store (``store``) can both use it without
importing each other.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar

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
        self._items = {}
        stack, self._stack = self._stack, contextlib.AsyncExitStack()
        await stack.aclose()

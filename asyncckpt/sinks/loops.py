"""What belongs to one event loop, and what becomes of it when that loop ends.

A store's clients (aiobotocore's aiohttp session) and a writer process's pipe reader and
futures are bound to the loop that made them. Sync code that calls ``asyncio.run`` twice
with one checkpointer used them on a closed loop: "Event loop is closed" (aiobotocore), or a
writer process whose replies no loop read any more (a 20 s stall, then ``CancelledError``
from ``aclose``). A :class:`LoopBound` records the loop its owner (the storage router) was
used on and

- releases the owner's loop-bound things *on that loop* as it shuts down: ``asyncio.run``,
  ``asyncio.Runner`` and pytest-asyncio call ``loop.shutdown_asyncgens()`` before closing it,
  and that closes the suspended async generator kept here, whose ``finally`` awaits them;
- when the owner is next used on another loop and the old one ended some other way
  (``loop.close()`` without that call), has the owner abandon them without awaiting anything
  on the dead loop; either way the next loop builds new ones.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

Release = Callable[[], Awaitable[None]]


def _running() -> asyncio.AbstractEventLoop | None:
    with contextlib.suppress(RuntimeError):
        return asyncio.get_running_loop()
    return None


def orphaned(task: asyncio.Future[Any]) -> bool:
    """Whether ``task`` is pending on an event loop other than the running one (that loop
    ended, or was closed, without finishing it): awaiting it from here would never return."""
    return not task.done() and task.get_loop() is not _running()


def _finish(guard: AsyncGenerator[None, None]) -> None:
    """Run ``guard``'s ``finally`` now, synchronously: off its loop it awaits nothing, and a
    finished generator gives its dead loop's finalizer nothing to schedule."""
    closing = guard.aclose()
    with contextlib.suppress(StopIteration, StopAsyncIteration):
        closing.send(None)
    closing.close()


class LoopBound:
    """Calls ``release`` on the loop that is ending, ``abandon`` on the next loop when the last
    one ended without ``shutdown_asyncgens``; see the module docstring."""

    def __init__(self, release: Release, abandon: Release) -> None:
        self._release = release
        self._abandon = abandon
        self._loop: asyncio.AbstractEventLoop | None = None
        self._guard: AsyncGenerator[None, None] | None = None

    async def enter(self) -> None:
        """Bind to the running loop (called before any loop-bound thing is made or used).

        The new binding is in place before the first suspension, and the owner's ``abandon``
        lets go of the old loop's things before its own first one: a task that runs meanwhile
        sees the new loop and builds anew, never on what is being abandoned."""
        loop = asyncio.get_running_loop()
        if loop is self._loop:
            return
        old, self._loop, self._guard = self._guard, loop, self._until_end(loop)
        await self._guard.asend(None)  # runs to its yield: no suspension
        await self._drop(old)

    async def leave(self) -> None:
        """Release now (the owner's ``aclose``), on the running loop if they belong to it."""
        guard, self._guard = self._guard, None
        if guard is not None and self._loop is _running():
            await guard.aclose()  # its finally releases
        else:
            await self._drop(guard)
        self._loop = None

    async def _drop(self, guard: AsyncGenerator[None, None] | None) -> None:
        if guard is not None:  # its loop ended without closing it
            _finish(guard)
            await self._abandon()

    async def _until_end(self, loop: asyncio.AbstractEventLoop) -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            if _running() is loop:  # closed by its own loop's shutdown (or by leave())
                if self._loop is loop:
                    self._loop = self._guard = None
                await self._release()

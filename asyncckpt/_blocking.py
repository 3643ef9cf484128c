"""Running blocking work off the event loop without ever abandoning it mid-flight."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Executor
from typing import TypeVar

T = TypeVar("T")


async def run_blocking(executor: Executor, fn: Callable[..., T], *args: object) -> T:
    """Run ``fn(*args)`` in ``executor``; if cancelled, wait for it to finish, then re-raise.

    A thread cannot be interrupted. Returning early on cancellation would let the caller
    reuse a buffer the thread is still reading, or close a descriptor it is still writing:
    exactly the data race this library exists to avoid.
    """
    loop = asyncio.get_running_loop()
    future = loop.run_in_executor(executor, fn, *args)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        while not future.done():
            try:
                await asyncio.wait([future])
            except asyncio.CancelledError:
                continue
        if not future.cancelled():
            future.exception()  # retrieved so it is not logged as never-retrieved
        raise

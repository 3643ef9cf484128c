"""Running blocking work off the event loop without ever abandoning it mid-flight.

Blocking calls run on anyio's worker threads (``anyio.to_thread.run_sync``), at most as many
at a time as the owner's :class:`Offload` allows (an ``anyio.CapacityLimiter``): one thread
budget shared by every sink, source and verifier of a checkpointer, with no pool to create or
join. :func:`run_blocking` adds the one thing anyio leaves out: ``abandon_on_cancel=False``
shields only against anyio cancel scopes, and a native asyncio cancellation (``task.cancel()``,
``asyncio.timeout``, a ``TaskGroup`` failing) would still return while the thread runs on.
:func:`read_full` is the one "read until the view is full" loop every load path shares.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from typing import TypeVar

import anyio
import anyio.to_thread

T = TypeVar("T")


class Offload(Executor):
    """A thread budget for :func:`run_blocking`: ``threads`` calls at a time on anyio's threads.

    An :class:`~concurrent.futures.Executor` so that every ``executor=`` parameter (the sinks'
    included) keeps its type; ``submit`` is not offered, as nothing should wait on it
    synchronously. The limiter binds to the event loop that first uses it.
    """

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.limiter = anyio.CapacityLimiter(threads)


async def run_blocking(executor: Executor, fn: Callable[..., T], *args: object) -> T:
    """Run ``fn(*args)`` off the loop; if cancelled, wait for it to finish, then re-raise.

    ``executor``: an :class:`Offload` (anyio's threads, its limiter), or any other executor,
    whose own threads then run the call (a dedicated thread: MPI's, a test's pool).
    A thread cannot be interrupted. Returning early on cancellation would let the caller
    reuse a buffer the thread is still reading, or close a descriptor it is still writing:
    exactly the data race this library exists to avoid.
    """
    future: asyncio.Future[T]
    if isinstance(executor, Offload):
        call = anyio.to_thread.run_sync(fn, *args, abandon_on_cancel=False, limiter=executor.limiter)
        future = asyncio.ensure_future(call)
    else:
        future = asyncio.get_running_loop().run_in_executor(executor, fn, *args)
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


async def read_full(
    read_into: Callable[[int, memoryview], Awaitable[int]], offset: int, view: memoryview
) -> int:
    """Fill ``view`` from ``offset`` by calling ``read_into(offset, view)`` (``Sink.read_into``
    or one shaped like it) until it is full; return the bytes read, fewer if the object ended.

    Stores return short reads (a file near its end, an HTTP body in pieces), so one call is not
    enough; a return of 0 (or less) means the object ended there. A short count is the caller's
    to judge: each raises its own error, or takes what there was.
    """
    got = 0
    while got < len(view):
        n = await read_into(offset + got, view[got:])
        if n <= 0:
            break
        got += n
    return got


class LoopLocks:
    """One ``asyncio.Lock`` per event loop: a lock is bound to the loop that first waited on it,
    and sync code may call ``asyncio.run`` more than once with the same object. Locks of
    closed loops are dropped."""

    def __init__(self) -> None:
        self._locks: dict[asyncio.AbstractEventLoop, asyncio.Lock] = {}

    def current(self) -> asyncio.Lock:
        """The running loop's lock (made on first use)."""
        loop = asyncio.get_running_loop()
        for old in [lp for lp in self._locks if lp.is_closed()]:
            del self._locks[old]
        return self._locks.setdefault(loop, asyncio.Lock())

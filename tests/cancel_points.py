"""Cancel a save at points spread over its whole run, for the crash-point tests."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any


async def loop_iterations(save: Callable[[], Awaitable[Any]]) -> int:
    """How many event-loop iterations one run of ``save`` takes."""
    task = asyncio.ensure_future(save())
    total = 0
    while not task.done():
        await asyncio.sleep(0)
        total += 1
    await task
    return total


async def cancel_everywhere(
    save_b: Callable[[], Awaitable[Any]],
    restore_a: Callable[[], Awaitable[None]],
    version: Callable[[], Awaitable[str]],
    points: int,
) -> set[bool]:
    """Save B over A and cancel it after k loop iterations, for ``points`` values of k from the
    first await to past the end; each time, what the save said about publication must be what
    loads ("B" if published, else "A"). Returns the publication outcomes seen."""
    total = await loop_iterations(save_b)
    outcomes = set()
    finished = False
    for k in range(1, total + 2, max(1, total // points)):
        published, done = await _cancel_after(k, save_b, restore_a, version)
        outcomes.add(published)
        finished |= done
    k = total + 1
    while not finished:
        # a save waiting on the network spins the loop, so its iteration count varies from run
        # to run: go on past the calibrated end until one run finishes before its cancel
        k *= 2
        published, finished = await _cancel_after(k, save_b, restore_a, version)
        outcomes.add(published)
    return outcomes


async def _cancel_after(
    k: int,
    save_b: Callable[[], Awaitable[Any]],
    restore_a: Callable[[], Awaitable[None]],
    version: Callable[[], Awaitable[str]],
) -> tuple[bool, bool]:
    """One point: (whether the save said it published, whether it finished before the cancel)."""
    await restore_a()
    task = asyncio.ensure_future(save_b())
    for _ in range(k):
        await asyncio.sleep(0)
    done = task.done()
    task.cancel()
    try:
        await task
        published = True
    except asyncio.CancelledError as exc:
        published = bool(exc.asyncckpt_published)  # type: ignore[attr-defined]
    assert await version() == ("B" if published else "A"), k
    return published, done

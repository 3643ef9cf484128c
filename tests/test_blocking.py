"""run_blocking: anyio's threads within a budget, and never an abandoned thread on cancellation."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, ThreadPoolExecutor

import pytest

from asyncckpt.blocking import Offload, run_blocking


@pytest.fixture(params=["offload", "dedicated"])
def executor(request: pytest.FixtureRequest) -> Iterator[Executor]:
    if request.param == "offload":
        yield Offload(2)
    else:
        with ThreadPoolExecutor(2) as pool:
            yield pool


def held_call() -> tuple[threading.Event, threading.Event, list[str], Callable[[], None]]:
    """A blocking call that starts, then holds until released: (started, release, log, fn)."""
    started, release, log = threading.Event(), threading.Event(), []

    def fn() -> None:
        started.set()
        release.wait(10)
        log.append("finished")

    return started, release, log, fn


async def spin(turns: int = 20) -> None:
    """Let the loop run other callbacks (a cancellation in flight) without waiting on time."""
    for _ in range(turns):
        await asyncio.sleep(0)


@pytest.mark.parametrize("how", ["task.cancel", "asyncio.timeout"])
async def test_cancellation_waits_for_the_thread(executor: Executor, how: str) -> None:
    started, release, log, fn = held_call()

    async def call() -> None:
        if how == "task.cancel":
            await run_blocking(executor, fn)
        else:
            async with asyncio.timeout(0):  # expires at the first await: cancels the call at once
                await run_blocking(executor, fn)

    task = asyncio.create_task(call())
    await asyncio.to_thread(started.wait, 10)
    if how == "task.cancel":
        task.cancel()
        await spin()
        task.cancel()  # a second cancellation changes nothing
    await spin()
    assert not task.done(), "returned while the thread still runs"
    release.set()
    with pytest.raises(asyncio.CancelledError if how == "task.cancel" else TimeoutError):
        await task
    assert log == ["finished"]


async def test_offload_bounds_the_threads_in_use() -> None:
    offload = Offload(2)
    gates = [held_call() for _ in range(4)]
    tasks = [asyncio.create_task(run_blocking(offload, fn)) for _, _, _, fn in gates]
    for started, *_ in gates[:2]:
        await asyncio.to_thread(started.wait, 10)
    await spin()
    assert offload.limiter.statistics().tasks_waiting == 2
    assert offload.limiter.borrowed_tokens == 2
    assert not any(started.is_set() for started, *_ in gates[2:])
    for _, release, _, _ in gates:
        release.set()
    await asyncio.gather(*tasks)
    assert [log for _, _, log, _ in gates] == [["finished"]] * 4


async def test_results_and_errors_come_back(executor: Executor) -> None:
    assert await run_blocking(executor, sum, [1, 2, 3]) == 6
    with pytest.raises(ZeroDivisionError):
        await run_blocking(executor, divmod, 1, 0)

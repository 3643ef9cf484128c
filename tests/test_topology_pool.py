"""Thread budget (the seed bug) and the buffer pool's guarantees."""

from __future__ import annotations

import asyncio

import pytest

from asyncckpt.node.topology import thread_budget, world
from asyncckpt.pool import PAGE, BufferPool, buffer_address


def test_budget_divides_by_ranks_on_this_node_not_world_size() -> None:
    # 16 nodes x 4 ranks on 192-CPU hosts: the seed bug gave 192 // 64 = 3
    env = {"OMPI_COMM_WORLD_SIZE": "64", "OMPI_COMM_WORLD_LOCAL_SIZE": "4", "OMPI_COMM_WORLD_RANK": "9"}
    budget = thread_budget(env=env, cpus=192)
    assert budget.threads == 48
    assert (budget.local_ranks, budget.local_ranks_source) == (4, "OMPI_COMM_WORLD_LOCAL_SIZE")
    assert world(env) == (9, 64)


@pytest.mark.parametrize(
    ("env", "threads"),
    [
        ({"MPI_LOCALNRANKS": "8"}, 24),
        ({"MV2_COMM_WORLD_LOCAL_SIZE": "2"}, 96),
        ({"PMI_SIZE": "64"}, 192),  # a world size alone says nothing about this node
        ({"OMPI_COMM_WORLD_LOCAL_SIZE": "0"}, 192),
        ({"OMPI_COMM_WORLD_LOCAL_SIZE": "500"}, 1),
    ],
)
def test_budget_sources(env: dict[str, str], threads: int) -> None:
    assert thread_budget(env=env, cpus=192).threads == threads


def test_budget_override() -> None:
    budget = thread_budget(5, env={"OMPI_COMM_WORLD_LOCAL_SIZE": "4"}, cpus=192)
    assert budget.threads == 5 and budget.overridden


async def test_pool_buffers_are_page_aligned_and_bounded() -> None:
    pool = BufferPool(64 * 1024, 3)
    try:
        pool.touch()
        assert all(buffer_address(b.view) % PAGE == 0 for b in pool.buffers)
        bufs = [await pool.acquire() for _ in range(3)]
        waiter = asyncio.create_task(pool.acquire())
        await asyncio.sleep(0)
        assert not waiter.done()  # back-pressure: nothing is free
        pool.release(bufs[1])
        got = await waiter
        assert got is bufs[1]
        assert pool.stats().waits == 1 and pool.stats().peak_in_use == 3
        pool.release(bufs[0])
        with pytest.raises(RuntimeError, match="released twice"):
            pool.release(bufs[0])
        for b in (bufs[2], got):
            pool.release(b)
        assert pool.stats().free == 3
    finally:
        pool.close()


async def test_cancelled_waiter_does_not_lose_a_buffer() -> None:
    pool = BufferPool(PAGE, 1)
    try:
        held = await pool.acquire()
        first = asyncio.create_task(pool.acquire())
        second = asyncio.create_task(pool.acquire())
        await asyncio.sleep(0)
        pool.release(held)  # wakes `first` ...
        first.cancel()  # ... which is cancelled before it runs: the wake-up must pass on
        got = await asyncio.wait_for(second, 5)
        assert got is held
        pool.release(got)
    finally:
        pool.close()

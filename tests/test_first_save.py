"""A fresh checkpointer's first save: the pool's pages are faulted in buffer by buffer beside
the save (not all up front on its critical path), and every result records its setup time.

Issue 29 §2: a first 2 GiB save took 1.52 s on the caller's clock against 1.28 s for the next,
0.60 s of it the pool's first touch, which ``wall_s`` did not include.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from asyncckpt import AsyncCheckpointer
from asyncckpt.pool import BufferPool

MiB = 1 << 20


async def test_first_buffer_is_handed_out_before_the_rest_are_faulted_in() -> None:
    """The fault-in runs on the given executor, one buffer per call: with its thread held,
    nothing is handed out; released, the first buffer comes back at once while the others
    are still queued behind it, and ``faulted()`` ends only when every buffer is free."""
    gate = threading.Event()
    executor = ThreadPoolExecutor(1)
    executor.submit(gate.wait)  # holds the only thread: every touch queues behind it
    pool = BufferPool(MiB, 4)
    try:
        pool.fault_in(executor)
        assert pool.stats().free == 0  # untouched buffers are not handed out
        first = asyncio.ensure_future(pool.acquire())
        await asyncio.sleep(0)
        assert not first.done()
        gate.set()
        buf = await asyncio.wait_for(first, 30)
        assert buf.index == 0
        await pool.faulted()
        assert pool.stats().free == 3  # the other three, faulted in and free
        assert bytes(buf.view[:16]) == bytes(16)
        pool.release(buf)
    finally:
        await pool.faulted()
        pool.close()
        executor.shutdown()


def test_a_fault_in_left_in_a_closed_loop_is_taken_over_by_the_next() -> None:
    """A loop closed without shutdown leaves the fault-in's task pending forever: the next
    loop's ``acquire`` waits for the thread to leave ``memset`` (never a buffer a thread still
    zeroes), then hands the buffers out; ``faulted()`` does not wait on the dead loop."""
    gate = threading.Event()
    executor = ThreadPoolExecutor(1)
    executor.submit(gate.wait)
    pool = BufferPool(MiB, 4)

    async def start() -> None:
        pool.fault_in(executor)
        await asyncio.sleep(0)  # its first touch is queued on the executor

    async def later() -> None:
        first = asyncio.ensure_future(pool.acquire())
        await asyncio.sleep(0)
        assert not first.done()  # the first buffer's touch has not run yet
        gate.set()
        buf = await asyncio.wait_for(first, 30)
        await pool.faulted()
        assert pool.stats().free == 3
        pool.release(buf)

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(start())
    finally:
        loop.close()
    try:
        asyncio.run(later())
    finally:
        pool.close()
        executor.shutdown()


async def test_aclose_waits_for_a_fault_in_still_running(tmp_path: Path) -> None:
    """Unmapping a pool while a thread still writes its pages would crash the process: a
    checkpointer closed right after its pool was built waits for the fault-in first."""
    async with AsyncCheckpointer(chunk_size=4 * MiB, num_buffers=4) as ckpt:
        await ckpt.runtime.pool()  # built; its fault-in has only just started
    assert ckpt.runtime.pool_now is None  # closed, and this process is still alive


async def test_a_save_records_its_setup_on_the_callers_clock(tmp_path: Path) -> None:
    """``setup_s`` is the call's time outside the timed window, so ``caller_s`` (wall_s +
    setup_s) never exceeds what the caller measured around the call, and a first save's
    setup (handle, pool mapping) is recorded, not hidden."""
    async with AsyncCheckpointer(chunk_size=4 * MiB, num_buffers=4) as ckpt:
        for name in ("first", "next"):
            t0 = time.perf_counter()
            result = await ckpt.save(tmp_path / name, 32 * MiB)
            caller = time.perf_counter() - t0
            assert result.setup_s is not None and result.setup_s > 0
            assert result.wall_s <= result.caller_s <= caller
            assert result.to_dict()["caller_s"] == result.caller_s
            loaded = await ckpt.load(tmp_path / name)
            assert loaded.setup_s is not None and loaded.setup_s > 0
    assert "Setup:" in str(result) and "caller's clock" in str(result)

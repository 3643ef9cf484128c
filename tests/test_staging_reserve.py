"""The staging area made ahead of the first staged save.

The first ``staging="host"`` save used to allocate the area and fault its pages in while the
caller waited: a 1 GiB state blocked the training loop 0.2-1.3 s, later saves about 0.1 s.
``reserve_staging`` does that in a worker thread beforehand, and ``CheckpointManager`` calls
it in the background at the first step that saves nothing (or at ``restore(into=)``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from asyncckpt import AsyncCheckpointer, AsyncCkptError, CheckpointManager, ConfigError
from asyncckpt.engine.monitor import current_rss
from asyncckpt.servers.s3endpoint import S3Endpoint
from asyncckpt.state.api import plan

from .relay import FaultyFront, is_part_2
from .s3_harness import CHUNK, new_bucket

MiB = 1 << 20


def _state(seed: int, mib: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {
        "model": {"w": rng.random(mib * MiB // 8), "b": np.arange(5, dtype=np.float32)},
        "step": seed,
    }


async def _made(seed: int, mib: int) -> dict[str, Any]:
    return await asyncio.to_thread(_state, seed, mib)  # big arrays: built off the loop


async def _equal(got: Any, want: dict[str, Any]) -> None:
    for name in ("w", "b"):  # compared off the loop: tens of MiB
        assert await asyncio.to_thread(np.array_equal, got["model"][name], want["model"][name]), name
    assert got["step"] == want["step"]


async def test_reserve_faults_the_area_in_and_the_first_staged_save_uses_it(tmp_path: Path) -> None:
    state = await _made(1, 48)
    size = plan("x", state, MiB, None).size
    async with AsyncCheckpointer(chunk_size=MiB, num_buffers=4) as ckpt:
        before = current_rss()
        capacity = await ckpt.reserve_staging(state)
        grown = current_rss() - before
        area = ckpt.staging_area
        mapping = area.mapping
        assert capacity >= size
        assert grown >= 0.9 * size, grown  # resident now, not at the first save's copy
        staged = await ckpt.save_state(tmp_path / "a.safetensors", state, staging="host")
        await staged
        assert area.mapping is mapping  # the save copied into the reserved area: none made
        assert await ckpt.reserve_staging(state) == capacity  # big enough: left alone
        await _equal((await ckpt.load_state(tmp_path / "a.safetensors")).state, state)


async def test_reserve_waits_for_a_save_still_writing_from_the_area(s3_endpoint: S3Endpoint) -> None:
    # the relay holds every attempt at the staged write's second part until the save fails: a
    # reservation asked for meanwhile must not replace the area under that write
    small, large = await _made(2, 12), await _made(3, 16)
    bucket = await asyncio.to_thread(new_bucket, s3_endpoint)
    front = FaultyFront(s3_endpoint.endpoint, "hold", is_part_2, times=100)  # its retries too
    url = await front.start()
    order: list[str] = []
    try:
        options = s3_endpoint.options(endpoint_url=url)
        async with AsyncCheckpointer(
            chunk_size=CHUNK, num_buffers=2, stall_timeout=2.0, backend="aiobotocore", backend_options=options
        ) as ckpt:
            staged = await ckpt.save_state(f"s3://{bucket}/s.safetensors", small, staging="host")
            staged.add_done_callback(lambda _: order.append("written"))
            await ckpt.reserve_staging(large)
            order.append("reserved")
            with pytest.raises(AsyncCkptError):  # the held part failed it (retries spent, or a stall)
                await staged
            assert ckpt.staging_area.capacity >= plan("x", large, CHUNK, None).size
    finally:
        await front.stop()
    assert front.spoiled  # the write was held...
    assert order == ["written", "reserved"]  # ...and the area replaced only once it was over


async def test_manager_makes_the_area_at_a_step_that_saves_nothing(tmp_path: Path) -> None:
    state = await _made(4, 16)
    size = plan("x", state, MiB, None).size
    ckpt = AsyncCheckpointer(chunk_size=MiB, num_buffers=4)
    async with ckpt, CheckpointManager(tmp_path, every_n_steps=2, checkpointer=ckpt) as mgr:
        assert not await mgr.maybe_save(1, state)
        await mgr.wait()
        mapping = ckpt.staging_area.mapping
        assert ckpt.staging_area.capacity >= size
        assert await mgr.maybe_save(2, state)
        await mgr.wait()
        assert mgr.stats.saved == [2]
        assert ckpt.staging_area.mapping is mapping
    fresh = AsyncCheckpointer(chunk_size=MiB, num_buffers=4)
    async with fresh, CheckpointManager(tmp_path, every_n_steps=2, checkpointer=fresh) as again:
        into = await _made(0, 16)
        assert await again.restore(into=into) == 2
        await _equal(into, {**state, "step": into["step"]})  # the arrays, restored in place
        await again.wait()
        assert fresh.staging_area.capacity >= size  # restore(into=) reserved it too


async def test_a_fresh_runs_restore_into_reserves_too(tmp_path: Path) -> None:
    state = await _made(5, 8)
    ckpt = AsyncCheckpointer(chunk_size=MiB, num_buffers=4)
    async with ckpt, CheckpointManager(tmp_path, checkpointer=ckpt) as mgr:
        assert await mgr.restore(into=state) is None  # nothing saved yet: the run starts fresh
        await mgr.wait()
        assert ckpt.staging_area.capacity >= plan("x", state, MiB, None).size


async def test_a_bad_state_fails_reserve_by_name_and_the_manager_only_warns(tmp_path: Path) -> None:
    bad = {"model": {"w": object()}}
    async with AsyncCheckpointer(chunk_size=MiB, num_buffers=4) as ckpt:
        with pytest.raises(ConfigError, match=r"state\['model'\]\['w'\]: object is neither"):
            await ckpt.reserve_staging(bad)  # the error save_state gives, before any memory
        async with CheckpointManager(tmp_path, every_n_steps=2, checkpointer=ckpt) as mgr:
            assert not await mgr.maybe_save(1, bad)
            await mgr.wait()
        assert ckpt.staging_area.capacity == 0

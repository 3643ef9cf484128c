"""A step of many tensors: its index outgrows a small record (1 MiB near 15 000 tensors;
a 70B model under FSDP on 8 ranks has about 17 000 boxes) and must still load by index
(boxes, another world size) and drain to a remote tier."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from asyncckpt import AsyncCheckpointer, CheckpointManager, Shard
from asyncckpt.state.index import INDEX

MANY = 16_000
OPTIONS: dict[str, Any] = {"chunk_size": 1 << 20, "num_buffers": 4}


def many_tensors(step: int, many: int = MANY) -> dict[str, Any]:
    return {f"layers.{i}.w": np.full(2, step + i, dtype=np.float32) for i in range(many)}


def into_by_boxes() -> dict[str, Any]:
    """Every tensor's second element only: a box per tensor, so the load goes by the index."""
    return {f"layers.{i}.w": Shard((2,), (1,), np.zeros(1, dtype=np.float32)) for i in range(MANY)}


async def test_a_step_index_larger_than_a_small_record_loads_by_boxes(tmp_path: Path) -> None:
    state = many_tensors(3)
    async with AsyncCheckpointer(**OPTIONS) as ckpt:
        await ckpt.save_step(tmp_path, 3, state)
        assert (tmp_path / "step-3" / INDEX).stat().st_size > 1 << 20
        into = into_by_boxes()
        await ckpt.load_step(tmp_path, 3, into=into)
    assert all(into[k].data[0] == state[k][1] for k in state)


async def test_a_step_index_larger_than_a_small_record_drains(tmp_path: Path) -> None:
    local, remote = tmp_path / "local", tmp_path / "remote"
    local.mkdir()
    remote.mkdir()
    async with CheckpointManager(str(remote), local=local, raise_on_failure=False, **OPTIONS) as mgr:
        await mgr.maybe_save(1, many_tensors(1))
        await mgr.wait()
    tiers = mgr.stats.tiers
    assert tiers is not None and tiers.drain_failures == [] and tiers.remote_committed == [1]
    assert (remote / "step-1" / INDEX).read_bytes() == (local / "step-1" / INDEX).read_bytes()

"""A step number drained, then saved again (a run rolled back and trains through it). Each
rank's remote marker said "drained", so the new object was never drained: the remote commit
named the earlier save's objects, and a node that lost its disk restored the old state."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from asyncckpt import AsyncCheckpointer, CheckpointManager

OPTIONS: dict[str, Any] = {"chunk_size": 1 << 20, "num_buffers": 4}


def state_of(value: float) -> dict[str, Any]:
    return {"w": np.full(1000, value, np.float32)}


async def save_and_drain(local: Path, remote: Path, value: float) -> Any:
    async with CheckpointManager(str(remote), local=local, raise_on_failure=False, **OPTIONS) as mgr:
        await mgr.maybe_save(1, state_of(value))
        await mgr.wait()
    return mgr.stats.tiers


async def test_a_step_saved_again_is_drained_again(tmp_path: Path) -> None:
    local, remote = tmp_path / "local", tmp_path / "remote"
    local.mkdir()
    remote.mkdir()
    first = await save_and_drain(local, remote, 1.0)
    again = await save_and_drain(local, remote, 2.0)  # a later run, rolled back to step 1
    assert first.remote_committed == [1] and again.remote_committed == [1]
    assert again.drain_failures == [] and again.steps[1].bytes_drained > 0
    async with AsyncCheckpointer(**OPTIONS) as ckpt:
        loaded = await ckpt.load_step(remote, 1)
    assert np.array_equal(loaded.state["w"], state_of(2.0)["w"])


async def test_control_a_restart_does_not_drain_a_drained_step_again(tmp_path: Path) -> None:
    local, remote = tmp_path / "local", tmp_path / "remote"
    local.mkdir()
    remote.mkdir()
    await save_and_drain(local, remote, 1.0)
    async with CheckpointManager(str(remote), local=local, raise_on_failure=False, **OPTIONS) as mgr:
        await mgr.start()
        await mgr.wait()
    tiers = mgr.stats.tiers
    assert tiers is not None and tiers.resumed == [] and tiers.drain_failures == []

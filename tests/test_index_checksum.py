"""A step's index files carry their CRC32C in the commit record. A load by index reads
byte ranges the index gives and checks only the bytes it reads, so a changed digit in the
index (a byte range moved by 64) loaded another tensor's bytes, "verified". Now the index
is checked before it is used: by a load by boxes, and by a drain, which copies it as bytes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from asyncckpt import AsyncCheckpointer, CheckpointManager, IntegrityError, Shard
from asyncckpt.state.hf_index import INDEX as HF_INDEX
from asyncckpt.state.index import INDEX
from asyncckpt.steps import COMMIT

N = 4096


def state() -> dict[str, Any]:
    return {"w": Shard((N,), (0,), np.arange(N, dtype=np.float32)), "b": np.ones(8)}


def into() -> dict[str, Any]:
    return {"w": Shard((N,), (0,), np.zeros(N, dtype=np.float32)), "b": np.zeros(8)}


def move_box(step_dir: Path, by: int = 64) -> None:
    """The index still valid JSON, its box of ``w`` pointing ``by`` bytes further on: what a
    flipped digit does."""
    path = step_dir / INDEX
    index = json.loads(path.read_text())
    box = index["tensors"]["w"]["boxes"][0]
    box["start"] += by
    box["end"] += by
    path.write_text(json.dumps(index, sort_keys=True))


async def test_a_changed_index_is_refused_by_a_load_by_boxes(tmp_path: Path) -> None:
    async with AsyncCheckpointer() as ckpt:
        await ckpt.save_step(tmp_path, 1, state())
        move_box(tmp_path / "step-1")
        dest = into()
        with pytest.raises(IntegrityError, match=f"{INDEX}.*CRC32C") as err:
            await ckpt.load_step(tmp_path, 1, into=dest)
        assert not dest["w"].data.any()  # nothing was read into it
    record = json.loads((tmp_path / "step-1" / COMMIT).read_text())
    assert set(record["checksums"]) == {INDEX, HF_INDEX}
    assert record["checksums"][INDEX] in str(err.value)


async def test_control_the_unchanged_index_loads_bit_identical(tmp_path: Path) -> None:
    async with AsyncCheckpointer() as ckpt:
        await ckpt.save_step(tmp_path, 1, state())
        dest = into()
        await ckpt.load_step(tmp_path, 1, into=dest)
    assert np.array_equal(dest["w"].data, np.arange(N, dtype=np.float32))


async def test_a_record_without_checksums_still_loads(tmp_path: Path) -> None:
    """Records written before the checksums existed: the index is used as it is."""
    async with AsyncCheckpointer() as ckpt:
        await ckpt.save_step(tmp_path, 1, state())
        path = tmp_path / "step-1" / COMMIT
        record = json.loads(path.read_text())
        record.pop("checksums", None)
        path.write_text(json.dumps(record))
        dest = into()
        await ckpt.load_step(tmp_path, 1, into=dest)
    assert np.array_equal(dest["w"].data, np.arange(N, dtype=np.float32))


async def drain(tmp_path: Path, change: bool) -> tuple[Any, Path]:
    """Step 1 committed locally while the remote is out (a file where its directory was),
    the index changed or not, then a restart over the remote, which resumes the drain."""
    local, remote = tmp_path / "local", tmp_path / "remote"
    local.mkdir()
    remote.mkdir()
    async with CheckpointManager(str(remote), local=local, raise_on_failure=False) as mgr:
        remote.rmdir()
        remote.write_text("")  # the remote is out: the drain of step 1 fails
        await mgr.maybe_save(1, state())
        await mgr.wait()
    remote.unlink()
    remote.mkdir()
    if change:
        move_box(local / "step-1")
    async with CheckpointManager(str(remote), local=local, raise_on_failure=False) as mgr:
        await mgr.start()
        await mgr.wait()
    return mgr.stats.tiers, remote


async def test_a_drain_refuses_a_changed_index_and_commits_nothing(tmp_path: Path) -> None:
    tiers, remote = await drain(tmp_path, change=True)
    assert tiers.remote_committed == []
    assert [step for step, _ in tiers.drain_failures] == [1]
    assert "CRC32C" in tiers.drain_failures[0][1]
    assert not (remote / "step-1" / COMMIT).exists()


async def test_control_a_drain_copies_the_index_files_byte_for_byte(tmp_path: Path) -> None:
    tiers, remote = await drain(tmp_path, change=False)
    assert tiers.remote_committed == [1] and tiers.drain_failures == []
    local = tmp_path / "local" / "step-1"
    for name in (INDEX, HF_INDEX):
        assert (remote / "step-1" / name).read_bytes() == (local / name).read_bytes()
    record = json.loads((remote / "step-1" / COMMIT).read_text())
    assert record["checksums"] == json.loads((local / COMMIT).read_text())["checksums"]

"""Saving to real files: exact bytes, O_DIRECT honesty, atomic publish, cleanup on failure."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from asyncckpt import (
    AsyncCheckpointer,
    ConfigError,
    DirectIOError,
    IntegrityError,
    NoSpaceError,
    TargetNotFoundError,
)
from asyncckpt.units import MiB

from .conftest import checkpoint_data, files_in, generated, mounted

CHUNK = 1 * MiB


@pytest.mark.parametrize("size", [CHUNK, 5 * CHUNK, 3 * CHUNK + 12345, 4096 * 7 + 1, 100])
async def test_written_bytes_equal_generator_stream(tmp_path: Path, size: int) -> None:
    target = tmp_path / "rank0.bin"
    async with AsyncCheckpointer(chunk_size=CHUNK, num_buffers=3, seed=7) as ckpt:
        result = await ckpt.save(target, size)
    assert checkpoint_data(target.read_bytes()) == await generated(size, CHUNK, 7)
    assert files_in(tmp_path) == ["rank0.bin"]  # no temporary left behind
    assert result.size_bytes == size
    assert result.chunks == -(-size // CHUNK)
    assert sum(result.bottleneck_counts.values()) == result.chunks


async def test_file_uri_and_numpy_generator(tmp_path: Path) -> None:
    target = tmp_path / "n.bin"
    async with AsyncCheckpointer(chunk_size=CHUNK, num_buffers=2, generator="numpy", seed=3) as ckpt:
        result = await ckpt.save(f"file://{target}", 2 * CHUNK + 5)
    import numpy as np

    rng = np.random.default_rng(3)
    assert checkpoint_data(target.read_bytes()) == rng.bytes(CHUNK) + rng.bytes(CHUNK) + rng.bytes(5)
    assert result.metadata.generator == "numpy"


async def test_direct_io_engaged_on_disk(tmp_path: Path) -> None:
    probe = tmp_path / "probe"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_DIRECT)
    except OSError:
        pytest.skip(f"{tmp_path} refuses O_DIRECT; the fallback test covers this file system")
    os.close(fd)
    probe.unlink()
    async with AsyncCheckpointer(chunk_size=CHUNK, num_buffers=2) as ckpt:
        result = await ckpt.save(tmp_path / "d.bin", 3 * CHUNK + 100)
    assert result.metadata.direct_io is True
    assert result.metadata.direct_io_reason == "O_DIRECT accepted"


async def test_direct_io_refused_falls_back_with_reason(ramfs: Path) -> None:
    async with AsyncCheckpointer(chunk_size=CHUNK, num_buffers=2, seed=1) as ckpt:
        result = await ckpt.save(ramfs / "f.bin", 2 * CHUNK + 1)
    assert result.metadata.direct_io is False
    assert "refused" in result.metadata.direct_io_reason
    assert checkpoint_data((ramfs / "f.bin").read_bytes()) == await generated(2 * CHUNK + 1, CHUNK, 1)


async def test_direct_io_demanded_but_refused_is_an_error(ramfs: Path) -> None:
    async with AsyncCheckpointer(chunk_size=CHUNK, num_buffers=2, direct_io=True) as ckpt:
        with pytest.raises(DirectIOError, match="direct_io=True"):
            await ckpt.save(ramfs / "f.bin", CHUNK)
    assert files_in(ramfs) == []


async def test_overwrite_is_atomic_and_failure_keeps_old_file(tmp_path: Path) -> None:
    target = tmp_path / "ckpt.bin"
    target.write_bytes(b"previous checkpoint")

    def failing_data() -> Iterator[bytes]:
        yield bytes(CHUNK)
        yield bytes(CHUNK)
        raise RuntimeError("training state broke")

    async with AsyncCheckpointer(chunk_size=CHUNK, num_buffers=2) as ckpt:
        with pytest.raises(RuntimeError, match="training state broke"):
            await ckpt.save(target, 4 * CHUNK, data=failing_data())
        assert target.read_bytes() == b"previous checkpoint"
        assert files_in(tmp_path) == ["ckpt.bin"]
        await ckpt.save(target, 2 * CHUNK)  # the pool survives a failed save
    assert len(checkpoint_data(target.read_bytes())) == 2 * CHUNK


async def test_cancel_mid_save_cleans_up(tmp_path: Path, leak_check: None) -> None:
    started = asyncio.Event()

    async def slow_data() -> object:
        for _ in range(1000):
            started.set()
            yield bytes(CHUNK)
            await asyncio.sleep(0.001)

    async with AsyncCheckpointer(chunk_size=CHUNK, num_buffers=2) as ckpt:
        task = asyncio.create_task(ckpt.save(tmp_path / "c.bin", 1000 * CHUNK, data=slow_data()))
        await started.wait()
        await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert files_in(tmp_path) == []
        pool = ckpt.runtime.pool_now
        assert pool is not None and pool.stats().free == pool.num_buffers


async def test_caller_data_wrong_length(tmp_path: Path) -> None:
    async with AsyncCheckpointer(chunk_size=CHUNK, num_buffers=2) as ckpt:
        with pytest.raises(IntegrityError, match="ended after"):
            await ckpt.save(tmp_path / "a", 3 * CHUNK, data=[bytes(CHUNK)])
        with pytest.raises(IntegrityError, match="longer than"):
            await ckpt.save(tmp_path / "a", CHUNK, data=[bytes(CHUNK), b"x"])
    assert files_in(tmp_path) == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"size": 0}, "size must be > 0"),
        ({"size": -5}, "size must be > 0"),
        ({"size": 1.5}, "integer"),
        ({"size": "1GiB"}, "integer"),
    ],
)
async def test_bad_size_rejected_before_io(tmp_path: Path, kwargs: dict[str, object], message: str) -> None:
    async with AsyncCheckpointer(chunk_size=CHUNK, num_buffers=1) as ckpt:
        with pytest.raises(ConfigError, match=message):
            await ckpt.save(tmp_path / "x", **kwargs)  # type: ignore[arg-type]
    assert files_in(tmp_path) == []


async def test_bad_targets(tmp_path: Path) -> None:
    async with AsyncCheckpointer(chunk_size=CHUNK, num_buffers=1) as ckpt:
        with pytest.raises(TargetNotFoundError, match="does not exist"):
            await ckpt.save(tmp_path / "missing" / "x.bin", CHUNK)
        with pytest.raises(ConfigError, match="is a directory"):
            await ckpt.save(tmp_path, CHUNK)
        with pytest.raises(ConfigError, match="unsupported URI scheme 'gopher'"):
            await ckpt.save("gopher://host/x", CHUNK)
    assert files_in(tmp_path) == []


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB file system, so ENOSPC is real."""
    with mounted(tmp_path / "small", "tmpfs", "size=4m") as mnt:
        yield mnt


@pytest.mark.parametrize("reserve_space", [True, False])
async def test_no_space_left(small_fs: Path, reserve_space: bool) -> None:
    async with AsyncCheckpointer(chunk_size=CHUNK, num_buffers=2, reserve_space=reserve_space) as ckpt:
        with pytest.raises(NoSpaceError, match="No space left"):
            await ckpt.save(small_fs / "big.bin", 16 * CHUNK)
    assert files_in(small_fs) == []
    assert os.statvfs(small_fs).f_bfree * os.statvfs(small_fs).f_frsize >= 3 * MiB  # space was freed

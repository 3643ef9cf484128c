"""A read-only target: one clear asyncckpt error, never a cleanup error in its place.

A real read-only file system (a tmpfs mounted ``ro``, then a writable one remounted ``ro``):
root ignores directory permissions, so a chmod'ed directory would not refuse anything.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from asyncckpt import AsyncCheckpointer, AsyncCkptError, CheckpointManager, StoragePermissionError
from asyncckpt.units import MiB

from .conftest import files_in, mounted, run_bench

CHUNK = 1 * MiB


@pytest.fixture
def rw_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A small writable tmpfs; tests remount it read-only when they need to."""
    with mounted(tmp_path / "fs", "tmpfs", "size=16m") as mnt:
        yield mnt


def remount_ro(mnt: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)


async def test_save_to_read_only_fs_raises_permission_error_and_keeps_old(rw_tmpfs: Path) -> None:
    target = rw_tmpfs / "ckpt.bin"
    async with AsyncCheckpointer(chunk_size=CHUNK, num_buffers=2, seed=3) as ckpt:
        await ckpt.save(target, 2 * CHUNK + 5)
        before = files_in(rw_tmpfs)
        remount_ro(rw_tmpfs)
        with pytest.raises(StoragePermissionError) as info:
            await ckpt.save(target, 3 * CHUNK)
        # the old checkpoint still loads, verified, from the read-only file system
        loaded = await ckpt.load(target)
    err = info.value
    assert isinstance(err, PermissionError) and isinstance(err, AsyncCkptError)
    assert "Read-only file system" in str(err) and str(target) in str(err)
    assert loaded.size_bytes == 2 * CHUNK + 5
    assert files_in(rw_tmpfs) == before


async def test_steps_and_a_manager_on_a_read_only_root_raise_the_librarys_error(
    rw_tmpfs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The step directory's creation gave pathlib's raw OSError, and the manager then warned
    that it could not remove a step it never made."""
    remount_ro(rw_tmpfs)
    state = {"w": np.ones(4, np.float32)}
    async with AsyncCheckpointer(chunk_size=CHUNK, num_buffers=2) as ckpt:
        with pytest.raises(StoragePermissionError, match=f"create the directory '{rw_tmpfs}/step-1'"):
            await ckpt.save_step(rw_tmpfs, 1, state)
    async with CheckpointManager(rw_tmpfs, chunk_size=CHUNK, num_buffers=2) as mgr:
        with pytest.raises(StoragePermissionError, match="Read-only file system"):
            await mgr.maybe_save(1, state)
    assert mgr.stats.left == [] and "could not remove" not in caplog.text


def test_bench_on_read_only_fs_prints_one_line(tmp_path: Path) -> None:
    with mounted(tmp_path / "ro", "tmpfs", "ro,size=1m") as mnt:
        proc = run_bench(str(mnt / "x.bin"), "--size", "4MiB", "-q", cwd=tmp_path, timeout=60)
    assert proc.returncode == 2, proc.stderr  # bad input, refused before any I/O
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "read-only file system" in lines[0] and str(mnt / "x.bin") in lines[0]
    assert "Traceback" not in proc.stderr and proc.stdout == ""

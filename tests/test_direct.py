"""``direct://path``: files with O_DIRECT required. On the disk it writes and reads with O_DIRECT
(seen in /proc/self/fdinfo while a save and a load run); on a file system in memory (/dev/shm)
it is refused, naming the path and the file system, before anything is written."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from asyncckpt import (
    AsyncCheckpointer,
    CheckpointManager,
    ConfigError,
    DirectIOError,
    DirectIOUnavailableError,
)
from asyncckpt.sinks import capabilities, local_path

from .conftest import run_bench

MiB = 1 << 20
O_DIRECT = getattr(os, "O_DIRECT", 0)


def ckpt() -> AsyncCheckpointer:
    return AsyncCheckpointer(chunk_size=MiB, num_buffers=4)


def open_flags(directory: Path, name: str) -> list[int]:
    """The open flags of every descriptor of this process on a file in ``directory`` whose
    name contains ``name`` (from /proc/self/fdinfo)."""
    flags = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
            info = Path(f"/proc/self/fdinfo/{fd}").read_text()
        except OSError:  # closed meanwhile
            continue
        if target.startswith(f"{directory}/") and name in os.path.basename(target):
            flags += [int(line.split()[1], 8) for line in info.splitlines() if line.startswith("flags:")]
    return flags


def chunks_watching(directory: Path, seen: list[list[int]]) -> Iterator[bytes]:
    """Caller data for a save; before each later chunk, the flags of the file being written."""
    for i in range(4):
        if i:
            seen.append(open_flags(directory, ".ckpt.bin."))  # the temporary: .NAME.ackpt~...
        yield bytes([i]) * MiB


async def test_a_save_writes_with_o_direct_on_the_disk(disk_path: Path) -> None:
    seen: list[list[int]] = []
    async with ckpt() as c:
        result = await c.save(
            f"direct://{disk_path}/ckpt.bin", 4 * MiB, data=chunks_watching(disk_path, seen)
        )
    assert any(seen), "the temporary file was never open during the save"
    assert all(flags & O_DIRECT for during in seen for flags in during)
    assert result.metadata.direct_io is True
    assert result.metadata.direct_io_reason.startswith("O_DIRECT required by direct://")
    assert (disk_path / "ckpt.bin").stat().st_size > 4 * MiB  # data, then the sealed manifest


async def test_a_load_reads_only_through_o_direct(disk_path: Path) -> None:
    target = disk_path / "ckpt.bin"
    data = os.urandom(3 * MiB + 1234)  # an unaligned tail, and the footer: bounced, still direct
    async with ckpt() as c:
        await c.save(f"direct://{target}", data=data)
        got, seen = bytearray(), []
        async for chunk in c.iter_load(f"direct://{target}"):
            seen.append(open_flags(disk_path, "ckpt.bin"))
            got += chunk
        loaded = await c.load(f"direct://{target}")
    assert bytes(got) == data
    assert all(during and all(flags & O_DIRECT for flags in during) for during in seen)
    assert loaded.metadata.direct_io is True


async def test_state_steps_and_the_manager_on_direct(disk_path: Path) -> None:
    state = {"w": np.random.default_rng(3).standard_normal(70_001).astype(np.float32), "step": 7}
    root = f"direct://{disk_path}/run"
    async with ckpt() as c:
        await c.save_state(f"direct://{disk_path}/s.safetensors", state)
        back = await c.load_state(f"direct://{disk_path}/s.safetensors")
        assert back.state["w"].tobytes() == state["w"].tobytes() and back.state["step"] == 7
    async with CheckpointManager(root, every_n_steps=2, keep_last=1, chunk_size=MiB, num_buffers=4) as mgr:
        for step in range(1, 7):
            await mgr.maybe_save(step, {"w": np.full(5000, step, np.float32)})
    assert sorted(os.listdir(disk_path / "run")) == ["step-6"]
    into: dict[str, Any] = {"w": np.zeros(5000, np.float32)}
    async with CheckpointManager(root, chunk_size=MiB, num_buffers=4) as mgr:
        assert await mgr.restore(into=into) == 6
    assert (into["w"] == 6).all()
    assert local_path(root) == disk_path / "run" and capabilities(root).has_directories


async def test_refused_on_a_file_system_in_memory_before_any_io(shm_path: Path) -> None:
    target = f"direct://{shm_path}/ckpt.bin"
    async with ckpt() as c:
        with pytest.raises(DirectIOUnavailableError) as caught:
            await c.save(target, MiB)
        assert str(shm_path / "ckpt.bin") in str(caught.value) and "(tmpfs)" in str(caught.value)
        assert isinstance(caught.value, DirectIOError) and isinstance(caught.value, ConfigError)
        with pytest.raises(DirectIOUnavailableError, match="tmpfs"):
            await c.save_state(f"direct://{shm_path}/s.safetensors", {"w": np.zeros(4)})
        (shm_path / "plain.bin").write_bytes(b"x" * 4096)  # a file there, to load
        with pytest.raises(DirectIOUnavailableError, match="tmpfs"):
            await c.load(f"direct://{shm_path}/plain.bin")
    with pytest.raises(DirectIOUnavailableError, match="tmpfs"):
        CheckpointManager(f"direct://{shm_path}/run")
    assert sorted(os.listdir(shm_path)) == ["plain.bin"]  # no temporary, no directory


def test_direct_io_off_contradicts_direct(disk_path: Path) -> None:
    run = run_bench(
        f"direct://{disk_path}/ck.bin", "--size", "1MiB", "--direct-io", "off", "-q", cwd=disk_path
    )
    assert run.returncode == 2, run.stderr
    assert run.stderr.count("\n") == 1 and "direct_io=False" in run.stderr, run.stderr
    assert os.listdir(disk_path) == []


def test_the_bench_cli_on_direct(disk_path: Path, shm_path: Path) -> None:
    args = ("--size", "2MiB", "--chunk-size", "1MiB", "--num-buffers", "4")
    run = run_bench(f"direct://{disk_path}/ck.bin", *args, cwd=disk_path)
    assert run.returncode == 0, run.stderr
    assert "Direct I/O:        on — O_DIRECT required by direct:// (ext4)" in run.stdout or (
        "Direct I/O:        on — O_DIRECT required by direct://" in run.stdout
    ), run.stdout
    assert "Cache defeat:      O_DIRECT" in run.stdout
    refused = run_bench(f"direct://{shm_path}/ck.bin", *args, cwd=disk_path)
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.count("\n") == 1 and "tmpfs" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr and os.listdir(shm_path) == []


async def test_o_direct_on_a_file_system_in_memory_is_reported_as_no_cache_bypassed(shm_path: Path) -> None:
    """A plain path on tmpfs, which takes O_DIRECT since Linux 6.6: the result said "page cache
    bypassed", and ``direct_io=True`` (``--direct-io on``) was honoured there, though tmpfs's
    files are the page cache. Now the reason says so, and ``direct_io=True`` is refused."""
    target = shm_path / "ckpt.bin"
    async with ckpt() as c:
        saved = await c.save(target, 2 * MiB)
        loaded = await c.load(target)
    for meta in (saved.metadata, loaded.metadata):
        assert "tmpfs, which keeps files in memory: no page cache is bypassed" in meta.direct_io_reason
    async with AsyncCheckpointer(chunk_size=MiB, num_buffers=4, direct_io=True) as c:
        with pytest.raises(DirectIOUnavailableError, match=r"direct_io=True but .*tmpfs.*ckpt2\.bin"):
            await c.save(shm_path / "ckpt2.bin", MiB)
        with pytest.raises(DirectIOUnavailableError, match=r"direct_io=True but .*tmpfs.*ckpt\.bin"):
            await c.load(target)
    assert not [n for n in os.listdir(shm_path) if "ckpt2" in n]  # refused: nothing of it left

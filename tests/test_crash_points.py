"""An interrupted overwrite never loses both checkpoints (issue: the old manifest was deleted
before the rename, so a crash in the close phase left neither loadable).

Checkpoint A is at P; a real child process saves B over it and is SIGKILLed at each named
step of the save (creating the temporary, its first and last writes, fsync, linking A aside,
the rename, the aside's unlink after the save returned) and at fixed-seed instants. After
each kill, ``load(P)`` must return A or B, complete and verified byte by byte; the dead
save's temporary and aside name are collected by the next save into the directory. The
same invariant holds for cancellation at every point of a save.
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from asyncckpt import AsyncCheckpointer
from asyncckpt.owner import parse_temp
from asyncckpt.units import MiB

from .cancel_points import cancel_everywhere
from .conftest import ROOT, save_span

CHILD = Path(__file__).with_name("crash_child.py")
CHUNK = 1 * MiB
SIZE_A, SEED_A = 3 * CHUNK + 123, 1
SIZE_B, SEED_B = 6 * CHUNK + 4567, 2  # 7 chunks: 7 pwrites (the last one carries the footer)
#: random kill instants; the stress session runs the longer variant (``CRASH_INSTANTS=50``)
INSTANTS = int(os.environ.get("CRASH_INSTANTS", "10"))


async def save(target: Path, size: int, seed: int) -> None:
    async with AsyncCheckpointer(chunk_size=CHUNK, num_buffers=3, seed=seed) as ckpt:
        await ckpt.save(target, size)


async def loaded_version(target: Path) -> str:
    """'A' or 'B' after verifying every byte against the seeded generator."""
    async with AsyncCheckpointer(chunk_size=CHUNK, num_buffers=3) as ckpt:
        result = await ckpt.load(target, verify="regenerate")
    version = {(SIZE_A, SEED_A): "A", (SIZE_B, SEED_B): "B"}[(result.size_bytes, result.metadata.seed)]
    return version


def child(target: Path, step: str, nth: int) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, str(CHILD), str(target), str(SIZE_B), str(SEED_B), step, str(nth)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


async def assert_invariant(tmp_path: Path, target: Path) -> str:
    version = await loaded_version(target)
    await save(tmp_path / "next.bin", CHUNK, 9)  # the next save into the directory collects
    names = await asyncio.to_thread(os.listdir, tmp_path)
    left = sorted(n for n in names if n not in ("ck.bin", "next.bin"))
    assert left == [], left
    return version


@pytest.mark.parametrize(
    ("step", "nth", "expect", "asides"),
    [
        ("open", 1, "A", 0),  # about to create the temporary
        ("pwrite", 1, "A", 0),  # temporary created and fallocated, nothing written
        ("pwrite", 4, "A", 0),  # mid data
        ("pwrite", 7, "A", 0),  # the last chunk with the sealed manifest
        ("fsync", 1, "A", 0),  # everything written, not yet durable nor published
        ("link", 1, "A", 0),  # durable, about to link A aside
        ("replace", 1, "A", 1),  # A linked aside, about to be renamed over
        ("fsync", 2, "B", 1),  # renamed (published), the directory not yet fsync'd
        ("unlink", 1, "B", 1),  # published and durable, the aside not yet unlinked
    ],
    ids=[
        "open",
        "first-write",
        "mid-writes",
        "footer-write",
        "fsync",
        "link-aside",
        "rename",
        "dir-fsync",
        "aside-unlink",
    ],
)
async def test_sigkill_at_each_step_leaves_old_or_new(
    tmp_path: Path, step: str, nth: int, expect: str, asides: int
) -> None:
    target = tmp_path / "ck.bin"
    await save(target, SIZE_A, SEED_A)
    proc = child(target, step, nth)
    out, err = await asyncio.to_thread(proc.communicate, timeout=60)
    assert proc.returncode == -9, (out, err)  # killed at the step, not finished or failed
    left = await asyncio.to_thread(aside_names, tmp_path)
    assert len(left) == asides, left
    for name in left:
        await check_aside(tmp_path / name, target, proc.pid, expect)
    assert await assert_invariant(tmp_path, target) == expect


def aside_names(directory: Path) -> list[str]:
    """Hidden names holding a replaced checkpoint (linked aside before the rename)."""
    return [n for n in os.listdir(directory) if (o := parse_temp(n)) is not None and o.replaced]


async def check_aside(aside: Path, target: Path, pid: int, published: str) -> None:
    """The aside carries its (dead) owner, and holds A: before the rename as a second link
    of the published file (so the rename drops no last link), after it as the only one."""
    owner = parse_temp(aside.name)
    assert owner is not None and owner.pid == pid and owner.name == target.name
    same = os.stat(aside).st_ino == os.stat(target).st_ino
    assert same == (published == "A")
    if same:
        assert os.stat(target).st_nlink == 2
    else:
        assert await loaded_version(aside) == "A"  # the old data is still reachable


async def test_sigkill_at_random_instants_leaves_old_or_new(tmp_path: Path) -> None:
    target = tmp_path / "ck.bin"
    await save(target, SIZE_A, SEED_A)
    span = await save_span(child(target, "none", 0))  # calibrate: how long a save takes once started
    seen = set()
    for delay in random.Random(1234).sample(range(1000), INSTANTS):
        await save(target, SIZE_A, SEED_A)
        proc = child(target, "none", 0)
        assert proc.stdout is not None
        await asyncio.to_thread(proc.stdout.readline)  # the save starts now
        await asyncio.sleep(span * delay / 1000)  # the chosen instant (not a synchronisation)
        proc.kill()
        await asyncio.to_thread(proc.communicate, timeout=60)
        seen.add(await assert_invariant(tmp_path, target))
    assert seen <= {"A", "B"}


async def test_cancellation_at_every_point_says_what_was_published(tmp_path: Path) -> None:
    """Cancel after k loop iterations, for every k a save takes: a save that raised says
    whether it published, and the checkpoint on disk agrees."""
    target = tmp_path / "ck.bin"
    async with AsyncCheckpointer(chunk_size=CHUNK, num_buffers=3, seed=SEED_B) as ckpt:
        await ckpt.save(target, SIZE_A)  # warm pool and executor
        outcomes = await cancel_everywhere(
            lambda: ckpt.save(target, SIZE_B),
            lambda: save(target, SIZE_A, SEED_A),
            lambda: loaded_version(target),
            points=40,
        )
    assert outcomes == {True, False}  # both sides of the commit were hit

"""Overwriting a file checkpoint (issue 29, part 5): the rename that publishes drops no last
link, because the replaced file was linked to a hidden aside name first; that name is unlinked
after the save returned, in a worker thread, and ``aclose`` waits for it.

ext4 frees a replaced file's extents inside the rename that drops its last link (0.32-0.37 s
of a 2 GiB save); ``benchmarks/bench_overwrite.py`` measures the save times. The crash points
of the new steps are in ``tests/test_crash_points.py``.
"""

from __future__ import annotations

import mmap
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from asyncckpt import AsyncCheckpointer
from asyncckpt.blocking import Offload
from asyncckpt.owner import parse_temp
from asyncckpt.sinks import FileSink, SinkOptions, make_sink
from asyncckpt.sinks.store import Store
from asyncckpt.units import MiB

from .conftest import expected_bytes


def hidden(directory: Path) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.startswith("."))


async def test_complete_leaves_the_old_file_aside_until_aclose(tmp_path: Path) -> None:
    """Deterministic: ``complete`` returns with the old version under the aside name (its
    unlink only scheduled), and the handle's ``aclose`` awaits that unlink."""
    target = tmp_path / "ck.bin"
    target.write_bytes(b"A" * 8192)
    old = os.stat(target)
    sink = make_sink(str(target), backend=None, executor=Offload(2), options=SinkOptions())
    buf = mmap.mmap(-1, 4096)  # page-aligned: O_DIRECT takes it
    buf[:] = b"B" * 4096
    try:
        await sink.open(4096)
        await sink.write_part(0, memoryview(buf))
        await sink.complete()
        assert target.read_bytes() == b"B" * 4096  # published
        assert sink.shared.pending == 1  # the unlink is not part of the commit
        (aside,) = hidden(tmp_path)
        owner = parse_temp(aside)
        assert owner is not None and owner.replaced and owner.pid == os.getpid()
        st = os.stat(tmp_path / aside)
        assert (st.st_ino, st.st_nlink) == (old.st_ino, 1)  # the old version, its last link
        assert (tmp_path / aside).read_bytes() == b"A" * 8192
    finally:
        await sink.aclose()
        buf.close()
    assert sink.shared.pending == 0
    assert os.listdir(tmp_path) == ["ck.bin"]


async def test_overwrites_through_a_checkpointer_leave_nothing_behind(tmp_path: Path) -> None:
    """Saves over one path, as ``--repeat`` and a training loop do: each publishes the new
    version complete, and no aside name survives ``settle`` or ``aclose``."""
    target = tmp_path / "ck.bin"
    async with AsyncCheckpointer(chunk_size=MiB, num_buffers=3, seed=7) as ckpt:
        for size in (3 * MiB + 5, 2 * MiB + 7, 4 * MiB + 1):
            await ckpt.save(target, size)
            assert target.read_bytes()[:size] == expected_bytes(size, MiB, 7)
        await ckpt.storage.settle()
        assert os.listdir(tmp_path) == ["ck.bin"]
        await ckpt.save(target, MiB + 3)
    assert os.listdir(tmp_path) == ["ck.bin"]
    async with AsyncCheckpointer(chunk_size=MiB, num_buffers=3) as ckpt:
        result = await ckpt.load(target, verify="regenerate")
    assert result.size_bytes == MiB + 3


async def test_a_symlink_is_replaced_and_what_it_points_to_kept(tmp_path: Path) -> None:
    """Only a regular file is linked aside; a symlink at the target is replaced as before,
    and the file it pointed to is not the tool's to touch."""
    theirs = tmp_path / "theirs.bin"
    theirs.write_bytes(b"keep me")
    target = tmp_path / "ck.bin"
    target.symlink_to(theirs)
    async with AsyncCheckpointer(chunk_size=MiB, num_buffers=3) as ckpt:
        await ckpt.save(target, MiB)
    assert not target.is_symlink() and target.stat().st_size > MiB
    assert theirs.read_bytes() == b"keep me" and os.stat(theirs).st_nlink == 1
    assert sorted(os.listdir(tmp_path)) == ["ck.bin", "theirs.bin"]


async def test_removing_a_directory_waits_for_a_pending_aside_in_it(tmp_path: Path) -> None:
    """A step directory emptied and removed right after a file in it was overwritten: the
    aside name still pending there must not make the ``rmdir`` fail (ENOTEMPTY). One worker
    thread runs the calls in the order they are asked, so the order is deterministic."""
    step = tmp_path / "step-1"
    step.mkdir()
    target = step / "ck.bin"
    target.write_bytes(b"A" * 4096)
    with ThreadPoolExecutor(1) as executor:
        store = Store("file", FileSink, executor=executor, options=SinkOptions())
        sink = store.handle(str(target))
        buf = mmap.mmap(-1, 4096)
        try:
            await sink.open(4096)
            await sink.write_part(0, memoryview(buf))
            await sink.complete()  # the aside's unlink is scheduled, not started
            os.unlink(target)  # what retention does to the step's objects (no await between)
            await store.handle(str(step)).delete()
        finally:
            await sink.aclose()
            await store.aclose()
            buf.close()
    assert os.listdir(tmp_path) == []


async def test_a_writer_process_unlinks_its_asides_before_it_exits(tmp_path: Path) -> None:
    """Isolated, the aside's unlink runs in the writer process; ``aclose`` reaps that process
    only after it finished."""
    target = tmp_path / "ck.bin"
    async with AsyncCheckpointer(chunk_size=MiB, num_buffers=3, seed=5, isolation="process") as ckpt:
        for size in (2 * MiB + 1, MiB + 9, 2 * MiB):
            await ckpt.save(target, size)
    assert os.listdir(tmp_path) == ["ck.bin"]
    assert target.read_bytes()[: 2 * MiB] == expected_bytes(2 * MiB, MiB, 5)

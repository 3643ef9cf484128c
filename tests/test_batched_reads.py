"""Reads of whole checksum blocks from a file, done in batches: each batch of consecutive reads
(up to a read chunk of bytes) is read, checked and handed to its destination in one worker
thread hop, instead of two hops per read (a resharded rank's many 4 MiB reads paid them).

What the batches must keep: the bytes are the file's, a flipped byte is named with its offset
and nothing after it in the batch is handed out, a file cut short during the load is named,
a cancelled load returns only once its thread has finished and its buffer is back in the pool,
and a hop that makes no progress is still caught by the stall watchdog."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from asyncckpt import AsyncCheckpointer, ChecksumMismatchError, StallError, TruncatedError
from asyncckpt.engine.chunks import CHECK_BLOCK
from asyncckpt.engine.load import Known, read
from asyncckpt.results.records import LoadResult
from asyncckpt.sinks import file as file_sink
from asyncckpt.sinks.memory import MemorySink
from asyncckpt.state.reshard import object_header

BUFFERS = 3
#: every other checksum block from the fifth on: 30 separate reads of 256 KiB, one batch
SPANS = tuple((b * CHECK_BLOCK, CHECK_BLOCK) for b in range(4, 64, 2))


async def saved(c: AsyncCheckpointer, path: Path) -> None:
    rng = np.random.default_rng(5)  # 16 MiB of tensors: the data starts on a checksum block
    await c.save_state(
        path, {f"t{i:02d}": rng.standard_normal(1 << 18).astype(np.float32) for i in range(16)}
    )


async def load_spans(
    c: AsyncCheckpointer, path: Path, deliver: Callable[[int, memoryview, bool], None], head: Any = None
) -> tuple[LoadResult, list[int]]:
    """Read ``SPANS`` of the object verified, each handed to ``deliver`` in its thread; the
    result and the offsets handed out in order afterwards (none: every read was delivered).
    ``head``: the object's header, when already read."""
    size, manifest, _ = head or await object_header(c.runtime, c.storage, str(path))
    taken: list[int] = []

    async def take(at: int, view: memoryview) -> None:
        taken.append(at)

    known = Known(manifest, size, True, SPANS)
    return await read(c.runtime, c.storage, str(path), take, known=known, deliver=deliver), taken


async def buffers_back(c: AsyncCheckpointer) -> None:
    """Every buffer of the pool is free again (once the first use finished faulting them in)."""
    pool = c.runtime.pool_now
    assert pool is not None
    await pool.faulted()
    assert pool.stats().free == BUFFERS


def keeper(into: dict[int, bytes]) -> Callable[[int, memoryview, bool], None]:
    def deliver(at: int, view: memoryview, beside: bool) -> None:
        assert beside  # whole blocks: checked on their own
        into[at] = bytes(view)

    return deliver


async def test_a_batch_of_small_reads_takes_one_thread_hop_and_delivers_the_files_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s.safetensors"
    hops: list[str] = []
    real = file_sink.run_blocking

    async def spy(executor: Any, fn: Any, *args: Any) -> Any:
        hops.append(getattr(fn, "__name__", repr(fn)))
        return await real(executor, fn, *args)

    got: dict[int, bytes] = {}
    async with AsyncCheckpointer(num_buffers=BUFFERS) as c:
        await saved(c, path)
        head = await object_header(c.runtime, c.storage, str(path))
        monkeypatch.setattr(file_sink, "run_blocking", spy)  # the file's own hops, after the header
        result, taken = await load_spans(c, path, keeper(got), head)
    raw = path.read_bytes()
    assert sorted(got) == [at for at, _ in SPANS] and taken == []
    assert all(got[at] == raw[at : at + n] for at, n in SPANS)
    assert hops.count("_read_batch_sync") == 1 and "_timed_read" not in hops, hops
    assert result.chunks == len(SPANS) and result.size_bytes == sum(n for _, n in SPANS)


async def test_a_flipped_byte_is_named_and_nothing_after_it_in_the_batch_is_delivered(tmp_path: Path) -> None:
    path = tmp_path / "s.safetensors"
    got: dict[int, bytes] = {}
    async with AsyncCheckpointer(num_buffers=BUFFERS) as c:
        await saved(c, path)
        bad = SPANS[2][0] + 1000
        with path.open("r+b") as f:
            f.seek(bad)
            byte = f.read(1)[0]
            f.seek(bad)
            f.write(bytes([byte ^ 0x04]))
        with pytest.raises(ChecksumMismatchError) as info:
            await load_spans(c, path, keeper(got))
        await buffers_back(c)
    block = bad - bad % CHECK_BLOCK  # caller data: the bad block is known, not the byte
    assert info.value.offset == block and f"{block}..{block + CHECK_BLOCK - 1}" in str(info.value)
    assert str(path) in str(info.value)
    assert sorted(got) == [SPANS[0][0], SPANS[1][0]]


async def test_a_file_cut_short_during_the_load_is_named_with_the_offset(tmp_path: Path) -> None:
    path = tmp_path / "s.safetensors"
    cut = SPANS[1][0]

    def truncate_at_first(at: int, view: memoryview, beside: bool) -> None:
        if at == SPANS[0][0]:
            os.truncate(path, cut)  # another process cut the object after its header was read

    async with AsyncCheckpointer(num_buffers=BUFFERS) as c:
        await saved(c, path)
        with pytest.raises(TruncatedError) as info:
            await load_spans(c, path, truncate_at_first)
        await buffers_back(c)
    assert info.value.offset == cut and f"offset {cut}" in str(info.value)


async def test_a_cancelled_load_returns_after_its_thread_and_with_its_buffer_back(tmp_path: Path) -> None:
    path = tmp_path / "s.safetensors"
    entered, go = threading.Event(), threading.Event()
    busy, delivered = [0], [0]

    def slow(at: int, view: memoryview, beside: bool) -> None:
        busy[0] += 1
        entered.set()
        go.wait()
        delivered[0] += 1
        busy[0] -= 1

    async with AsyncCheckpointer(num_buffers=BUFFERS) as c:
        await saved(c, path)
        task = asyncio.create_task(load_spans(c, path, slow))
        await asyncio.to_thread(entered.wait)  # the batch's thread is in its first delivery
        task.cancel()
        go.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert busy[0] == 0 and delivered[0] >= 1  # no thread still writes into a destination
        await buffers_back(c)
        got: dict[int, bytes] = {}
        await load_spans(c, path, keeper(got))  # the checkpointer is still usable
    assert len(got) == len(SPANS)


async def test_a_batch_that_makes_no_progress_is_a_stall(tmp_path: Path) -> None:
    path = tmp_path / "s.safetensors"
    release = threading.Event()

    def stuck(at: int, view: memoryview, beside: bool) -> None:
        release.wait()  # a thread stuck inside the hop, as in a hung read

    try:
        async with AsyncCheckpointer(num_buffers=BUFFERS, stall_timeout=0.5) as c:
            await saved(c, path)
            with pytest.raises(StallError) as info:
                await load_spans(c, path, stuck)
    finally:
        release.set()  # the abandoned thread finishes
    assert (
        info.value.stage
        == f"read at offset {SPANS[0][0]} ({len(SPANS)} reads, {len(SPANS) * CHECK_BLOCK} bytes)"
    )


async def test_a_store_without_batches_reads_each_piece_then_hops_for_its_work() -> None:
    """``Sink.read_batch``'s default (any store): the same contract, one read at a time."""
    data = bytes(range(256)) * 64
    buf = bytearray(4096)
    seen: list[tuple[int, int, bytes]] = []

    def after(i: int, got: int) -> None:
        seen.append((i, got, bytes(buf[:got])))

    async with AsyncCheckpointer() as c:
        sink = await c.storage.handle("memory://batched-default")
        assert isinstance(sink, MemorySink) and not sink.reads_in_batches
        try:
            await sink.open(len(data))
            await sink.write_part(0, memoryview(data))
            await sink.complete()
            await sink.open_read()
            await sink.read_batch([(0, memoryview(buf)[:1000]), (16000, memoryview(buf))], after)
        finally:
            await sink.delete()
            await sink.aclose()
    assert seen == [(0, 1000, data[:1000]), (1, len(data) - 16000, data[16000:])]

"""Saving bytes read from storage straight into the pipeline's buffers (``ReadFrom``, the
source of a tier's drain): the bytes arrive exactly, a source that ends early is named with
its offset and nothing is published, and a read waiting on storage does not hold the CPU lane
the checksums of earlier chunks need."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from asyncckpt import AsyncCheckpointer
from asyncckpt.checksum import crc
from asyncckpt.errors import IntegrityError
from asyncckpt.sources import ReadFrom

MiB = 1 << 20
OPTIONS = {"chunk_size": MiB, "num_buffers": 4}


def reading(data: bytes, end: int | None = None) -> Callable[[int, memoryview], Awaitable[int]]:
    """``read_into`` over ``data``, which seems to end at ``end`` (a truncated object)."""
    stop = len(data) if end is None else end

    async def read_into(offset: int, view: memoryview) -> int:
        n = max(0, min(len(view), stop - offset))
        view[:n] = data[offset : offset + n]
        return n

    return read_into


def chunk_crcs(data: bytes, chunk: int) -> list[int]:
    return [crc(data[i : i + chunk]) for i in range(0, len(data), chunk)]


async def test_bytes_read_from_storage_are_saved_exactly(tmp_path: Path) -> None:
    data = os.urandom(5 * MiB + 1234)  # the last chunk is short and unaligned
    target = tmp_path / "copy.bin"
    async with AsyncCheckpointer(**OPTIONS) as ckpt:
        await ckpt.save(
            target, len(data), data=ReadFrom(reading(data), "src"), expect_crc32c=chunk_crcs(data, MiB)
        )
    assert target.read_bytes() == data


async def test_a_source_that_ends_early_is_named_and_nothing_is_published(tmp_path: Path) -> None:
    data = os.urandom(4 * MiB)
    target = tmp_path / "copy.bin"
    async with AsyncCheckpointer(**OPTIONS) as ckpt:
        with pytest.raises(IntegrityError, match=rf"'local/obj' ended at offset {3 * MiB} of {4 * MiB}"):
            await ckpt.save(
                target,
                len(data),
                data=ReadFrom(reading(data, end=3 * MiB), "local/obj"),
                expect_crc32c=chunk_crcs(data, MiB),
            )
    assert os.listdir(tmp_path) == []  # no partial file, no temporary name


async def test_a_read_waiting_on_storage_leaves_the_cpu_lane_to_the_checksums(tmp_path: Path) -> None:
    """The read of chunk 1 completes only once chunk 0 is written and checksummed. A read that
    held the CPU lane (which fills and checksums share) would wait for ever on that checksum."""
    data = os.urandom(3 * MiB)
    first_done = asyncio.Event()
    plain = reading(data)

    async def read_into(offset: int, view: memoryview) -> int:
        if offset >= MiB:
            await first_done.wait()
        return await plain(offset, view)

    async with AsyncCheckpointer(**OPTIONS) as ckpt:
        async with asyncio.timeout(10):  # a failure's bound, not a synchronisation
            await ckpt.save(
                tmp_path / "copy.bin",
                len(data),
                data=ReadFrom(read_into, "src"),
                progress=lambda _n: first_done.set(),
                expect_crc32c=chunk_crcs(data, MiB),
            )
    assert (tmp_path / "copy.bin").read_bytes() == data


async def test_a_chunk_held_by_its_read_is_labelled_read_not_generation(tmp_path: Path) -> None:
    """A drain's fill is the read of the object it copies: where that read is the slow stage,
    the result says "Read" (and its text "Source read"), never "Generation"."""
    data = os.urandom(3 * MiB)
    plain = reading(data)

    async def slow_storage(offset: int, view: memoryview) -> int:
        await asyncio.sleep(0.05)  # a slow store's latency per read, not a synchronisation
        return await plain(offset, view)

    async with AsyncCheckpointer(**OPTIONS) as ckpt:
        result = await ckpt.save(
            tmp_path / "copy.bin",
            len(data),
            data=ReadFrom(slow_storage, "local/obj"),
            expect_crc32c=chunk_crcs(data, MiB),
        )
    counts = result.bottleneck_counts
    assert set(counts) == {"I/O", "Read"} and sum(counts.values()) == 3  # no "Generation"
    assert counts["Read"] >= 1  # each read waits 50 ms; a 1 MiB write takes a few
    text = str(result)
    assert "Source read:" in text and "Generation:" not in text

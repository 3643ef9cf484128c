"""The defaults reach the device (issue 12, goal 1): with no tuning at all, a save into a local
file keeps several writes in flight and a load keeps several reads in flight.

The defect this guards: the file backend's default was one write (and one read) in flight, so
a user running the defaults left a quarter of the device unused (fio wanted depth 4).

No timings and no mocks: a real ``AsyncCheckpointer()`` writes and reads a real file through
the real file sink. Concurrency is observed from the per-chunk records the pipeline keeps
(``t_write_start``/``t_write_end`` around each ``write_part``, ``t_read_start``/``t_read_end``
around each ``read_into``, stamped on the event loop): the peak number of storage calls issued
and not yet returned. The test arranges that the pipeline *can* have every call in flight at
once, without depending on how fast anything runs:

- save: the first chunks of caller data arrive in pieces below the caller source's inline-copy
  threshold, so the producer fills and queues them in one step of the loop; every writer task
  then takes one and issues its write in the next step, before any completion can be seen
  (completions from worker threads reach the loop in a later step). Only the number of writer
  tasks the defaults start decides the peak.
- load: the reader issues reads while buffers and reader slots are free, in one step of the
  loop; the same argument applies.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from asyncckpt import AsyncCheckpointer
from asyncckpt.config import CheckpointConfig
from asyncckpt.sinks import backend_class
from asyncckpt.sinks.file import FileSink
from asyncckpt.sources.caller import INLINE_COPY

# what the defaults must give for local files (docs/benchmarks.md, "Defaults reach the device")
FILE_IN_FLIGHT = 4


def peak_overlap(intervals: Sequence[tuple[float, float]]) -> int:
    """Most intervals open at one instant (an end at the same stamp as a start closes first)."""
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    peak = level = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    return peak


def caller_data(chunk: int, chunks: int, inline_chunks: int) -> Iterator[memoryview]:
    """``chunks`` chunks of a byte pattern; the first ``inline_chunks`` in pieces small enough to
    be copied on the loop (no thread hop: the producer queues them in one step), the rest whole
    (copied in a worker thread, so the producer yields to the writers)."""
    piece_size = INLINE_COPY // 2
    assert chunk % piece_size == 0
    piece = memoryview(bytes(i % 251 for i in range(piece_size)))
    whole = memoryview(bytes(piece) * (chunk // piece_size))
    for index in range(chunks):
        if index < inline_chunks:
            for _ in range(chunk // piece_size):
                yield piece
        else:
            yield whole


def test_file_backend_default_is_several_in_flight() -> None:
    assert backend_class("file") is FileSink
    assert FileSink.default_in_flight == FILE_IN_FLIGHT
    cfg = CheckpointConfig()
    # each write in flight holds a buffer: the pool must leave the producer buffers to fill
    assert cfg.max_in_flight is None
    assert cfg.num_buffers >= 2 * FILE_IN_FLIGHT


async def test_default_save_keeps_writes_in_flight(disk_path: Path) -> None:
    cfg = CheckpointConfig()
    chunks = 2 * FILE_IN_FLIGHT
    size = chunks * cfg.chunk_size
    target = disk_path / "defaults.ckpt"
    async with AsyncCheckpointer() as ckpt:  # no tuning: the library's defaults
        # a first save's buffers are handed out one by one as their pages are faulted in
        # (beside the writes, issue 29): every buffer free first, so only the writers count
        await (await ckpt.runtime.pool()).faulted()
        result = await ckpt.save(
            target, size, data=caller_data(cfg.chunk_size, chunks, inline_chunks=FILE_IN_FLIGHT)
        )
    assert result.metadata.backend == "file"
    assert result.metadata.max_in_flight == FILE_IN_FLIGHT
    assert len(result.records) == chunks
    writes = [(r.t_write_start, r.t_write_end) for r in result.records]
    assert all(0 < start < end for start, end in writes)
    assert peak_overlap(writes) == FILE_IN_FLIGHT
    assert target.stat().st_size > size  # published: the data and its sealed manifest


async def test_default_load_keeps_reads_in_flight(disk_path: Path) -> None:
    cfg = CheckpointConfig()
    # four rounds of reads: with two, a first read that ended before the last reader of the
    # first round started (a cold start, seen in 1 run of 8 here) left the peak at 3
    chunks = 4 * FILE_IN_FLIGHT
    target = disk_path / "defaults.ckpt"
    async with AsyncCheckpointer() as ckpt:
        await ckpt.save(target, chunks * cfg.chunk_size)
        result = await ckpt.load(target)  # default verification, default readers
    assert result.metadata.max_in_flight == FILE_IN_FLIGHT
    assert len(result.records) == chunks
    reads = [(r.t_read_start, r.t_read_end) for r in result.records]
    assert all(0 < start < end for start, end in reads)
    assert peak_overlap(reads) == FILE_IN_FLIGHT


# -- a file in memory (tmpfs): one write at a time ---------------------------------------------
# Its writes copy into page-cache pages under the inode's lock (tmpfs takes O_DIRECT and still
# does): a second writer only spins on that lock. Measured into /dev/shm, 2 GiB: two writers
# 0.37-0.40 CPU-s/GB, one 0.26, at the same 3.8-4.0 GB/s (docs/benchmarks.md, goal 5).
MiB = 1 << 20


@pytest.mark.parametrize("isolation", ["none", "process"])
async def test_a_save_into_tmpfs_keeps_one_write_in_flight(shm_path: Path, isolation: str) -> None:
    chunks = 2 * FILE_IN_FLIGHT
    target = shm_path / "in-memory.ckpt"
    async with AsyncCheckpointer(chunk_size=MiB, isolation=isolation) as ckpt:  # else defaults
        result = await ckpt.save(target, chunks * MiB, data=caller_data(MiB, chunks, FILE_IN_FLIGHT))
    assert result.metadata.max_in_flight == 1
    assert result.metadata.extra["memory_file_system"] == "tmpfs"
    writes = [(r.t_write_start, r.t_write_end) for r in result.records]
    assert len(writes) == chunks and peak_overlap(writes) == 1
    assert target.stat().st_size > chunks * MiB


async def test_a_caller_s_writes_in_flight_are_kept_on_tmpfs(shm_path: Path) -> None:
    async with AsyncCheckpointer(chunk_size=MiB, max_in_flight=3) as ckpt:
        result = await ckpt.save(shm_path / "asked.ckpt", 6 * MiB)
    assert result.metadata.max_in_flight == 3

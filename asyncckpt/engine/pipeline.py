"""The streaming pipeline: producer → asyncio.Queue → bounded writers, buffers from a pool.

One producer fills pooled buffers in the owned executor and queues them; ``max_in_flight``
writer tasks drain the queue. With a ``cpu_lane`` (the library's default thread budget,
``leave_loop_core``) a fill and a chunk's CRC32C take turns instead of running side by side,
so the pipeline's CPU work never uses more than the generator's threads and the event loop
keeps its core; without one (the MLPerf rule) they overlap. A buffer returns to the pool
only after its write completed, and on error or cancellation every task stops, every
executor job is waited for (see ``run_blocking``) and every buffer is reclaimed before the
caller aborts the sink.
"""

from __future__ import annotations

import asyncio
import contextlib
import mmap
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import TypeVar

from ..blocking import run_blocking
from ..checksum import timed_crc
from ..pool import BufferPool, PoolBuffer, close_mapping, private_mapping
from ..results.metrics import ChunkRecord, notify_progress
from ..sinks.base import Sink
from ..sources.base import Source, fill_sequentially
from .monitor import now
from .seal import Sealer, align_up

ProgressFn = Callable[[int], None]
T = TypeVar("T")


@dataclass(frozen=True)
class WriteJob:
    """What every way of writing one object is given: its size, its chunking, the writes kept
    in flight, whom to tell of progress, the footer that seals it, and whether to checksum."""

    total: int
    chunk_size: int
    max_in_flight: int
    progress: ProgressFn | None = None
    sealer: Sealer | None = None
    checksums: bool = True


@dataclass
class PipelineTimes:
    """Raw outcome of one pass through the pipeline."""

    records: list[ChunkRecord] = field(default_factory=list)
    start: float = 0.0
    end: float = 0.0


class FirstFailure:
    """The failures of one pass, in the order they happened: the first is the cause.

    A task group reports errors in the order its tasks *finish*; a writer whose part failed
    first may finish last (it still waits for its checksum thread) while another writer's
    later error (a closed upload, "request has already completed") finishes first.
    """

    def __init__(self) -> None:
        self.first: BaseException | None = None

    def saw(self, exc: BaseException) -> None:
        if self.first is None and not isinstance(exc, asyncio.CancelledError):
            self.first = unwrap_group(exc) if isinstance(exc, BaseExceptionGroup) else exc

    def cause(self, group: BaseExceptionGroup[BaseException]) -> BaseException:
        return self.first if self.first is not None else unwrap_group(group)

    async def watch(self, step: Awaitable[T]) -> T:
        """Await ``step``; a failure is recorded the moment it happens."""
        try:
            return await step
        except BaseException as exc:
            self.saw(exc)
            raise


def unwrap_group(exc: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first real error of a task group (cancellations are consequences, not causes)."""
    leaves: list[BaseException] = []

    def walk(e: BaseException) -> None:
        if isinstance(e, BaseExceptionGroup):
            for sub in e.exceptions:
                walk(sub)
        else:
            leaves.append(e)

    walk(exc)
    for leaf in leaves:
        if not isinstance(leaf, asyncio.CancelledError):
            return leaf
    return leaves[0] if leaves else exc


async def stream(
    source: Source,
    sink: Sink,
    pool: BufferPool,
    executor: Executor,
    job: WriteJob,
    *,
    cpu_lane: asyncio.Lock | None = None,
    cpu_executor: Executor | None = None,
) -> PipelineTimes:
    """Move ``job.total`` bytes from ``source`` to ``sink``; return per-chunk records.

    With a ``sealer`` the last chunk is written only after every other one, together with the
    footer that carries the manifest (see :mod:`asyncckpt.engine.seal`). With a ``cpu_lane`` fills
    and checksums hold it in turn (writes never do: they wait on the device, not a CPU). Fills
    and checksums run on ``cpu_executor`` when given (lower-priority threads: priority.py).
    ``checksums=False`` (``integrity="none"``): the checksum stage does not run at all, and
    each record's ``checksum`` stays None.
    """
    total, max_in_flight, progress, sealer, checksums = (
        job.total,
        job.max_in_flight,
        job.progress,
        job.sealer,
        job.checksums,
    )
    lane = cpu_lane if cpu_lane is not None else contextlib.nullcontext()
    cpu = cpu_executor if cpu_executor is not None else executor

    async def checksum(view: memoryview) -> tuple[int, float, float]:
        async with lane:
            return await run_blocking(cpu, timed_crc, view)

    queue: asyncio.Queue[tuple[PoolBuffer, ChunkRecord] | None] = asyncio.Queue()
    held: set[PoolBuffer] = set()  # checked out during this call, for reclaiming on failure
    out = PipelineTimes(start=now())
    last_offset = (total - 1) // pool.chunk_size * pool.chunk_size if total else 0
    before_last = 0  # bytes of the other chunks written so far
    others_done = asyncio.Event()
    if last_offset == 0:
        others_done.set()
    failures = FirstFailure()

    async def write_sealed(buf: PoolBuffer, rec: ChunkRecord) -> float | None:
        """The last chunk: its checksum, then (all others written) data + footer in one go."""
        assert sealer is not None
        if checksums:
            rec.checksum, rec.checksum_s, rec.checksum_cpu_s = await checksum(buf.view[: rec.nbytes])
        await others_done.wait()
        footer = sealer.footer(out.records)
        rec.t_write_start = now()
        end = align_up(rec.nbytes) + len(footer)
        if end <= len(buf.view):  # room in the buffer: the footer follows the data in place
            buf.view[rec.nbytes : end - len(footer)] = bytes(end - len(footer) - rec.nbytes)
            buf.view[end - len(footer) : end] = footer
            return await sink.write_part(rec.offset, buf.view[:end])
        if rec.nbytes == len(buf.view):  # a full chunk, then the footer as its own small write
            first = await sink.write_part(rec.offset, buf.view[: rec.nbytes])
            second = await _write_copy(sink, rec.offset + rec.nbytes, footer)
            return None if first is None or second is None else first + second
        return await _write_copy(sink, rec.offset, sealer.seal.tail(buf.view[: rec.nbytes], footer))

    async def write_other(view: memoryview, rec: ChunkRecord) -> float | None:
        """Any chunk but the sealed last one: written, its checksum (if any) taken beside it."""
        if not checksums:
            inner = await failures.watch(sink.write_part(rec.offset, view))
            rec.t_write_end = now()
            return inner
        # the checksum reads the buffer while it is being written: off the producer's serial
        # path (fill then checksum would halve what generation can feed), timed on its own,
        # and the buffer is released only when both are done
        async with asyncio.TaskGroup() as both:
            summing = both.create_task(checksum(view))
            # recorded now, not when this group has waited for `summing`
            inner = await failures.watch(sink.write_part(rec.offset, view))
            rec.t_write_end = now()
        rec.checksum, rec.checksum_s, rec.checksum_cpu_s = summing.result()
        return inner

    async def produce() -> None:
        offset = index = 0
        while offset < total:
            t0 = now()
            buf = await pool.acquire()
            held.add(buf)
            rec = ChunkRecord(index, offset, 0, t_acquire=t0, wait_free_s=now() - t0)
            want = min(pool.chunk_size, total - offset)
            async with lane if source.uses_cpu else contextlib.nullcontext():
                rec.nbytes, rec.fill_s = await source.fill(buf.view[:want], cpu)
            if rec.nbytes != want:
                raise RuntimeError(f"source produced {rec.nbytes} of {want} bytes at {offset}")
            out.records.append(rec)
            queue.put_nowait((buf, rec))  # unbounded: the pool is the bound
            offset += want
            index += 1
        for _ in range(max_in_flight):
            queue.put_nowait(None)

    async def consume() -> None:
        nonlocal before_last
        while True:
            t0 = now()
            item = await queue.get()
            if item is None:
                return
            buf, rec = item
            view = buf.view[: rec.nbytes]
            rec.t_write_start = now()
            rec.wait_data_s = rec.t_write_start - t0
            if sealer is not None and rec.offset == last_offset:
                inner = await failures.watch(write_sealed(buf, rec))
                rec.t_write_end = now()
            else:
                inner = await write_other(view, rec)
                before_last += rec.nbytes
                if before_last == last_offset:
                    others_done.set()
            rec.write_s = inner if inner is not None else rec.t_write_end - rec.t_write_start
            held.discard(buf)
            pool.release(buf)  # only now: the write has completed
            if progress is not None:
                notify_progress(progress, rec)

    try:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(failures.watch(produce()), name="asyncckpt-producer")
            for i in range(max_in_flight):
                tg.create_task(failures.watch(consume()), name=f"asyncckpt-writer-{i}")
    except BaseExceptionGroup as group:
        raise failures.cause(group) from None
    finally:
        pool.reclaim(list(held))
    out.end = now()
    return out


async def stream_in_place(sink: Sink, job: WriteJob) -> PipelineTimes:
    """Move ``total`` synthetic bytes whose chunks the sink generates itself, in memory its
    client library owns (after ``sink.begin_generation`` said yes): no pool buffer, no copy.

    ``max_in_flight`` requests are kept outstanding so the sink (a writer process) always has
    the next chunk to make; it makes them in offset order, the generator's order. Each record
    carries the times measured where the work ran: generation as ``fill_s``, the CRC32C of
    the bytes handed over as ``checksum_s``, the library's own calls as ``write_s`` (and the
    write interval is that last part of the request, so generation never counts as I/O).
    With a ``sealer`` the footer follows the data as one small (copied) write.
    """
    out = PipelineTimes(start=now())
    total, chunk_size, max_in_flight, progress, sealer = (
        job.total,
        job.chunk_size,
        job.max_in_flight,
        job.progress,
        job.sealer,
    )
    pending = iter(enumerate(range(0, total, chunk_size)))
    failures = FirstFailure()

    async def writer() -> None:
        for index, offset in pending:  # shared: each writer takes the next chunk in order
            rec = ChunkRecord(index, offset, min(chunk_size, total - offset), t_acquire=now())
            out.records.append(rec)
            done = await failures.watch(sink.write_generated(offset, rec.nbytes))
            rec.t_write_end = now()
            rec.fill_s, rec.write_s = done.fill_s, done.write_s
            rec.checksum, rec.checksum_s = done.checksum, done.checksum_s
            rec.t_write_start = rec.t_write_end - rec.write_s
            if progress is not None:
                notify_progress(progress, rec)

    try:
        async with asyncio.TaskGroup() as tg:
            for i in range(max_in_flight):
                tg.create_task(failures.watch(writer()), name=f"asyncckpt-writer-{i}")
    except BaseExceptionGroup as group:
        raise failures.cause(group) from None
    out.records.sort(key=lambda r: r.index)
    if sealer is not None:
        footer = sealer.footer(out.records)
        await _write_copy(sink, total, bytes(align_up(total) - total) + footer)
    out.end = now()
    return out


async def _write_copy(sink: Sink, offset: int, data: bytes) -> float | None:
    """Write ``data`` from a page-aligned copy (O_DIRECT needs one)."""
    arena = mmap.mmap(-1, max(len(data), 1))
    view = memoryview(arena)[: len(data)]
    try:
        view[:] = data
        return await sink.write_part(offset, view)
    finally:
        view.release()
        close_mapping(arena)


async def write_preallocated(
    source: Source, sink: Sink, executor: Executor, job: WriteJob
) -> tuple[PipelineTimes, float]:
    """The method streaming replaces: generate the whole checkpoint in RAM, then write it.

    Returns the write records and the generation time. Memory grows with the checkpoint.
    Checksums (unless ``checksums=False``) are known before any write here, so a ``sealer``'s
    footer is placed in RAM behind the data and goes out with the last chunk.
    """
    total, chunk_size, sealer = job.total, job.chunk_size, job.sealer
    end = sealer.seal.object_size if sealer is not None else total
    arena = private_mapping(end)
    whole = memoryview(arena)
    view = whole[:total]
    try:
        gen_s = await fill_sequentially(source, view, chunk_size, executor)
        records: list[ChunkRecord] = []
        for index, offset in enumerate(range(0, total, chunk_size)):
            rec = ChunkRecord(index, offset, min(chunk_size, total - offset))
            if job.checksums:
                rec.checksum, rec.checksum_s, rec.checksum_cpu_s = await run_blocking(
                    executor, timed_crc, view[offset : offset + rec.nbytes]
                )
            records.append(rec)
        if sealer is not None:
            footer = sealer.footer(records)
            whole[end - len(footer) : end] = footer  # the gap before it is the mapping's zeros
        return await write_whole(sink, whole, records, job, end=end, fill_s=gen_s), gen_s
    finally:
        view.release()
        whole.release()
        close_mapping(arena)


async def write_whole(
    sink: Sink,
    whole: memoryview,
    records: list[ChunkRecord],
    job: WriteJob,
    *,
    end: int,
    fill_s: float = 0.0,
) -> PipelineTimes:
    """Write an object that is already whole in page-aligned memory, chunk by chunk, with up to
    ``job.max_in_flight`` writes at once and no copy (each write is a slice of ``whole``).

    ``records`` carry each chunk's offset, size and known checksum; the last chunk's write runs
    to ``end`` (a footer placed behind the data). ``fill_s`` (how long making the bytes took)
    is spread over the records by size, so per-chunk metrics still add up.
    """
    total, progress = job.total, job.progress
    out = PipelineTimes(start=now())
    pending = iter(records)
    failures = FirstFailure()

    async def writer() -> None:
        for rec in pending:  # shared: each writer takes the next chunk in order
            offset = rec.offset
            out.records.append(rec)
            rec.t_acquire = rec.t_write_start = now()
            stop = end if offset + rec.nbytes == total else offset + rec.nbytes
            inner = await failures.watch(sink.write_part(offset, whole[offset:stop]))
            rec.t_write_end = now()
            rec.write_s = inner if inner is not None else rec.t_write_end - rec.t_write_start
            rec.fill_s = fill_s * rec.nbytes / total if total else 0.0
            if progress is not None:
                notify_progress(progress, rec)

    try:
        async with asyncio.TaskGroup() as tg:
            for _ in range(job.max_in_flight):
                tg.create_task(failures.watch(writer()))
    except BaseExceptionGroup as group:
        raise failures.cause(group) from None
    out.end = now()
    out.records.sort(key=lambda r: r.index)
    return out

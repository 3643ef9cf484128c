"""The streaming pipeline: producer → asyncio.Queue → bounded writers, buffers from a pool.

One producer fills pooled buffers in the owned executor and queues them; ``max_in_flight``
writer tasks drain the queue. A buffer returns to the pool only after its write completed,
and on error or cancellation every task stops, every executor job is waited for (see
``run_blocking``) and every buffer is reclaimed before the caller aborts the sink.
"""

from __future__ import annotations

import asyncio
import mmap
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field

from ._blocking import run_blocking
from .checksum import timed_crc
from .metrics import ChunkRecord
from .monitor import now
from .pool import BufferPool, PoolBuffer, close_mapping
from .sinks.base import Sink
from .sources.base import Source, fill_sequentially

ProgressFn = Callable[[int], None]


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
    *,
    total: int,
    max_in_flight: int,
    progress: ProgressFn | None = None,
) -> PipelineTimes:
    """Move ``total`` bytes from ``source`` to ``sink``; return per-chunk records."""
    queue: asyncio.Queue[tuple[PoolBuffer, ChunkRecord] | None] = asyncio.Queue()
    held: set[PoolBuffer] = set()  # checked out during this call, for reclaiming on failure
    out = PipelineTimes(start=now())
    failures = FirstFailure()

    async def produce() -> None:
        try:
            await _produce()
        except BaseException as exc:
            failures.saw(exc)
            raise

    async def _produce() -> None:
        offset = index = 0
        while offset < total:
            t0 = now()
            buf = await pool.acquire()
            held.add(buf)
            rec = ChunkRecord(index, offset, 0, t_acquire=t0, wait_free_s=now() - t0)
            want = min(pool.chunk_size, total - offset)
            rec.nbytes, rec.fill_s = await source.fill(buf.view[:want], executor)
            if rec.nbytes != want:
                raise RuntimeError(f"source produced {rec.nbytes} of {want} bytes at {offset}")
            out.records.append(rec)
            queue.put_nowait((buf, rec))  # unbounded: the pool is the bound
            offset += want
            index += 1
        for _ in range(max_in_flight):
            queue.put_nowait(None)

    async def consume() -> None:
        try:
            await _consume()
        except BaseException as exc:
            failures.saw(exc)
            raise

    async def _consume() -> None:
        while True:
            t0 = now()
            item = await queue.get()
            if item is None:
                return
            buf, rec = item
            view = buf.view[: rec.nbytes]
            rec.t_write_start = now()
            rec.wait_data_s = rec.t_write_start - t0
            # the checksum reads the buffer while it is being written: off the producer's
            # serial path (fill then checksum would halve what generation can feed), timed
            # on its own, and the buffer is released only when both are done
            async with asyncio.TaskGroup() as both:
                summing = both.create_task(run_blocking(executor, timed_crc, view))
                try:
                    inner = await sink.write_part(rec.offset, view)
                except BaseException as exc:
                    failures.saw(exc)  # now, not when this task group has waited for `summing`
                    raise
                rec.t_write_end = now()
            rec.checksum, rec.checksum_s = summing.result()
            rec.write_s = inner if inner is not None else rec.t_write_end - rec.t_write_start
            held.discard(buf)
            pool.release(buf)  # only now: the write has completed
            if progress is not None:
                progress(rec.nbytes)

    try:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(produce(), name="asyncckpt-producer")
            for i in range(max_in_flight):
                tg.create_task(consume(), name=f"asyncckpt-writer-{i}")
    except BaseExceptionGroup as group:
        raise failures.cause(group) from None
    finally:
        pool.reclaim(list(held))
    out.end = now()
    return out


async def write_preallocated(
    source: Source,
    sink: Sink,
    executor: Executor,
    *,
    total: int,
    chunk_size: int,
    max_in_flight: int,
    progress: ProgressFn | None = None,
) -> tuple[PipelineTimes, float]:
    """The method streaming replaces: generate the whole checkpoint in RAM, then write it.

    Returns the write records and the generation time. Memory grows with the checkpoint.
    """
    arena = mmap.mmap(-1, max(total, 1))
    view = memoryview(arena)[:total]
    try:
        gen_s = await fill_sequentially(source, view, chunk_size, executor)
        sums = [
            await run_blocking(executor, timed_crc, view[o : o + chunk_size])
            for o in range(0, total, chunk_size)
        ]
        out = PipelineTimes(start=now())
        offsets = iter(range(0, total, chunk_size))
        failures = FirstFailure()

        async def writer() -> None:
            try:
                await _writer()
            except BaseException as exc:
                failures.saw(exc)
                raise

        async def _writer() -> None:
            for offset in offsets:
                rec = ChunkRecord(len(out.records), offset, min(chunk_size, total - offset))
                rec.checksum, rec.checksum_s = sums[offset // chunk_size]
                out.records.append(rec)
                rec.t_acquire = rec.t_write_start = now()
                inner = await sink.write_part(offset, view[offset : offset + rec.nbytes])
                rec.t_write_end = now()
                rec.write_s = inner if inner is not None else rec.t_write_end - rec.t_write_start
                rec.fill_s = gen_s * rec.nbytes / total if total else 0.0
                if progress is not None:
                    progress(rec.nbytes)

        try:
            async with asyncio.TaskGroup() as tg:
                for _ in range(max_in_flight):
                    tg.create_task(writer())
        except BaseExceptionGroup as group:
            raise failures.cause(group) from None
        out.end = now()
        return out, gen_s
    finally:
        view.release()
        close_mapping(arena)

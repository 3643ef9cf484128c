"""The one save orchestration: a source's bytes through the pool and pipeline into a handle.

``save_object`` is what :meth:`AsyncCheckpointer.save` and the state saves run: it takes the
runtime (pool, executors, lock) and the storage router as arguments, asks the handle for its
capabilities (a shared arena, generation in place, writes in flight), seals synthetic data
with its manifest, and publishes only after every byte is durable.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from collections.abc import Sequence

from .. import modes
from ..config import validate_size
from ..cpu import run_queue
from ..errors import ConfigError, SourceChangedError
from ..results.metrics import GENERATION, READ, ChunkRecord, label_chunks
from ..results.records import RunSetup, SaveResult
from ..sinks.base import Sink
from ..sinks.commit import commit, note_publication
from ..sinks.isolation import SharedBufferPool
from ..sinks.router import StorageRouter
from ..sources import CallerData, ReadFrom, make_source
from ..sources.base import Source
from ..sources.caller import as_bytes_view
from .monitor import LoopMonitor, now
from .pipeline import (
    PipelineTimes,
    ProgressFn,
    WriteJob,
    stream,
    stream_in_place,
    write_preallocated,
    write_whole,
)
from .runinfo import Span, run_fields, with_setup
from .runtime import Runtime
from .seal import SealSpec, sealer_for

log = logging.getLogger("asyncckpt")


async def save_object(
    rt: Runtime,
    storage: StorageRouter,
    uri: str | os.PathLike[str],
    size: int | None,
    data: CallerData | ReadFrom | None,
    method: modes.SaveMethod,
    progress: ProgressFn | None,
    expect_crc32c: Sequence[int] | None,
    *,
    in_place: bool,
) -> SaveResult:
    """Save ``size`` bytes (synthetic, or ``data``) to ``uri``; see ``AsyncCheckpointer.save``.

    ``in_place``: ``data`` is the whole object in page-aligned memory nobody else writes (a host
    staging area) and ``expect_crc32c`` its chunk CRCs, so it is written from where it lies (no
    pool, no copy, no second checksum) unless a writer process needs the bytes in its arena.
    """
    started = now()
    modes.parse("method", method, modes.SaveMethod, fold=False)
    if size is None:
        if data is None or not hasattr(data, "__len__"):
            raise ConfigError("size is required unless data is a bytes-like object")
        size = as_bytes_view(data).nbytes
    size = validate_size(size)
    cfg = rt.config
    if expect_crc32c is not None and not cfg.checksums:
        raise ConfigError(
            "expect_crc32c checks the bytes written against the pipeline's CRC32Cs, and "
            "integrity='none' computes none: use a checkpointer with integrity='crc32c'"
        )
    sink = await storage.handle(os.fspath(uri))
    sink.check()
    try:
        t_lock = now()
        async with rt.lock:  # one save at a time per pool
            lock_wait = now() - t_lock
            source = make_source(cfg.generator, size, seed=cfg.seed, threads=rt.budget.threads, data=data)
            facts, b = source.describe(), rt.budget
            log.info(
                "save %s: %d bytes, %s; generator %s with %s threads (%d requested: %s rule, %d "
                "usable CPUs, %d ranks on this node from %s)",
                sink.uri,
                size,
                method,
                facts.get("generator"),
                facts.get("gen_threads"),
                b.threads,
                b.rule_used,
                b.usable_cpus,
                b.local_ranks,
                b.local_ranks_source,
            )
            try:
                placed = data if in_place and isinstance(data, memoryview) else None
                result = await _save(rt, sink, source, size, method, progress, expect_crc32c, placed)
                return with_setup(result, now() - started - lock_wait)
            finally:
                source.close()
                await sink.aclose()
    except BaseException as exc:  # wherever it struck, say what became of the save
        note_publication(exc, sink.uri, published=sink.committed)
        raise


async def _save(
    rt: Runtime,
    sink: Sink,
    source: Source,
    size: int,
    method: str,
    progress: ProgressFn | None,
    expect_crc32c: Sequence[int] | None,
    placed: memoryview | None,
) -> SaveResult:
    cfg = rt.config
    executor = rt.executor()
    isolated = sink.uses_shared_arena
    if isolated or expect_crc32c is None:
        placed = None  # a writer process reads chunks from its shared arena only
    if placed is not None:
        method = "preallocated"  # the object lies whole in RAM: memory = its size, not the pool
    pool = await rt.pool(shared=isolated) if method == "streaming" else None
    if pool is not None:
        pool.reset_stats()
        if isolated and isinstance(pool, SharedBufferPool):
            sink.attach_arena(pool.arena)  # chunks travel to the writer as arena offsets
    # data that carries its own checksums (a save_state object: a safetensors header) is
    # published as it is; everything else gets its manifest sealed into a footer
    sealer = (
        sealer_for(SealSpec(sink.uri, size, cfg.chunk_size, source.describe(), sink.backend, cfg.integrity))
        if expect_crc32c is None
        else None
    )
    async with LoopMonitor(cfg.monitor_interval, sink=sink, on_late=rt.loop_late) as monitor:
        t0 = now()
        await sink.open(size if sealer is None else sealer.seal.object_size)
        t_open = now()
        # after open: the opened object may know better than its backend (a file on tmpfs)
        in_flight = cfg.max_in_flight or min(sink.writes_in_flight(), cfg.num_buffers)
        try:
            # synthetic data whose sink can generate it in its library's memory (s3dlio's
            # reserve(), in the writer process by default) skips the pool and its copy
            spec = source.gen_spec() if pool is not None and expect_crc32c is None else None
            if spec is not None and isolated:
                spec = rt.writer_spec(spec)
            if spec is not None:
                spec = dataclasses.replace(spec, checksums=cfg.checksums)
            job = WriteJob(size, cfg.chunk_size, in_flight, progress, sealer, cfg.checksums)
            if spec is not None and await sink.begin_generation(spec):
                times = await stream_in_place(sink, job)
                gen_s = sum(r.fill_s for r in times.records)
            elif pool is not None:
                lane_executor = rt.cpu_executor(helpers=source.uses_helpers)
                lane_before = run_queue(rt.lane_tids())  # the threads this save's lane runs on
                # leave_loop_core: fills and checksums take turns, so the pipeline's
                # CPU work stays within the generator's threads and the loop keeps a core
                lane = asyncio.Lock() if rt.cpu_lane_used else None
                times = await stream(
                    source, sink, pool, executor, job, cpu_lane=lane, cpu_executor=lane_executor
                )
                gen_s = sum(r.fill_s for r in times.records)
                rt.warn_if_starved(lane_before)
            elif placed is not None and expect_crc32c is not None:
                chunks = known_chunks(size, cfg.chunk_size, expect_crc32c)
                times, gen_s = await write_whole(sink, placed, chunks, job, end=size), 0.0
            else:
                times, gen_s = await write_preallocated(source, sink, executor, job)
            if expect_crc32c is not None:  # the bytes written are the bytes the caller summed
                check_pipeline(times.records, expect_crc32c, sink.uri)
        except BaseException:
            await sink.abort()
            raise
        t_close = now()
        close_detail = await commit(sink)
        t_end = now()
    return _result(
        rt,
        sink,
        source,
        method,
        size,
        times,
        gen_s,
        in_flight,
        monitor,
        open_s=t_open - t0,
        close_s=t_end - t_close,
        wall_s=t_end - t0,
        close_detail=close_detail,
        lane_prepass=placed is not None,
    )


def _result(
    rt: Runtime,
    sink: Sink,
    source: Source,
    method: str,
    size: int,
    times: PipelineTimes,
    gen_s: float,
    in_flight: int,
    monitor: LoopMonitor,
    *,
    open_s: float,
    close_s: float,
    wall_s: float,
    close_detail: dict[str, float],
    lane_prepass: bool = False,
) -> SaveResult:
    recs = times.records
    snk = sink.describe()
    # chunks generated in the client library's memory (a writer process) report that generator
    src = snk.get("generated_in_library_by") or source.describe()
    snk.setdefault("isolation", "none")
    cfg = rt.config
    setup = RunSetup(
        backend=sink.backend,
        uri=sink.uri,
        chunk_size=cfg.chunk_size,
        num_buffers=cfg.num_buffers,
        pool_bytes=cfg.pool_bytes if method == "streaming" else size,
        max_in_flight=in_flight,
        generator=src.get("generator", "?"),
        seed=src.get("seed"),
        gen_threads=src.get("gen_threads"),
        gen_threads_requested=src.get("gen_threads_requested", rt.budget.threads),
        fsync=cfg.fsync,
        **rt.cpu_priority(
            method,
            in_library="generated_in_library_by" in snk,
            generator=src.get("generator"),
            lane_prepass=lane_prepass,
        ),
    )
    span = Span(method, size, open_s, close_s, wall_s, close_detail)
    stages = {"generation": source.cpu_s} | (
        {"checksum": sum(r.checksum_cpu_s for r in recs)} if cfg.checksums else {}
    )
    fill = GENERATION if source.uses_cpu else READ  # a reading source's fill waits on storage
    counts = label_chunks(recs, in_flight, close_s, fill=fill)
    run = run_fields(setup, rt.budget, snk, monitor, recs, counts, span, stages)
    return SaveResult.from_records(recs, gen_s=gen_s, integrity=cfg.integrity, **run)


def known_chunks(size: int, chunk: int, crcs: Sequence[int]) -> list[ChunkRecord]:
    """Records of an object's chunks whose CRC32Cs were computed before the write."""
    offsets = range(0, size, chunk)
    if len(offsets) != len(crcs):
        raise RuntimeError(f"{len(crcs)} chunk checksums for {len(offsets)} chunks")
    return [
        ChunkRecord(index, offset, min(chunk, size - offset), checksum=crc)
        for index, (offset, crc) in enumerate(zip(offsets, crcs, strict=True))
    ]


def check_pipeline(records: Sequence[ChunkRecord], expected: Sequence[int], uri: str) -> None:
    """The bytes the pipeline wrote must be the bytes the pre-pass summed (else: refuse)."""
    got = [r.checksum for r in sorted(records, key=lambda r: r.offset)]
    if len(got) != len(expected):
        raise SourceChangedError(f"save of {uri!r}: {len(got)} chunks written, {len(expected)} expected")
    for rec, want in zip(sorted(records, key=lambda r: r.offset), expected, strict=True):
        if rec.checksum != want:
            raise SourceChangedError(
                f"save of {uri!r}: bytes {rec.offset}..{rec.offset + rec.nbytes - 1} changed while being "
                "saved (CRC32C differs from the pre-pass): with staging='none' the arrays must not be "
                "modified until save_state returns; use staging='host' to keep training meanwhile. "
                "Nothing was published.",
                offset=rec.offset,
            )

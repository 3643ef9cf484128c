"""``AsyncCheckpointer``: the library's front door. One pool and one executor, many saves."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor
from types import TracebackType
from typing import Any

from . import modes, priority, steps
from ._blocking import Offload, run_blocking
from .commit import commit, note_publication
from .config import CheckpointConfig, validate_size
from .cpu import helper_threads, run_queue
from .errors import ConfigError
from .isolation import SharedBufferPool, WriterPolicy, resolve_policy
from .isolation.process_sink import ProcessSink, WriterPool
from .load_api import LoadsMixin
from .manifest import manifest_uri
from .metrics import ChunkRecord, label_chunks
from .monitor import LoopMonitor, now
from .pipeline import PipelineTimes, ProgressFn, stream, stream_in_place, write_preallocated, write_whole
from .pool import BufferPool
from .priority import CpuThreads
from .results import RunSetup, SaveResult
from .runinfo import run_fields
from .seal import sealer_for
from .sinks import BACKENDS, SinkOptions, import_backend, resolve_backend
from .sinks.base import Sink
from .sinks.store import Store
from .sources import CallerData, make_source
from .sources.base import GenSpec, Source
from .state.api import StateMixin
from .state.chunks import check_pipeline
from .topology import thread_budget
from .watchdog import unwrap, watch

log = logging.getLogger("asyncckpt")
# a save's fills and checksums "starved" (a warning) when they waited for a CPU longer than they
# ran and longer than this (a quiet machine: a few per cent of their CPU time)
STARVED_MIN_S = 0.5
#: loop-monitor ticks at least monitor.LATE_S late after which a pinned lane gets every CPU back
LATE_TICKS = 2
#: backends whose modules this process has imported (off the loop, by ``_sink``)
_IMPORTED: set[str] = set()
METHODS = modes.choices(modes.SaveMethod)


def _release(executors: list[Executor], pool: BufferPool | None, wait: bool) -> None:
    """Blocking part of ``aclose`` (run off the loop)."""
    for executor in executors:
        executor.shutdown(wait=wait)  # a thread stuck in a library (a stall) is not waited for
    if pool is not None:
        pool.close()


class AsyncCheckpointer(StateMixin, LoadsMixin):
    """Streams checkpoints to storage (and back: ``load``/``iter_load``) without blocking the loop.

    >>> async with AsyncCheckpointer(chunk_size=32 * 2**20, num_buffers=8) as ckpt:
    ...     result = await ckpt.save("/nvme/ckpt/rank0.bin", 16 * 2**30)

    The buffer pool is allocated (and pre-touched) on first use and reused by every later
    save, as a training loop checkpoints many times; ``aclose()`` releases it.
    """

    def __init__(self, config: CheckpointConfig | None = None, **options: Any) -> None:
        if config is not None and options:
            raise ConfigError("pass either config= or keyword options, not both")
        self.config = config if config is not None else CheckpointConfig.from_options(**options)
        self._budget = thread_budget(self.config.gen_threads, rule=self.config.thread_budget)
        self._pool: BufferPool | None = None
        self._executor: Offload | None = None
        self._cpu: CpuThreads | None = None  # CPU-only work at a lower priority (priority.py)
        self._pinned = False  # whether the last save's CPU-only work ran beside the loop's CPU
        self._late_ticks = 0  # loop-monitor ticks LATE_S late since the lane was last pinned
        self._lock = asyncio.Lock()
        self._closed = False
        self._stalled = False  # set by the stall watchdog
        self._stores: dict[str, Store] = {}  # backend name → store (sinks/store.py)
        self._retired: list[Store] = []
        self._writers = WriterPool()  # writer processes, reused by every object (isolation)

    # -- lifecycle ---------------------------------------------------------------------
    async def __aenter__(self) -> AsyncCheckpointer:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Release the stores' clients, the writer processes, the pool and the thread budget;
        idempotent.

        Off the loop thread: unmapping a large pool (and joining threads) took tens of
        milliseconds on it, a stall for everything else the loop serves.
        """
        await self._close_state()  # a background staged save finishes first
        stores, self._stores, self._retired = [*self._retired, *self._stores.values()], {}, []
        for store in stores:
            await store.aclose()
        await self._writers.aclose()  # every writer process reaped
        self._closed = True
        executors = [e for e in (self._executor, self._cpu) if e is not None]
        self._executor = self._cpu = None
        pool, self._pool = self._pool, None
        if self._stalled:  # a stuck thread may still read the pool: unmapped when unused
            pool = None
        if executors or pool is not None:
            await run_blocking(Offload(1), _release, executors, pool, not self._stalled)

    def _ensure_executor(self) -> Offload:
        if self._closed:
            raise RuntimeError("AsyncCheckpointer is closed")
        if self._stalled:  # threads may still hold buffers: neither is reused (watchdog.py)
            self._executor, self._pool, self._stalled = None, None, False
        if self._executor is None:
            self._executor = self._new_executor()
        return self._executor

    def _cpu_executor(self) -> Executor:
        """Where fills and checksums run: threads of their own at ``cpu_nice``, with ``cpu_idle``
        in ``SCHED_IDLE``, with ``cpu_pin`` only beside the CPU this (the loop's) thread is on now
        (dgen-py's pool lowered and pinned to match); or the shared budget when none applies."""
        nice, idle = self.config.resolved_cpu_nice, self.config.resolved_cpu_idle
        executor = self._ensure_executor()
        beside = priority.cpus_beside(priority.current_cpu()) if self.config.resolved_cpu_pin else None
        self._pinned, self._late_ticks = beside is not None, 0
        mask = beside or os.sched_getaffinity(0)  # unpinned: every CPU the loop's thread may use
        # dgen-py's pool is process-global: another checkpointer may have pinned it
        priority.pin(helper_threads(), mask)
        if nice == 0 and not idle and beside is None:
            return executor
        if self._cpu is None:  # under the CPU lane one call runs at a time: one thread, reused
            # (several idle threads woken in turn left the loop a worse tail: 2.4 ms p99, not 1.2)
            self._cpu = CpuThreads(1 if self._cpu_lane_used else executor.threads, nice, idle=idle)
        priority.lower(helper_threads(), nice, idle=idle)
        self._cpu.cpus = beside
        priority.pin(self._cpu.tids(), mask)
        return self._cpu

    def _loop_late(self, lag: float) -> None:
        """The loop monitor saw a tick ``lag`` s late: after ``LATE_TICKS`` of them with the lane
        pinned, give it every CPU for the rest of the save. Pinned at niceness 10 beside a core
        that other processes keep busy, the lane's Python thread gets preempted while it holds
        the GIL and the loop waits for it: p99 16-24 ms with a busy loop on each core, against
        2.5-4.2 ms unpinned, whose thread the kernel moves to the loop's core as soon as the loop
        sleeps on the GIL. The next save pins again."""
        self._late_ticks += 1
        if not self._pinned or self._late_ticks < LATE_TICKS:
            return
        self._pinned = False
        if self._cpu is not None:
            self._cpu.cpus = None
        priority.pin(self._lane_tids(), os.sched_getaffinity(0))
        log.info(
            "event loop %.1f ms late with the CPU lane pinned beside its core: other threads keep "
            "the lane's cores busy, so it may use every CPU for the rest of this save",
            lag * 1e3,
        )

    def _cpu_priority(
        self, method: str, *, in_library: bool, generator: str | None, lane_prepass: bool = False
    ) -> dict[str, Any]:
        """The niceness, class and pinning the save's CPU-only work ran at: the pool's fills and checksums
        on the lowered threads; generation in a writer process at its niceness (never SCHED_IDLE:
        its uploads run there too); a whole-object save's on the shared threads. dgen-py's pool
        is process-global and keeps the lowest priority any checkpointer gave it: a fill there
        ran at that, whatever this checkpointer's options. A staged state save (``lane_prepass``)
        writes CRCs it already has: its CPU-only work was the CRC pass, on the lane."""
        cfg = self.config
        if lane_prepass:
            return {
                "cpu_nice": cfg.resolved_cpu_nice,
                "cpu_idle": cfg.resolved_cpu_idle,
                "cpu_pinned": self._pinned,
            }
        if in_library:
            return {"cpu_nice": cfg.resolved_cpu_nice, "cpu_idle": False, "cpu_pinned": False}
        if method != "streaming":
            return {"cpu_nice": 0, "cpu_idle": False, "cpu_pinned": False}
        nice, idle = cfg.resolved_cpu_nice, cfg.resolved_cpu_idle
        if generator == "dgen":
            pool = priority.priorities(helper_threads())
            nice = max([nice, *(n for n, _ in pool)])
            idle = idle or any(i for _, i in pool)
        return {"cpu_nice": nice, "cpu_idle": idle, "cpu_pinned": self._pinned}

    def _lane_tids(self) -> tuple[int, ...]:
        """The threads that run fills and checksums (at a lower priority unless niceness 0)."""
        return (*(self._cpu.tids() if self._cpu is not None else ()), *helper_threads())

    def _warn_if_starved(self, before: tuple[float, float]) -> None:
        """Say so when ``SCHED_IDLE`` kept the save's fills and checksums waiting for a CPU more
        than running: other threads kept every CPU busy (two CPU burners on the 2-core VM: a
        save ran at 0.011-0.014 GB/s, at 0.5-0.9 with niceness 10 alone)."""
        lane = self._lane_tids()
        cpu, waited = (b - a for a, b in zip(before, run_queue(lane), strict=True))
        # the class the lane really ran in: dgen-py's pool keeps what an earlier save gave it
        idle = self.config.resolved_cpu_idle or any(i for _, i in priority.priorities(lane))
        if idle and waited > max(STARVED_MIN_S, cpu):
            log.warning(
                "the save's fills and checksums waited %.2f s for a CPU and ran %.2f s: other "
                "threads held every CPU and SCHED_IDLE (cpu_idle) gives this work only what they "
                "leave; cpu_idle=False gives it a share (niceness %d), at the cost of event-loop lag",
                waited,
                cpu,
                self.config.resolved_cpu_nice,
            )

    def _writer_spec(self, spec: GenSpec) -> GenSpec:
        """Generation in a writer process may take the rank's whole CPU share when the writer
        runs at a background niceness: the core "leave_loop_core" keeps free is for a loop in
        another process, and the niceness already lets that loop take a core the moment it
        wakes (s3dlio: 2 generator threads, not 1, on the 2-core reference VM)."""
        b = self._budget
        if b.overridden or self.config.resolved_cpu_nice == 0 or b.share <= spec.threads:
            return spec
        return dataclasses.replace(spec, threads=b.share)

    @property
    def _cpu_lane_used(self) -> bool:
        return self.config.thread_budget == "leave_loop_core"

    def _new_executor(self) -> Offload:
        """The thread budget: as many blocking calls at once as buffers, plus open/commit."""
        return Offload(self.config.num_buffers + 2)

    def _new_pool(self, shared: bool) -> BufferPool:
        """The buffer pool; in shared memory when a writer process must see it."""
        cls = SharedBufferPool if shared else BufferPool
        return cls(self.config.chunk_size, self.config.num_buffers)

    async def _ensure_pool(self, shared: bool = False) -> BufferPool:
        if shared and self._pool is not None and not isinstance(self._pool, SharedBufferPool):
            # a writer process needs the pool in shared memory; it stays there
            await run_blocking(self._ensure_executor(), self._pool.close)
            self._pool = None
        if self._pool is None:
            pool = self._new_pool(shared)
            await run_blocking(self._ensure_executor(), pool.touch)
            self._pool = pool
        return self._pool

    async def prepare(self, uri: str | os.PathLike[str]) -> float:
        """Do now what the first save or load of ``uri`` would do first: import its backend,
        start the threads, allocate and touch the buffer pool (in shared memory when a writer
        process serves ``uri``). A caller that times checkpoints (the bench's workload run, as
        DLIO allocates before its timed region) keeps this setup out of the first one.
        Returns the seconds it took; later saves reuse what it made."""
        t0 = now()
        name, policy = self._route(uri)
        await self._import(name, policy)
        await self._ensure_pool(shared=policy.isolation == "process")
        return now() - t0

    async def delete(self, uri: str | os.PathLike[str]) -> None:
        """Remove a published checkpoint and its manifest (no error if absent)."""
        for target in (manifest_uri(os.fspath(uri)), os.fspath(uri)):  # manifest first: never valid alone
            sink = await self._sink(target)
            try:
                await sink.delete()
            finally:
                await sink.aclose()

    # -- step directories (asyncckpt.steps) ---------------------------------------------
    async def save_step(
        self, root: str | os.PathLike[str], step: int, state: Mapping[Any, Any]
    ) -> steps.StepCommit:
        """This rank's ``state`` as part of ``<root>/step-<step>``; returns once committed."""
        return await steps.save_step(self, root, step, state)

    async def load_step(
        self,
        root: str | os.PathLike[str],
        step: int | None = None,
        *,
        into: Mapping[Any, Any] | None = None,
        as_torch: bool = False,
    ) -> steps.StepLoad:
        """This rank's state of a committed step (default: the latest); StepNotCommittedError
        when the step has no commit record."""
        return await steps.load_step(self, root, step, into=into, as_torch=as_torch)

    async def latest_step(self, root: str | os.PathLike[str]) -> int | None:
        """The newest committed step under ``root``, or None."""
        return await steps.latest_step(self, root)

    # -- saving ------------------------------------------------------------------------
    async def _sink(self, uri: str) -> Sink:
        """Every sink runs under the stall watchdog; a stall retires the pool and executor."""
        name, policy = self._route(uri)
        await self._import(name, policy)
        return self._watched(uri, name, policy)

    async def _import_for(self, uri: object) -> None:
        """Import ``uri``'s backend in a thread, once (``load`` and ``iter_load``)."""
        await self._import(*self._route(uri))

    def _new_sink(self, uri: str) -> Sink:
        """:meth:`_sink` without the import (for the synchronous ``iter_load``)."""
        return self._watched(uri, *self._route(uri))

    def _route(self, uri: object) -> tuple[str, WriterPolicy]:
        """The backend serving ``uri`` and whether it runs in a writer process."""
        if not isinstance(uri, (str, os.PathLike)):
            raise ConfigError(f"uri must be a string or path, got {uri!r}")
        cfg = self.config
        name = resolve_backend(os.fspath(uri), cfg.backend)
        return name, resolve_policy(name, isolation=cfg.isolation, mp_start_method=cfg.mp_start_method)

    async def _import(self, name: str, policy: WriterPolicy) -> None:
        """Import the backend's module and client library in a thread the first time (``import
        s3dlio`` takes 1.6 s, aiobotocore's a few tenths): not on the loop. A writer process
        imports its own."""
        if name not in _IMPORTED and policy.isolation != "process":
            await run_blocking(self._ensure_executor(), import_backend, name)
            _IMPORTED.add(name)

    def _watched(self, uri: str, name: str, policy: WriterPolicy) -> Sink:
        def stalled() -> None:
            self._stalled = True

        return watch(self._unwatched_sink(uri, name, policy), self.config.stall_timeout, stalled)

    def _unwatched_sink(self, uri: str, name: str, policy: WriterPolicy) -> Sink:
        cfg = self.config
        options = SinkOptions(
            direct_io=cfg.direct_io,
            fsync=cfg.fsync,
            reserve_space=cfg.reserve_space,
            chunk_size=cfg.chunk_size,
            extra=dict(cfg.backend_options),
        )
        if policy.isolation == "process":
            return ProcessSink(
                os.fspath(uri),
                backend=cfg.backend,
                executor=self._ensure_executor(),
                options=options,
                policy=policy,
                timeout=cfg.writer_timeout,
                child_threads=cfg.num_buffers + 2,
                pool=self._writers,
                nice=cfg.resolved_cpu_nice,
            )
        return self._store(name, options).handle(os.fspath(uri))

    def _store(self, name: str, options: SinkOptions) -> Store:
        """One store per backend for the checkpointer's life: its objects share one client."""
        store = self._stores.get(name)
        if store is not None and store.executor is not self._ensure_executor():
            self._retired.append(store)  # a stall retired its executor: closed at aclose
            store = None
        if store is None:
            store = self._stores[name] = Store(
                name, BACKENDS[name], executor=self._ensure_executor(), options=options
            )
        return store

    async def save(
        self,
        uri: str | os.PathLike[str],
        size: int | None = None,
        *,
        data: CallerData | None = None,
        method: modes.SaveMethod = "streaming",
        progress: ProgressFn | None = None,
        expect_crc32c: Sequence[int] | None = None,
    ) -> SaveResult:
        """Write a checkpoint of ``size`` bytes to ``uri`` and return what it measured.

        Without ``data`` the bytes are synthetic (seeded, reproducible). With ``data`` (bytes-like
        or a sync/async iterable of buffers) real state is streamed; ``size`` defaults to
        ``len(data)`` for bytes-like data. Nothing is visible at ``uri`` unless this returns.
        ``expect_crc32c``: per-chunk CRCs the caller computed beforehand (``save_state``); if the
        pipeline's differ, the data changed while being saved and nothing is published.
        """
        return await self._save_object(uri, size, data, method, progress, expect_crc32c, in_place=False)

    async def _save_object(
        self,
        uri: str | os.PathLike[str],
        size: int | None,
        data: CallerData | None,
        method: modes.SaveMethod,
        progress: ProgressFn | None,
        expect_crc32c: Sequence[int] | None,
        *,
        in_place: bool,
    ) -> SaveResult:
        """``save``; ``in_place``: ``data`` is the whole object in page-aligned memory nobody else
        writes (a host staging area) and ``expect_crc32c`` its chunk CRCs, so it is written
        from where it lies (no pool, no copy, no second checksum) unless a writer process
        needs the bytes in its shared arena."""
        modes.parse("method", method, modes.SaveMethod, fold=False)
        if size is None:
            if data is None or not hasattr(data, "__len__"):
                raise ConfigError("size is required unless data is a bytes-like object")
            size = memoryview(data).nbytes  # type: ignore[arg-type]
        size = validate_size(size)
        sink = await self._sink(os.fspath(uri))
        sink.check()
        try:
            async with self._lock:  # one save at a time per pool
                source = make_source(
                    self.config.generator,
                    size,
                    seed=self.config.seed,
                    threads=self._budget.threads,
                    data=data,
                )
                facts, b = source.describe(), self._budget
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
                    return await self._save(sink, source, size, method, progress, expect_crc32c, placed)
                finally:
                    source.close()
                    await sink.aclose()
        except BaseException as exc:  # wherever it struck, say what became of the save
            note_publication(exc, sink.uri, published=sink.committed)
            raise

    async def _save(
        self,
        sink: Sink,
        source: Source,
        size: int,
        method: str,
        progress: ProgressFn | None,
        expect_crc32c: Sequence[int] | None = None,
        placed: memoryview | None = None,
    ) -> SaveResult:
        executor = self._ensure_executor()
        isolated = isinstance(writer := unwrap(sink), ProcessSink)
        if isolated or expect_crc32c is None:
            placed = None  # a writer process reads chunks from its shared arena only
        if placed is not None:
            method = "preallocated"  # the object lies whole in RAM: memory = its size, not the pool
        pool = await self._ensure_pool(shared=isolated) if method == "streaming" else None
        if pool is not None:
            pool.reset_stats()
            if isinstance(writer, ProcessSink) and isinstance(pool, SharedBufferPool):
                writer.attach_arena(pool.arena)  # chunks travel to the writer as arena offsets
        # data that carries its own checksums (a save_state object: a safetensors header) is
        # published as it is; everything else gets its manifest sealed into a footer
        sealer = (
            sealer_for(sink.uri, size, self.config.chunk_size, source.describe(), sink.backend)
            if expect_crc32c is None
            else None
        )
        async with LoopMonitor(self.config.monitor_interval, sink=sink, on_late=self._loop_late) as monitor:
            t0 = now()
            await sink.open(size if sealer is None else sealer.seal.object_size)
            t_open = now()
            # after open: the opened object may know better than its backend (a file on tmpfs)
            in_flight = self.config.max_in_flight or min(sink.writes_in_flight(), self.config.num_buffers)
            try:
                # synthetic data whose sink can generate it in its library's memory (s3dlio's
                # reserve(), in the writer process by default) skips the pool and its copy
                spec = source.gen_spec() if pool is not None and expect_crc32c is None else None
                if spec is not None and isolated:
                    spec = self._writer_spec(spec)
                if spec is not None and await sink.begin_generation(spec):
                    times = await stream_in_place(
                        sink,
                        total=size,
                        chunk_size=self.config.chunk_size,
                        max_in_flight=in_flight,
                        progress=progress,
                        sealer=sealer,
                    )
                    gen_s = sum(r.fill_s for r in times.records)
                elif pool is not None:
                    lane_before = run_queue(self._lane_tids())
                    times = await stream(
                        source,
                        sink,
                        pool,
                        executor,
                        total=size,
                        max_in_flight=in_flight,
                        progress=progress,
                        sealer=sealer,
                        # leave_loop_core: fills and checksums take turns, so the pipeline's
                        # CPU work stays within the generator's threads and the loop keeps a core
                        cpu_lane=asyncio.Lock() if self._cpu_lane_used else None,
                        cpu_executor=self._cpu_executor(),
                    )
                    gen_s = sum(r.fill_s for r in times.records)
                    self._warn_if_starved(lane_before)
                elif placed is not None and expect_crc32c is not None:
                    times, gen_s = (
                        await write_whole(
                            sink,
                            placed,
                            _known_chunks(size, self.config.chunk_size, expect_crc32c),
                            total=size,
                            end=size,
                            max_in_flight=in_flight,
                            progress=progress,
                        ),
                        0.0,
                    )
                else:
                    times, gen_s = await write_preallocated(
                        source,
                        sink,
                        executor,
                        total=size,
                        chunk_size=self.config.chunk_size,
                        max_in_flight=in_flight,
                        progress=progress,
                        sealer=sealer,
                    )
                if expect_crc32c is not None:  # the bytes written are the bytes the caller summed
                    check_pipeline(times.records, expect_crc32c, sink.uri)
            except BaseException:
                await sink.abort()
                raise
            t_close = now()
            close_detail = await commit(sink)
            t_end = now()
        return self._result(
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
        self,
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
        cfg = self.config
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
            gen_threads_requested=src.get("gen_threads_requested", self._budget.threads),
            fsync=cfg.fsync,
            **self._cpu_priority(
                method,
                in_library="generated_in_library_by" in snk,
                generator=src.get("generator"),
                lane_prepass=lane_prepass,
            ),
        )
        run = run_fields(
            setup,
            self._budget,
            snk,
            monitor,
            recs,
            label_chunks(recs, in_flight),
            method=method,
            size=size,
            open_s=open_s,
            close_s=close_s,
            wall_s=wall_s,
            close_detail=close_detail,
            cpu_stages={"generation": source.cpu_s, "checksum": sum(r.checksum_cpu_s for r in recs)},
        )
        return SaveResult.from_records(recs, gen_s=gen_s, **run)


def _known_chunks(size: int, chunk: int, crcs: Sequence[int]) -> list[ChunkRecord]:
    """Records of an object's chunks whose CRC32Cs were computed before the write."""
    offsets = range(0, size, chunk)
    if len(offsets) != len(crcs):
        raise RuntimeError(f"{len(crcs)} chunk checksums for {len(offsets)} chunks")
    return [
        ChunkRecord(index, offset, min(chunk, size - offset), checksum=crc)
        for index, (offset, crc) in enumerate(zip(offsets, crcs, strict=True))
    ]

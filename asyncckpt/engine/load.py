"""The one load orchestration: ``load``, ``iter_load``, ``probe`` and the state loads all
read through :func:`open_stream`.

A load takes the same lock as a save (they share the pool), opens the object, finds its
manifest (sealed footer, safetensors header, or the sidecar of an old save) or takes the one
its caller already has (a state load read the header first), checks the size against it
before any data is read, then streams verified views. Functions over the runtime and the
storage router, not methods of the checkpointer.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal

from ..blocking import run_blocking
from ..config import ALIGN
from ..errors import ConfigError, IntegrityError, TargetNotFoundError
from ..results.records import LoadResult, RunSetup
from ..sinks.base import Sink
from ..sinks.isolation import SharedBufferPool
from ..sinks.router import StorageRouter
from .header import state_manifest
from .loader import Deliver, LoadState, check_size, identity_note, label_loads, stream_views, verify_mode
from .manifest import Manifest, manifest_uri, read_manifest
from .monitor import LoopMonitor, now
from .runinfo import Span, run_fields, with_setup
from .runtime import Runtime
from .seal import read_sealed
from .verify import BlockVerifier, Verifier, make_verifier

ProgressFn = Callable[[int], None]
#: what :func:`probe` finds at a URI
Found = Literal["absent", "checkpoint", "foreign"]


class LoadStream:
    """``async for view in ckpt.iter_load(uri)``: views valid until the next item.

    The pool is held while iterating; a plain ``async for`` releases it when the data ends,
    fails or the loop is left (the generator is finalized); ``async with`` releases it at once.
    ``result`` is the measurement once the last view was consumed.
    """

    def __init__(self, gen: AsyncGenerator[memoryview, None], state: LoadState) -> None:
        self._gen = gen
        self._state = state

    def __aiter__(self) -> AsyncIterator[memoryview]:
        return self._gen

    async def __aenter__(self) -> LoadStream:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._gen.aclose()

    async def aclose(self) -> None:
        await self._gen.aclose()

    @property
    def offset(self) -> int:
        """The object offset of the view last handed out."""
        return self._state.offset

    @property
    def result(self) -> LoadResult:
        if self._state.result is None:
            raise RuntimeError("the load has not finished: consume every view first")
        return self._state.result

    @property
    def lock_wait_s(self) -> float:
        """How long the load waited for the checkpointer's lock (not setup: another call ran)."""
        return self._state.lock_wait_s


def _writable(into: object) -> memoryview:
    try:
        view = memoryview(into)  # type: ignore[arg-type]
    except TypeError:
        raise ConfigError(f"into= must be a writable buffer, got {type(into).__name__}") from None
    if view.readonly:
        raise ConfigError(f"into= must be writable, got a read-only {type(into).__name__}")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def _copy(dst: memoryview, src: memoryview) -> None:
    dst[:] = src


@dataclass(frozen=True)
class Known:
    """What a caller already knows of the object it loads (a state load read its header):
    the manifest to verify against (``None``: nothing to verify) and the object's size."""

    manifest: Manifest
    size: int
    verify: bool
    #: (offset, length) ranges to read, in order, starting on manifest-chunk boundaries and
    #: ending on one (or at the object's end); None: the whole object
    spans: tuple[tuple[int, int], ...] | None = None


async def probe(storage: StorageRouter, uri: str | os.PathLike[str]) -> Found:
    """What is at ``uri``: nothing, an asyncckpt checkpoint (sealed, or with the sidecar
    manifest of an older save), or something else. Reads only the object's tail; a tool
    that writes where users keep data asks this before it overwrites anything."""
    sink = await storage.handle(os.fspath(uri))
    sink.check()
    try:
        try:
            size = await sink.size()
        except TargetNotFoundError:
            return "absent"
        try:
            if await read_sealed(sink, size, sink.uri) is not None:
                return "checkpoint"
            if await state_manifest(sink, size, sink.uri) is not None:
                return "checkpoint"
        except IntegrityError:
            return "checkpoint"  # our footer or header, damaged: still ours to replace
        sidecar = await storage.handle(manifest_uri(sink.uri))
        try:
            await sidecar.size()
            return "checkpoint"
        except TargetNotFoundError:
            return "foreign"
        finally:
            await sidecar.aclose()
    finally:
        await sink.aclose()


async def load(
    rt: Runtime,
    storage: StorageRouter,
    uri: str | os.PathLike[str],
    *,
    verify: bool | str = True,
    num_readers: int | None = None,
    read_chunk_size: int | None = None,
    into: Any = None,
    defeat_cache: bool = True,
    progress: ProgressFn | None = None,
) -> LoadResult:
    """Read a checkpoint back (verified against its manifest); see ``AsyncCheckpointer.load``."""
    target = _writable(into) if into is not None else None
    await storage.prepare(uri)
    executor = rt.executor()
    offset = 0

    async def take(at: int, view: memoryview) -> None:
        nonlocal offset
        if target is not None:
            await run_blocking(executor, _copy, target[offset : offset + len(view)], view)
        offset += len(view)

    return await read(
        rt, storage, uri, take, verify=verify, num_readers=num_readers, read_chunk_size=read_chunk_size,
        defeat_cache=defeat_cache, progress=progress, into_size=len(target) if target is not None else None,
    )  # fmt: skip


async def read(
    rt: Runtime,
    storage: StorageRouter,
    uri: str | os.PathLike[str],
    take: Callable[[int, memoryview], Awaitable[None]],
    *,
    verify: bool | str = True,
    num_readers: int | None = None,
    read_chunk_size: int | None = None,
    defeat_cache: bool = True,
    progress: ProgressFn | None = None,
    known: Known | None = None,
    into_size: int | None = None,
    deliver: Deliver | None = None,
) -> LoadResult:
    """Stream ``uri`` through ``take(offset, view)`` (each view valid only during the call)
    and return the measurement: the body of ``load`` and of the state loads. ``deliver``:
    a blocking ``(offset, view)`` copy run in the thread hop that verified the view, before
    ``take`` (one hop a view instead of two)."""
    started = now()
    stream = open_stream(
        rt, storage, uri, verify, num_readers, read_chunk_size, defeat_cache, progress, known, into_size,
        deliver,
    )  # fmt: skip
    async with stream:
        async for view in stream:
            await take(stream.offset, view)
    return with_setup(stream.result, now() - started - stream.lock_wait_s)


def read_args(
    rt: Runtime, sink: Sink, num_readers: int | None, read_chunk_size: int | None
) -> tuple[int, int]:
    """Validated (readers, read chunk size), before any I/O: one rule for every load."""
    cfg = rt.config
    chunk = cfg.chunk_size if read_chunk_size is None else read_chunk_size
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < ALIGN or chunk % ALIGN:
        raise ConfigError(f"read_chunk_size must be a positive multiple of {ALIGN}, got {chunk!r}")
    if chunk > cfg.chunk_size:
        raise ConfigError(
            f"read_chunk_size={chunk} exceeds the pool's chunk_size={cfg.chunk_size}: "
            "reads land in pooled buffers"
        )
    readers = num_readers
    if readers is None:
        readers = cfg.max_in_flight or min(sink.default_in_flight, cfg.num_buffers)
    if isinstance(readers, bool) or not isinstance(readers, int) or not 1 <= readers <= cfg.num_buffers:
        raise ConfigError(
            f"num_readers must be an integer in 1..num_buffers={cfg.num_buffers} (each read holds a "
            f"buffer), got {num_readers!r}"
        )
    return readers, chunk


def open_stream(
    rt: Runtime,
    storage: StorageRouter,
    uri: str | os.PathLike[str],
    verify: object,
    num_readers: int | None,
    read_chunk_size: int | None,
    defeat_cache: bool,
    progress: ProgressFn | None,
    known: Known | None = None,
    into_size: int | None = None,
    deliver: Deliver | None = None,
) -> LoadStream:
    """Check the arguments (before any I/O) and return the stream of verified views."""
    mode = verify_mode(verify) if known is None else ("checksum" if known.verify else "none")
    sink = storage.handle_nowait(os.fspath(uri))
    sink.check()
    readers, chunk = read_args(rt, sink, num_readers, read_chunk_size)
    state = LoadState(verify_mode=mode)
    gen = _iterate(
        rt, storage, sink, state, chunk, readers, defeat_cache, progress, known, into_size, deliver
    )
    return LoadStream(gen, state)


async def _find_manifest(
    storage: StorageRouter, sink: Sink, state: LoadState, object_size: int, closing: list[Sink]
) -> Manifest:
    """The object's manifest: sealed footer, safetensors header, or an old save's sidecar."""
    uri = sink.uri
    manifest = await read_sealed(sink, object_size, uri)
    if manifest is None:  # a save_state object: its header holds the checksums
        manifest = await state_manifest(sink, object_size, uri)
    if manifest is None:  # a save of asyncckpt < 0.2: the manifest is a sidecar
        msink = await storage.handle(manifest_uri(uri))
        closing.append(msink)
        manifest = await read_manifest(msink, uri)
        state.identity_note = identity_note(manifest, sink.describe(), uri)
        check_size(manifest, object_size, uri, state.identity_note)
    return manifest


async def _iterate(
    rt: Runtime,
    storage: StorageRouter,
    sink: Sink,
    state: LoadState,
    read_chunk: int,
    readers: int,
    defeat_cache: bool,
    progress: ProgressFn | None,
    known: Known | None,
    into_size: int | None,
    deliver: Deliver | None = None,
) -> AsyncGenerator[memoryview, None]:
    uri = state.uri = sink.uri
    await storage.prepare(uri)  # the handle was made synchronously: a library it defers
    state.backend = sink.backend
    closing: list[Sink] = []
    verifier: Verifier | None = None
    try:
        t_lock = now()
        async with rt.lock:
            state.lock_wait_s = now() - t_lock
            # capability, not type: a writer process reads into the shared arena, not pipe messages
            isolated = sink.uses_shared_arena
            pool = await rt.pool(shared=isolated)
            if isolated and isinstance(pool, SharedBufferPool):
                sink.attach_arena(pool.arena)
            pool.reset_stats()
            executor = rt.executor()
            async with LoopMonitor(rt.config.monitor_interval, sink=sink) as monitor:
                t0 = now()
                # opened first: a file load then reads one version even if a save replaces it
                await sink.open_read(defeat_cache=defeat_cache)
                object_size = await sink.size()
                if known is None:
                    manifest = await _find_manifest(storage, sink, state, object_size, closing)
                else:
                    if object_size != known.size:
                        raise IntegrityError(
                            f"{uri!r} changed during the load: {object_size} bytes now, {known.size} when "
                            "its header was read"
                        )
                    manifest = known.manifest
                state.manifest, state.size = manifest, manifest.size
                if into_size is not None and into_size < state.size:
                    raise ConfigError(f"into= holds {into_size} bytes; {uri!r} has {state.size}")
                if known is not None and known.spans is not None:  # a partial read
                    state.spans, state.size = known.spans, sum(n for _, n in known.spans)
                    verifier = BlockVerifier(manifest) if known.verify else None
                else:
                    verifier = make_verifier(
                        state.verify_mode, manifest, threads=rt.budget.threads, where=uri
                    )
                state.open_s = now() - t0
                views = stream_views(
                    uri=uri,
                    sink=sink,
                    pool=pool,
                    executor=executor,
                    manifest=manifest,
                    verifier=verifier,
                    state=state,
                    read_chunk=read_chunk,
                    num_readers=readers,
                    threads=rt.budget.threads,
                    progress=progress,
                    deliver=deliver,
                )
                # aclosing: when this generator is closed early (caller left the loop or was
                # cancelled) the inner one closes *now*, reclaiming its buffers, rather than
                # whenever the event loop gets round to finalizing it
                async with contextlib.aclosing(views):
                    async for view in views:
                        yield view
                state.sink_facts = sink.describe()
                t_close = now()
                await sink.aclose()
                t_end = now()
            state.regen_s = float(getattr(verifier, "regen_s", 0.0))
            state.result = _load_result(rt, state, readers, monitor, t0, t_close, t_end)
    finally:
        if verifier is not None:
            verifier.close()
        await sink.aclose()
        for extra in closing:
            await extra.aclose()


def _load_result(
    rt: Runtime, state: LoadState, readers: int, monitor: LoopMonitor, t0: float, t_close: float, t_end: float
) -> LoadResult:
    recs, m, facts = state.records, state.manifest, dict(state.sink_facts)
    assert m is not None
    threads = rt.budget.threads if state.verify_mode == "regenerate" else None
    facts.update(
        verify=state.verify_mode,
        num_readers=readers,
        manifest_chunk_size=m.chunk_size,
        manifest_generator=m.generator,
        manifest_integrity=m.integrity,
        regenerate_s=state.regen_s,
    )
    if state.identity_note:
        facts["identity_note"] = state.identity_note
    setup = RunSetup(
        backend=state.backend,
        uri=state.uri,
        chunk_size=recs[0].nbytes if len(recs) > 1 else max((r.nbytes for r in recs), default=0),
        num_buffers=rt.config.num_buffers,
        pool_bytes=rt.config.pool_bytes,
        max_in_flight=readers,
        generator=m.generator,
        seed=m.seed,
        gen_threads=threads,
        gen_threads_requested=threads,
        fsync=False,
    )
    span = Span("streaming", state.size, state.open_s, t_end - t_close, t_end - t0)
    stages = {"verify": sum(r.verify_cpu_s for r in recs)} if state.verify_mode != "none" else {}
    run = run_fields(setup, rt.budget, facts, monitor, recs, label_loads(recs, readers), span, stages)
    return LoadResult.from_records(recs, **run)

"""``save_state`` / ``load_state``: nested state dicts as safetensors objects, via the pipeline.

Save: the state is flattened (``flatten.py``), its arrays exposed as byte views
(``arrays.py``), a CRC32C pre-pass fills the header's ``__metadata__`` (``chunks.py``), and
then header + tensor bytes stream in file order through the ordinary caller-data ``save``:
the pool, O_DIRECT/multipart and per-chunk metrics are the same as for any save, and
the object is written front to back (append-only stores work). The pipeline's own chunk
CRCs must equal the pre-pass ones before the object is published.

Load: the header is read and validated first, then the object streams through the
ordinary ordered reader, checked against a manifest rebuilt from the header, and each
view is scattered into the destination arrays (fresh, or the caller's with ``into=``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Mapping, MutableMapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Literal, overload

from .. import modes
from .._blocking import Offload, run_blocking
from ..config import ALIGN
from ..errors import ChecksumMismatchError, ConfigError, IntegrityError
from ..isolation import SharedBufferPool
from ..isolation.process_sink import ProcessSink
from ..load_api import LoadsMixin, ProgressFn
from ..loader import LoadState, stream_views
from ..manifest import Manifest
from ..monitor import LoopMonitor, now
from ..results import LoadResult, SaveResult
from ..sources import CallerData
from ..verify import ChecksumVerifier
from . import chunks, dtypes
from .arrays import Destination, SaveTensor, allocate, bind, prepare
from .flatten import Leaf, flatten, path_text, unflatten
from .header import asyncckpt_metadata, read_prefix
from .results import StagedSave, StateLoadResult, StateSaveResult
from .safetensors_format import (
    FORMAT_VALUE,
    K_CHUNK,
    K_CRCS,
    K_FORMAT,
    K_TREE,
    Header,
    TensorEntry,
    build_header,
    header_crc_ok,
)
from .staging import StagingArea, copy_bytes, copy_shared, share_copies

log = logging.getLogger("asyncckpt")
_INLINE_COPY = 1 << 20
_INLINE_PIECES = 256  # more small tensors than this in one chunk are copied in a thread too


@dataclass
class _Plan:
    """The object a save will write: tensor order, offsets and a header of the final size."""

    uri: str
    tensors: list[SaveTensor]
    entries: list[TensorEntry]
    metadata: dict[str, str]
    prefix: bytearray
    size: int

    @property
    def data_start(self) -> int:
        return len(self.prefix)


def _user_metadata(metadata: Mapping[str, str] | None) -> dict[str, str]:
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise ConfigError(f"metadata must be a mapping of str to str, got {type(metadata).__name__}")
    for key, value in metadata.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise ConfigError(f"metadata must map str to str, got {key!r}: {value!r}")
        if key.startswith("asyncckpt."):
            raise ConfigError(f"metadata key {key!r}: the 'asyncckpt.' prefix is reserved")
    return dict(metadata)


# reserved beyond a state's laid-out size: its header names the object, so a save's may be a
# little longer than the reservation's
STAGING_SLACK = 64 << 10


def plan(uri: str, state: object, chunk: int, metadata: Mapping[str, str] | None) -> _Plan:
    """Validate and lay out ``state`` (no array data is read); ConfigError before any I/O."""
    meta = _user_metadata(metadata)
    tree, leaves = flatten(state)
    tensors = [prepare(leaf) for leaf in leaves]
    # descending element size, as the safetensors writer does: every tensor naturally aligned
    tensors.sort(key=lambda t: -t.dtype.itemsize)
    entries, offset = [], 0
    for t in tensors:
        entries.append(TensorEntry(t.leaf.name, t.dtype, t.shape, offset, offset + t.nbytes))
        offset += t.nbytes
    meta.update(
        {K_FORMAT: FORMAT_VALUE, K_TREE: json.dumps(tree, separators=(",", ":")), K_CHUNK: str(chunk)}
    )
    count, prefix = 0, bytearray()
    for _ in range(8):  # the CRC count depends on where the data starts, which depends on it
        prefix = build_header(entries, {**meta, K_CRCS: chunks.encode([0] * count)})
        want = chunks.data_chunk_count(len(prefix), len(prefix) + offset, chunk)
        if want == count:
            break
        count = want
    else:  # pragma: no cover - the header grows monotonically; two rounds suffice in practice
        raise RuntimeError("state header size did not converge")
    return _Plan(uri, tensors, entries, meta, prefix, len(prefix) + offset)


def finish_header(p: _Plan, data: Sequence[memoryview], chunk: int) -> tuple[bytearray, list[int], float]:
    """(final header, the pipeline's expected chunk CRCs, pre-pass seconds); blocking."""
    t0 = now()
    data_crcs = chunks.data_chunk_crcs(data, p.data_start, chunk)
    prepass = now() - t0
    prefix = build_header(p.entries, {**p.metadata, K_CRCS: chunks.encode(data_crcs)})
    if len(prefix) != p.data_start:
        raise RuntimeError(f"state header changed size: {len(prefix)} != {p.data_start}")
    return prefix, list(chunks.object_chunk_crcs(prefix, data_crcs, p.size, chunk)), prepass


def _views_and_header(p: _Plan, chunk: int) -> tuple[list[memoryview], tuple[bytearray, list[int], float]]:
    """Every tensor's bytes (a contiguous copy of the few that are not) and the final header;
    blocking (a view costs about 10 us a tensor: 0.1 s for 10 000)."""
    for t in p.tensors:
        if not t.contiguous:
            t.make_contiguous()
    views = [t.byte_view() for t in p.tensors]
    return views, finish_header(p, views, chunk)


def _copy_pieces(pieces: list[tuple[memoryview, memoryview]]) -> None:
    for dst, src in pieces:
        copy_bytes(dst, src)


class StateMixin(LoadsMixin):
    """State-dict saves and loads; the host class provides ``save`` and the load machinery."""

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
        raise NotImplementedError

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
        raise NotImplementedError

    def _cpu_executor(self) -> Executor:
        raise NotImplementedError

    @property
    def _staging_area(self) -> StagingArea:
        area = self.__dict__.get("_state_staging")
        if area is None:
            area = self.__dict__["_state_staging"] = StagingArea()
        assert isinstance(area, StagingArea)
        return area

    async def _close_state(self) -> None:
        """Wait for a background staged save, then free the staging area (``aclose``)."""
        area = self.__dict__.get("_state_staging")
        if isinstance(area, StagingArea):
            if area.pending is not None:
                await asyncio.wait([area.pending])
            await run_blocking(Offload(1), area.close)  # unmapping: off the loop thread

    # -- saving ------------------------------------------------------------------------
    @overload
    async def save_state(
        self,
        uri: str | os.PathLike[str],
        state: Mapping[Any, Any],
        *,
        staging: Literal["none"] = "none",
        metadata: Mapping[str, str] | None = None,
        progress: ProgressFn | None = None,
    ) -> StateSaveResult: ...

    @overload
    async def save_state(
        self,
        uri: str | os.PathLike[str],
        state: Mapping[Any, Any],
        *,
        staging: Literal["host"],
        metadata: Mapping[str, str] | None = None,
        progress: ProgressFn | None = None,
    ) -> StagedSave: ...

    @overload
    async def save_state(
        self,
        uri: str | os.PathLike[str],
        state: Mapping[Any, Any],
        *,
        staging: modes.StagingMode | str,
        metadata: Mapping[str, str] | None = None,
        progress: ProgressFn | None = None,
    ) -> StateSaveResult | StagedSave: ...

    async def save_state(
        self,
        uri: str | os.PathLike[str],
        state: Mapping[Any, Any],
        *,
        staging: modes.StagingMode | str = "none",
        metadata: Mapping[str, str] | None = None,
        progress: ProgressFn | None = None,
    ) -> StateSaveResult | StagedSave:
        """Save a nested state (arrays, tensors, JSON scalars) as one safetensors object.

        ``staging="none"``: the arrays are streamed from their own memory (memory: the pool);
        they must not change until this returns (a change is detected and nothing is
        published). ``staging="host"``: they are copied into a reusable staging area and a
        :class:`StagedSave` is returned at once; ``await`` it for the durable result.
        """
        staging = modes.parse("staging", staging, modes.StagingMode, fold=False)
        target = _uri(uri)
        t0 = now()  # the caller is blocked from here (the target's check included)
        await self._check_target(target)
        if staging == "host":
            return await self._save_staged(target, state, metadata, progress, t0)
        executor = self._ensure_executor()
        # in a thread: a state of 10 000 tensors takes 0.2 s to lay out, the loop's time else
        p = await run_blocking(executor, plan, target, state, self.config.chunk_size, metadata)
        copied = tuple(t.leaf.name for t in p.tensors if not t.contiguous)
        views, (prefix, expected, prepass) = await run_blocking(
            executor, _views_and_header, p, self.config.chunk_size
        )
        saved = await self.save(
            target, p.size, data=[memoryview(prefix), *views], progress=progress, expect_crc32c=expected
        )
        return self._state_result(p, "none", now() - t0, 0.0, 0.0, prepass, copied, saved)

    async def reserve_staging(
        self, state: Mapping[Any, Any], *, metadata: Mapping[str, str] | None = None
    ) -> int:
        """Make the ``staging="host"`` area big enough for ``state``, its pages faulted in, in a
        worker thread; the area's size in bytes.

        The first staged save otherwise allocates and faults the area while the caller waits
        (a 1 GiB state: blocked 0.2-1.3 s, later saves about 0.1 s). Call it before training
        starts; :class:`~asyncckpt.manager.CheckpointManager` does, in the background. A save
        still writing from the area is waited for first.
        """
        area, chunk = self._staging_area, self.config.chunk_size

        def lay_out_and_fault() -> int:
            p = plan("<staging area>", state, chunk, metadata)
            return area.reserve(p.size + STAGING_SLACK)

        async with area.claimed():
            return await run_blocking(self._ensure_executor(), lay_out_and_fault)

    async def _check_target(self, uri: str) -> None:
        sink = await self._sink(uri)
        try:
            sink.check()
        finally:
            await sink.aclose()

    async def _save_staged(
        self,
        uri: str,
        state: object,
        metadata: Mapping[str, str] | None,
        progress: ProgressFn | None,
        t0: float,
    ) -> StagedSave:
        area = self._staging_area
        t_wait = now()
        async with area.claimed():  # one copy into the area at a time; then busy until written
            return await self._stage_and_write(area, uri, state, metadata, progress, t0, now() - t_wait)

    async def _stage_and_write(
        self,
        area: StagingArea,
        uri: str,
        state: object,
        metadata: Mapping[str, str] | None,
        progress: ProgressFn | None,
        t0: float,
        waited: float,
    ) -> StagedSave:
        chunk = self.config.chunk_size
        threads = self._budget.blocked_threads  # the caller waits for this copy: every core of its share

        def lay_out() -> tuple[_Plan, memoryview, list[list[tuple[Any, ...]]], float]:
            """Plan, area and the copies shared out, in one thread hop (each costs 0.2-1.5 ms
            here); a small state is copied here too."""
            p = plan(uri, state, chunk, metadata)
            view = area.ensure(p.size)
            started = now()
            bins = share_copies(p.tensors, [p.data_start + e.start for e in p.entries], view, threads)
            return p, view, bins, now() - started

        p, view, bins, inline_s = await run_blocking(self._ensure_executor(), lay_out)
        t_copy = now()
        await copy_shared(bins, self._ensure_executor())
        copied = tuple(t.leaf.name for t in p.tensors if not t.contiguous)
        blocked = now() - t0
        copy_s = inline_s + now() - t_copy

        async def write() -> StateSaveResult:
            data = [view[p.data_start : p.size]]
            # the checksum pass is CPU-only background work: on the lowered CPU lane, so the
            # training's own threads keep their cores (asyncckpt.priority)
            prefix, expected, prepass = await run_blocking(
                self._cpu_executor(), finish_header, p, data, chunk
            )
            view[: p.data_start] = prefix
            # written from the area itself: no pool copy, and the pre-pass CRCs are the chunks'
            saved = await self._save_object(uri, p.size, view, "streaming", progress, expected, in_place=True)
            return self._state_result(p, "host", blocked, waited, copy_s, prepass, copied, saved)

        task = asyncio.create_task(write(), name=f"asyncckpt-staged-save {uri}")
        task.add_done_callback(_log_failure)
        area.pending = task
        return StagedSave(task, uri=uri, blocked_s=blocked)

    def _state_result(
        self,
        p: _Plan,
        staging: modes.StagingMode,
        blocked: float,
        waited: float,
        copy_s: float,
        prepass: float,
        copied: tuple[str, ...],
        saved: SaveResult,
    ) -> StateSaveResult:
        return StateSaveResult(
            uri=p.uri,
            staging=staging,
            blocked_s=blocked,
            waited_s=waited,
            copy_s=copy_s,
            prepass_s=prepass,
            tensors=len(p.tensors),
            tensor_bytes=p.size - p.data_start,
            header_bytes=p.data_start,
            copied_contiguous=copied,
            save=saved,
        )

    # -- loading -----------------------------------------------------------------------
    async def load_state(
        self,
        uri: str | os.PathLike[str],
        into: Mapping[Any, Any] | None = None,
        *,
        as_torch: bool = False,
        verify: bool = True,
        num_readers: int | None = None,
        read_chunk_size: int | None = None,
        defeat_cache: bool = True,
        progress: ProgressFn | None = None,
    ) -> StateLoadResult:
        """Load a safetensors object (asyncckpt's or any other writer's) into a nested state.

        Arrays come back as NumPy arrays, or torch tensors with ``as_torch=True`` (and for
        bfloat16/float8 when ``ml_dtypes`` is not installed). ``into``: a state of the same
        structure whose arrays are filled in place (shapes and dtypes must match).
        """
        if verify not in (True, False):
            raise ConfigError(f"verify must be True or False, got {verify!r}")
        if into is not None and not isinstance(into, Mapping):
            raise ConfigError(f"into must be a state mapping, got {type(into).__name__}")
        target = _uri(uri)
        readers, read_chunk = await self._read_args(target, num_readers, read_chunk_size)
        prefix, header = await self._read_header(target)
        meta = header.metadata
        ours = K_FORMAT in meta
        tree, chunk, manifest, dests = await run_blocking(
            self._ensure_executor(),
            _prepare_load,
            target,
            prefix,
            header,
            into,
            as_torch,
            verify,
            self.config.chunk_size,
        )
        load = await self._stream_state(
            target, header, prefix, dests, manifest, readers, read_chunk, defeat_cache, progress
        )
        finishing = [d for d in dests if d.finish is not None]
        if finishing:
            await run_blocking(self._ensure_executor(), _complete_all, finishing)
        arrays = {d.entry.name: d.result for d in dests}
        if ours:
            state = await run_blocking(self._ensure_executor(), _rebuild, tree, arrays, into)
        else:
            state = arrays
        if manifest is not None:
            how = f"CRC32C of the header and of {manifest.chunks} chunk(s) of {chunk} bytes"
        elif ours:
            how = "none: verify=False"
        else:
            how = "none: the header has no asyncckpt checksums (written by another safetensors writer)"
        return StateLoadResult(
            state=state,
            verified=manifest is not None,
            verification=how,
            tensors=len(dests),
            tensor_bytes=header.data_size,
            in_place=into is not None,
            load=load,
            metadata={k: v for k, v in meta.items() if not k.startswith("asyncckpt.")},
        )

    async def _read_args(
        self, uri: str, num_readers: int | None, read_chunk_size: int | None
    ) -> tuple[int, int]:
        """Validated (readers, read chunk size), before any I/O (the same rules as ``load``)."""
        cfg = self.config
        chunk = cfg.chunk_size if read_chunk_size is None else read_chunk_size
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < ALIGN or chunk % ALIGN:
            raise ConfigError(f"read_chunk_size must be a positive multiple of {ALIGN}, got {chunk!r}")
        if chunk > cfg.chunk_size:
            raise ConfigError(f"read_chunk_size={chunk} exceeds the pool's chunk_size={cfg.chunk_size}")
        readers = num_readers
        if readers is None:
            sink = await self._sink(uri)  # no I/O: only its default concurrency is wanted
            in_flight = sink.default_in_flight
            await sink.aclose()
            readers = cfg.max_in_flight or min(in_flight, cfg.num_buffers)
        if isinstance(readers, bool) or not isinstance(readers, int) or not 1 <= readers <= cfg.num_buffers:
            raise ConfigError(f"num_readers must be an integer in 1..{cfg.num_buffers}, got {num_readers!r}")
        return readers, chunk

    async def _read_header(self, uri: str) -> tuple[bytearray, Header]:
        sink = await self._sink(uri)
        try:
            sink.check()
            return await read_prefix(sink, await sink.size(), uri)
        finally:
            await sink.aclose()

    async def _stream_state(
        self,
        uri: str,
        header: Header,
        prefix: bytearray,
        dests: list[Destination],
        manifest: Manifest | None,
        readers: int,
        read_chunk: int,
        defeat_cache: bool,
        progress: ProgressFn | None,
    ) -> LoadResult:
        cfg = self.config
        sink = await self._sink(uri)
        ls = LoadState(uri=uri, backend=sink.backend, verify_mode="checksum" if manifest else "none")
        ls.manifest = manifest or chunks.manifest_of(uri, header.size, cfg.chunk_size, ())
        verifier = ChecksumVerifier(manifest) if manifest is not None else None
        scatter = _Scatter(header, prefix, dests, uri)
        try:
            async with self._lock:
                pool = await self._ensure_pool(shared=isinstance(sink, ProcessSink))
                if isinstance(sink, ProcessSink) and isinstance(pool, SharedBufferPool):
                    sink.attach_arena(pool.arena)
                pool.reset_stats()
                executor = self._ensure_executor()
                async with LoopMonitor(cfg.monitor_interval, sink=sink) as monitor:
                    t0 = now()
                    ls.size = await sink.size()
                    if ls.size != header.size:
                        raise IntegrityError(
                            f"{uri!r} changed during the load: {ls.size} bytes now, {header.size} when its "
                            "header was read"
                        )
                    await sink.open_read(defeat_cache=defeat_cache)
                    ls.open_s = now() - t0
                    views = stream_views(
                        uri=uri,
                        sink=sink,
                        pool=pool,
                        executor=executor,
                        manifest=ls.manifest,
                        verifier=verifier,
                        state=ls,
                        read_chunk=read_chunk,
                        num_readers=readers,
                        threads=self._budget.threads,
                        progress=progress,
                    )
                    async with contextlib.aclosing(views):  # buffers reclaimed now on any exit
                        async for view in views:
                            await scatter.take(view, executor)
                    ls.sink_facts = sink.describe()
                    t_close = now()
                    await sink.aclose()
                    t_end = now()
                return self._load_result(ls, readers, monitor, t0, t_close, t_end)
        finally:
            await sink.aclose()


def _rebuild(tree: Any, arrays: Mapping[str, Any], into: Mapping[Any, Any] | None) -> Any:
    """The loaded state; with ``into=``, its non-array values written back into ``into`` too
    (a resumed loop reads ``state["step"]`` from the object it passed); blocking."""
    state = unflatten(tree, arrays)
    if into is not None:
        restore_values(into, state)
    return state


def restore_values(dst: object, src: object) -> None:
    """Make the mutable containers of ``dst`` (mappings, lists; at any depth) hold ``src``'s
    values where they differ: scalars, and immutable containers such as tuples, which are
    replaced whole (their arrays are ``dst``'s own, bound by the load). Keys or items
    ``dst`` lacks are not added; an immutable ``dst`` is left alone (the result has them)."""
    if isinstance(dst, MutableMapping) and isinstance(src, Mapping):
        pairs: list[tuple[Any, Any]] = [(k, src[k]) for k in dst if k in src]
    elif isinstance(dst, list) and isinstance(src, list):
        pairs = list(enumerate(src[: len(dst)]))
    else:
        return
    for key, value in pairs:
        mine = dst[key]
        if isinstance(mine, (MutableMapping, list)) and isinstance(value, (Mapping, list)):
            restore_values(mine, value)
        elif mine is not value:
            dst[key] = value


def _complete_all(dests: list[Destination]) -> None:
    for d in dests:
        d.complete()


def _log_failure(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("background state save failed: %s", task.exception())


def _uri(uri: object) -> str:
    if not isinstance(uri, (str, os.PathLike)):
        raise ConfigError(f"uri must be a string or path, got {uri!r}")
    return os.fspath(uri)


def _prepare_load(
    uri: str,
    prefix: bytearray,
    header: Header,
    into: Mapping[Any, Any] | None,
    as_torch: bool,
    verify: bool,
    chunk: int,
) -> tuple[Any, int, Manifest | None, list[Destination]]:
    """(tree, chunk size, manifest to verify against, destinations); blocking: a header of
    10 000 tensors takes 0.1 s to check and bind."""
    tree: Any = None
    manifest: Manifest | None = None
    if K_FORMAT in header.metadata:
        tree, chunk, crcs = asyncckpt_metadata(header.metadata, uri)
        if verify:
            if not header_crc_ok(bytes(prefix)):
                raise ChecksumMismatchError(
                    f"checkpoint {uri!r} is corrupt: its header's CRC32C does not match", chunk=0, offset=0
                )
            expected = chunks.object_chunk_crcs(prefix, crcs, header.size, chunk)
            manifest = chunks.manifest_of(uri, header.size, chunk, expected)
    return tree, chunk, manifest, _destinations(header, into, as_torch)


def _destinations(header: Header, into: Mapping[Any, Any] | None, as_torch: bool) -> list[Destination]:
    if into is None:
        ml = dtypes.optional_module("ml_dtypes")
        return [allocate(e, as_torch=as_torch, ml_dtypes=ml) for e in header.tensors]
    _, leaves = flatten(into)
    by_name: dict[str, Leaf] = {leaf.name: leaf for leaf in leaves}
    names = {e.name for e in header.tensors}
    extra = [path_text(leaf.path) for leaf in leaves if leaf.name not in names]
    if extra:
        raise ConfigError(f"into: {', '.join(extra[:5])} not in the checkpoint")
    missing = [e.name for e in header.tensors if e.name not in by_name]
    if missing:
        raise ConfigError(f"into lacks the checkpoint's tensor(s) {missing[:5]}")
    return [bind(e, by_name[e.name].value, path_text(by_name[e.name].path)) for e in header.tensors]


class _Scatter:
    """Copies the object's bytes, arriving in order, into the tensors' destinations."""

    def __init__(self, header: Header, prefix: bytearray, dests: list[Destination], uri: str) -> None:
        self.header, self.prefix, self.uri = header, prefix, uri
        self.dests = [d for d in dests if d.entry.nbytes]  # in offset order, as header.tensors
        self.pos = 0  # object offset of the next byte
        self.index = 0

    async def take(self, view: memoryview, executor: Any) -> None:
        start, end = self.pos, self.pos + len(view)
        data_start = self.header.data_start
        if start < data_start:  # the header again: it must be the one that was parsed
            stop = min(end, data_start)
            if view[: stop - start] != memoryview(self.prefix)[start:stop]:
                raise IntegrityError(f"{self.uri!r} changed during the load: its header differs")
        pieces: list[tuple[memoryview, memoryview]] = []
        while self.index < len(self.dests):
            d = self.dests[self.index]
            t_start, t_end = data_start + d.entry.start, data_start + d.entry.end
            if t_start >= end:
                break
            lo, hi = max(start, t_start), min(end, t_end)
            if lo < hi:
                pieces.append((d.view[lo - t_start : hi - t_start], view[lo - start : hi - start]))
            if t_end > end:
                break
            self.index += 1
        self.pos = end
        if len(pieces) < _INLINE_PIECES and sum(len(dst) for dst, _ in pieces) < _INLINE_COPY:
            for dst, src in pieces:
                dst[:] = src
        else:
            await run_blocking(executor, _copy_pieces, pieces)

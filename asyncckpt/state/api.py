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
import bisect
import functools
import logging
import os
from collections.abc import Awaitable, Callable, Collection, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

from .. import modes
from ..blocking import Offload, run_blocking
from ..engine import chunks, dtypes
from ..engine.header import asyncckpt_metadata, header_manifest, is_ours, our_metadata, read_prefix, with_crcs
from ..engine.load import Known, ProgressFn, read, read_args
from ..engine.manifest import Manifest
from ..engine.monitor import now
from ..engine.runtime import Runtime
from ..engine.safetensors_format import ALIGN, Header, TensorEntry, build_header, tensors_json
from ..engine.save import save_object
from ..errors import ConfigError, IntegrityError
from ..results.records import SaveResult
from ..sinks.isolation import SharedBufferPool
from ..sinks.router import StorageRouter
from . import select
from .arrays import Destination, SaveTensor, allocate, bind, prepare
from .flatten import Key, Leaf, flatten, match_leaves, path_text, tensor_paths, unflatten
from .results import StagedSave, StateLoadResult, StateSaveResult
from .shard import (
    DCP_SHARDING_INFO,
    K_SHARDS,
    Box,
    Shard,
    dcp_sharding_info,
    decode_boxes,
    dest_box,
    encode_boxes,
    is_dtensor,
)
from .staging import StagingArea, copy_bytes, copy_shared, share_copies

log = logging.getLogger("asyncckpt")
_INLINE_COPY = 1 << 20
#: data of at least this many checksum blocks starts on a block (header_align)
ALIGNED_DATA = 64
_INLINE_PIECES = 256  # more small tensors than this in one chunk are copied in a thread too


#: awaited by a save once its state is known good, before its first I/O
Ready = Callable[[], Awaitable[None]]


@dataclass
class _Plan:
    """The object a save will write: tensor order, offsets and a header of the final size."""

    uri: str
    tensors: list[SaveTensor]
    entries: list[TensorEntry]
    metadata: dict[str, str]
    prefix: bytearray
    size: int
    align: int  # where the data starts a multiple of (header_align): finish_header keeps it
    members: str  # the header's tensors as JSON (tensors_json), made once per save

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
    block = chunks.block_size(chunk)
    # tensors of whole checksum blocks first: each then starts on a block (header_align), so a
    # partial or resharded read of one reads no extra block; then the rest by descending
    # element size, as the safetensors writer does. Every tensor stays naturally aligned.
    tensors.sort(key=lambda t: (t.nbytes % block != 0, -t.dtype.itemsize))
    entries, offset = [], 0
    for t in tensors:
        entries.append(TensorEntry(t.leaf.name, t.dtype, t.shape, offset, offset + t.nbytes))
        offset += t.nbytes
    boxes = {t.leaf.name: t.box for t in tensors if t.box is not None}
    if boxes:
        meta[K_SHARDS] = encode_boxes(boxes)
        meta[DCP_SHARDING_INFO] = dcp_sharding_info([(t.leaf.name, t.shape, t.box) for t in tensors])
    meta.update(our_metadata(tree, block))
    align = header_align(offset, block)
    members = tensors_json(entries)  # once: every header of this save lists the same tensors
    count, prefix = 0, bytearray()
    for _ in range(8):  # the CRC count depends on where the data starts, which depends on it
        prefix = build_header(members, with_crcs(meta, [0] * count), align=align)
        want = chunks.data_chunk_count(len(prefix), len(prefix) + offset, block)
        if want == count:
            break
        count = want
    else:  # pragma: no cover - the header grows monotonically; two rounds suffice in practice
        raise RuntimeError("state header size did not converge")
    return _Plan(uri, tensors, entries, meta, prefix, len(prefix) + offset, align, members)


def header_align(data_bytes: int, block: int) -> int:
    """Where a state's data starts: on a checksum block when the data is large, so a tensor of
    whole blocks starts on one and a partial or resharded read of a box of whole blocks reads
    no block it does not need (2 -> 4 ranks read 6 % more with 4096-byte alignment); 4096
    bytes otherwise, where up to a block of header padding would cost more than it saves."""
    return block if data_bytes >= ALIGNED_DATA * block else ALIGN


def finish_header(p: _Plan, data: Sequence[memoryview], chunk: int) -> tuple[bytearray, list[int], float]:
    """(final header, the pipeline's expected chunk CRCs, pre-pass seconds); blocking."""
    t0 = now()
    block = chunks.block_size(chunk)
    data_crcs = chunks.data_chunk_crcs(data, p.data_start, block)
    prepass = now() - t0
    prefix = build_header(p.members, with_crcs(p.metadata, data_crcs), align=p.align)
    if len(prefix) != p.data_start:
        raise RuntimeError(f"state header changed size: {len(prefix)} != {p.data_start}")
    blocks = chunks.object_chunk_crcs(prefix, data_crcs, p.size, block)
    return prefix, list(chunks.coarsen(blocks, p.size, block, chunk)), prepass


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


async def close_staging(area: StagingArea) -> None:
    """Wait for a background staged save (or say it was abandoned), then free the staging area
    (``aclose``)."""
    await area.settle()
    if area.mapping is not None:  # unmapping: off the loop thread (no thread when nothing to unmap)
        await run_blocking(Offload(1), area.close)


# -- saving ----------------------------------------------------------------------------
async def save_state(
    rt: Runtime,
    storage: StorageRouter,
    area: StagingArea,
    uri: str | os.PathLike[str],
    state: Mapping[Any, Any],
    *,
    staging: modes.StagingMode | str = "none",
    metadata: Mapping[str, str] | None = None,
    progress: ProgressFn | None = None,
    ready: Ready | None = None,
) -> StateSaveResult | StagedSave:
    """Save a nested state as one safetensors object; see ``AsyncCheckpointer.save_state``.
    ``ready``: awaited once the state is laid out (refused before it if bad), before the
    target is checked and written (a step makes its directory there)."""
    staging = modes.parse("staging", staging, modes.StagingMode, fold=False)
    refuse_unchecked(rt.config.integrity)
    target = _uri(uri)
    t0 = now()  # the caller is blocked from here (the target's check included)
    if ready is None:
        await _check_target(storage, target)
    if staging == "host":
        t_wait = now()
        async with area.claimed():  # one copy into the area at a time; then busy until written
            waited = now() - t_wait
            return await _stage_and_write(
                rt, storage, area, target, state, metadata, progress, t0, waited, ready
            )
    executor = rt.executor()
    chunk = rt.config.chunk_size
    # in a thread: a state of 10 000 tensors takes 0.2 s to lay out, the loop's time else
    p = await run_blocking(executor, plan, target, state, chunk, metadata)
    if ready is not None:
        await ready()
        await _check_target(storage, target)
    copied = tuple(t.leaf.name for t in p.tensors if not t.contiguous)
    views, (prefix, expected, prepass) = await run_blocking(executor, _views_and_header, p, chunk)
    data = [memoryview(prefix), *views]
    saved = await save_object(
        rt, storage, target, p.size, data, "streaming", progress, expected, in_place=False
    )
    return await run_blocking(
        executor, _state_result, p, "none", now() - t0, 0.0, 0.0, prepass, copied, saved
    )


def refuse_unchecked(integrity: str) -> None:
    """State saves always carry checksums: a state object's safetensors header holds its chunk
    CRC32Cs, from a pre-pass that is also how a change to the arrays during the save is caught
    (SourceChangedError), and every state load verifies against them."""
    if integrity != "crc32c":
        raise ConfigError(
            f"save_state does not support integrity={integrity!r}: a state object's safetensors "
            "header carries its chunk CRC32Cs, which also detect arrays changed during the save; "
            "use a checkpointer with integrity='crc32c' (the default) for state saves"
        )


async def reserve_staging(
    rt: Runtime, area: StagingArea, state: Mapping[Any, Any], *, metadata: Mapping[str, str] | None = None
) -> int:
    """Make the ``staging="host"`` area big enough for ``state``, its pages faulted in, in a
    worker thread; the area's size in bytes (see ``AsyncCheckpointer.reserve_staging``)."""
    chunk = rt.config.chunk_size

    def lay_out_and_fault() -> int:
        p = plan("<staging area>", state, chunk, metadata)
        return area.reserve(p.size + STAGING_SLACK)

    async with area.claimed():
        return await run_blocking(rt.executor(), lay_out_and_fault)


async def _check_target(storage: StorageRouter, uri: str) -> None:
    sink = await storage.handle(uri)
    try:
        sink.check()
    finally:
        await sink.aclose()


async def _stage_and_write(
    rt: Runtime,
    storage: StorageRouter,
    area: StagingArea,
    uri: str,
    state: object,
    metadata: Mapping[str, str] | None,
    progress: ProgressFn | None,
    t0: float,
    waited: float,
    ready: Ready | None,
) -> StagedSave:
    chunk = rt.config.chunk_size
    threads = rt.budget.blocked_threads  # the caller waits for this copy: every core of its share

    def lay_out() -> tuple[_Plan, memoryview, list[list[tuple[Any, ...]]], float]:
        """Plan, area and the copies shared out, in one thread hop (each costs 0.2-1.5 ms
        here); a small state is copied here too."""
        p = plan(uri, state, chunk, metadata)
        view = area.ensure(p.size)
        started = now()
        bins = share_copies(p.tensors, [p.data_start + e.start for e in p.entries], view, threads)
        return p, view, bins, now() - started

    p, view, bins, inline_s = await run_blocking(rt.executor(), lay_out)
    t_copy = now()
    await copy_shared(bins, rt.executor())
    if ready is not None:
        await ready()
        await _check_target(storage, uri)
    copied = tuple(t.leaf.name for t in p.tensors if not t.contiguous)
    blocked = now() - t0
    copy_s = inline_s + now() - t_copy

    async def write() -> StateSaveResult:
        data = [view[p.data_start : p.size]]
        # the checksum pass is CPU-only background work: on the lowered CPU lane, so the
        # training's own threads keep their cores (asyncckpt.priority)
        lane = rt.cpu_executor(helpers=False)  # no dgen-py fill here: its pool is left as it is
        prefix, expected, prepass = await run_blocking(lane, finish_header, p, data, chunk)
        view[: p.data_start] = prefix
        # written from the area itself: no pool copy, and the pre-pass CRCs are the chunks'
        saved = await save_object(
            rt, storage, uri, p.size, view, "streaming", progress, expected, in_place=True
        )
        # in a thread: the result lists every tensor (80 000 of them take 0.1-0.7 s here)
        return await run_blocking(
            rt.executor(), _state_result, p, "host", blocked, waited, copy_s, prepass, copied, saved
        )

    task = asyncio.create_task(write(), name=f"asyncckpt-staged-save {uri}")
    staged = area.pending = StagedSave(task, uri=uri, blocked_s=blocked)
    task.add_done_callback(functools.partial(_log_failure, staged))
    return staged


def _state_result(
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
        tensor_names=tuple(e.name for e in p.entries),
        layout=_layout(p),
    )


def _layout(p: _Plan) -> tuple[dict[str, Any], ...]:
    """Where each tensor of the object lies (for a step's index): name, dtype, shape, object
    byte range and, for a sharded leaf, its global shape and offsets."""
    out = []
    for t, e in zip(p.tensors, p.entries, strict=True):
        entry: dict[str, Any] = {
            "name": e.name,
            "dtype": e.dtype.code,
            "shape": list(e.shape),
            "start": p.data_start + e.start,
            "end": p.data_start + e.end,
        }
        if t.box is not None:
            entry["global_shape"], entry["offsets"] = list(t.box[0]), list(t.box[1])
        out.append(entry)
    return tuple(out)


# -- loading -----------------------------------------------------------------------------
def check_load_options(as_torch: object, keys: object, prefix: object) -> None:
    """What every load of a state takes (one object, a step, resharded or not), checked
    before any I/O."""
    if not isinstance(as_torch, bool):
        raise ConfigError(f"as_torch must be True or False, got {as_torch!r}")
    select.check(keys, prefix)


async def load_state(
    rt: Runtime,
    storage: StorageRouter,
    uri: str | os.PathLike[str],
    into: Mapping[Any, Any] | None = None,
    *,
    as_torch: bool = False,
    verify: bool = True,
    num_readers: int | None = None,
    read_chunk_size: int | None = None,
    defeat_cache: bool = True,
    progress: ProgressFn | None = None,
    keys: str | Collection[str] | None = None,
    prefix: str | Collection[str] | None = None,
) -> StateLoadResult:
    """Load a safetensors object into a nested state; see ``AsyncCheckpointer.load_state``.

    The header is read first (its own small read), then the object streams through the one
    load orchestration (``engine.load.read``) with the manifest the header gives, each view
    scattered into the destination arrays."""
    if verify not in (True, False):
        raise ConfigError(f"verify must be True or False, got {verify!r}")
    if into is not None and not isinstance(into, Mapping):
        raise ConfigError(f"into must be a state mapping, got {type(into).__name__}")
    check_load_options(as_torch, keys, prefix)
    target = _uri(uri)
    sink = await storage.handle(target)
    try:
        sink.check()
        read_args(rt, sink, num_readers, read_chunk_size)  # the load's checks, before any I/O
        if sink.uses_shared_arena:  # the writer process that will serve the data, not another
            async with rt.lock:  # a shared pool, once built, stays: the arena outlives the lock
                pool = await rt.pool(shared=True)
            if isinstance(pool, SharedBufferPool):
                sink.attach_arena(pool.arena)
        head, header = await read_prefix(sink, await sink.size(), target)
    finally:
        await sink.aclose()
    meta = header.metadata
    ours = is_ours(meta)
    executor = rt.executor()
    # in threads, before and after the reads: every step below walks every tensor (80 000
    # of them held the loop 0.2 s here)
    tree, chunk, manifest, dests, known, scatter = await run_blocking(
        executor,
        _prepare_load,
        target,
        head,
        header,
        into,
        as_torch,
        verify,
        rt.config.chunk_size,
        keys,
        prefix,
    )

    async def take(at: int, view: memoryview) -> None:
        await scatter.take(at, view, executor)

    load = await read(
        rt, storage, target, take, num_readers=num_readers, read_chunk_size=read_chunk_size,
        defeat_cache=defeat_cache, progress=progress, known=known,
    )  # fmt: skip
    partial = keys is not None or prefix is not None
    state = await run_blocking(
        executor, _finish_load, dests, meta, target, tree if ours else None, None if partial else into
    )
    if manifest is not None:
        read_chunks = manifest.chunks if known.spans is None else -(-load.size_bytes // chunk)
        how = f"CRC32C of the header and of {read_chunks} chunk(s) of {chunk} bytes"
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


def _finish_load(
    dests: list[Destination], meta: dict[str, str], uri: str, tree: Any, into: Mapping[Any, Any] | None
) -> Any:
    """The loaded state once every byte is in: non-contiguous targets filled, sharded leaves
    as their boxes, the tree rebuilt (``tree`` None: another writer's file, a flat mapping);
    blocking."""
    _complete_all([d for d in dests if d.finish is not None])
    arrays = {d.entry.name: d.result for d in dests}
    for name, (global_shape, offsets) in decode_boxes(meta, uri).items():
        if name in arrays and not is_dtensor(arrays[name]):  # a box comes back as it was saved
            arrays[name] = Shard(global_shape, offsets, arrays[name])
    return arrays if tree is None else _rebuild(tree, arrays, into)


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


def _log_failure(staged: StagedSave, task: asyncio.Task[Any]) -> None:
    """Say so when a background save fails, or is cancelled: only its loop's end cancels it
    (``asyncio.run`` returned without awaiting it), and the caller may never look again."""
    if task.cancelled():
        log.error("%s", staged.abandoned_text())
    elif task.exception() is not None:
        log.error("background state save of %s failed: %s", staged.uri, task.exception())


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
    keys: str | Collection[str] | None,
    prefix_keys: str | Collection[str] | None,
) -> tuple[Any, int, Manifest | None, list[Destination], Known, _Scatter]:
    """(tree, chunk size, manifest to verify against, destinations, what the reads know, the
    scatter of their bytes); blocking: a header of 10 000 tensors takes 0.1 s to check and bind."""
    saved_chunk = chunk  # the object's own checksum chunk when it records one
    tree: Any = None
    manifest: Manifest | None = None
    paths: dict[tuple[Key, ...], str] | None = None
    crcs: Any = None
    if is_ours(header.metadata):
        tree, saved_chunk, crcs = asyncckpt_metadata(header.metadata, uri)
        paths = tensor_paths(tree) if into is not None else None
    values = select.value_paths(tree) if tree is not None and keys is not None else set()
    chosen = select.select([e.name for e in header.tensors], keys, prefix_keys, values)
    if tree is not None:
        if verify:
            manifest = header_manifest(prefix, header, uri, saved_chunk, crcs)
        if chosen is not None:
            tree = select.prune(tree, chosen)
    entries = [e for e in header.tensors if chosen is None or e.name in chosen]
    names = {e.name for e in header.tensors}
    dests = _destinations(entries, names, paths, into, as_torch, decode_boxes(header.metadata, uri), uri)
    known = Known(
        manifest=manifest or chunks.manifest_of(uri, header.size, chunk, ()),
        size=header.size,
        verify=manifest is not None,
        spans=None if chosen is None else _spans(header, dests, manifest),
    )
    return tree, saved_chunk, manifest, dests, known, _Scatter(header, prefix, dests, uri)


def _spans(
    header: Header, dests: list[Destination], manifest: Manifest | None
) -> tuple[tuple[int, int], ...]:
    """The reads of a partial load: the chosen tensors' bytes, widened to the checksum chunks
    that verify them (to aligned pages when nothing is verified)."""
    block = manifest.chunk_size if manifest is not None else ALIGN
    at = header.data_start
    found = select.spans([(at + d.entry.start, at + d.entry.end) for d in dests], block, header.size)
    return found or select.spans([(0, 1)], block, header.size)  # only empty tensors: one small read


def _destinations(
    entries: Sequence[TensorEntry],
    saved: set[str],
    paths: Mapping[tuple[Key, ...], str] | None,
    into: Mapping[Any, Any] | None,
    as_torch: bool,
    boxes: Mapping[str, Box],
    uri: str,
) -> list[Destination]:
    if into is None:
        ml = dtypes.optional_module("ml_dtypes")
        return [allocate(e, as_torch=as_torch, ml_dtypes=ml) for e in entries]
    _, leaves = flatten(into)
    by_name, unknown = match_leaves(leaves, paths)
    # a partial load fills the chosen tensors and leaves the rest of into= alone
    extra = unknown if paths is not None else [leaf for leaf in leaves if leaf.name not in saved]
    if extra:
        listed = ", ".join(path_text(leaf.path) for leaf in extra[:5])
        raise ConfigError(f"into: {listed} not in the checkpoint{_where_saved(extra, paths)}")
    missing = [e.name for e in entries if e.name not in by_name]
    if missing:
        raise ConfigError(f"into lacks the checkpoint's tensor(s) {missing[:5]}")
    return [_bind(e, by_name[e.name], boxes.get(e.name), uri) for e in entries]


def _where_saved(unknown: Sequence[Leaf], paths: Mapping[tuple[Key, ...], str] | None) -> str:
    """Where the checkpoint has a tensor of the dotted name of an unmatched leaf (``{"a.b": x}``
    for ``{"a": {"b": y}}``), said so: a different leaf, never loaded into this one."""
    if not paths:
        return ""
    by_name = {name: path for path, name in paths.items()}
    near = [(leaf, by_name[leaf.name]) for leaf in unknown if leaf.name in by_name]
    if not near:
        return ""
    leaf, path = near[0]
    return (
        f" (it has {leaf.name!r} at {path_text(path)}, a different leaf: into= is matched by "
        "where each leaf sits)"
    )


def _bind(e: TensorEntry, leaf: Leaf, saved: Box | None, uri: str) -> Destination:
    """``into=``'s leaf as the destination of ``e``; a DTensor or Shard must stand for the box
    the object holds (ConfigError naming both, before any tensor byte is read)."""
    where = path_text(leaf.path)
    box = dest_box(leaf.value)
    if box is None:
        return bind(e, leaf.value, where)
    global_shape, offsets = saved if saved is not None else (e.shape, (0,) * len(e.shape))
    mine = (tuple(box.global_shape), tuple(box.offsets), box.shape)
    if mine != (tuple(global_shape), tuple(offsets), tuple(e.shape)):
        raise ConfigError(
            f"into: {where} is the box at offsets {list(box.offsets)}, shape {list(box.shape)} of a "
            f"{list(box.global_shape)} tensor; {uri!r} holds {e.name!r} at offsets {list(offsets)}, "
            f"shape {list(e.shape)} of {list(global_shape)}: load the step with load_step, which "
            "reads each rank's box from the objects that hold it"
        )
    d = bind(e, box.data, where)
    if is_dtensor(leaf.value):  # handed back as the caller's DTensor, filled
        d.result = leaf.value
    return d


class _Scatter:
    """Copies the object's bytes, arriving in order (all of them, or the spans of a partial
    load), into the tensors' destinations."""

    def __init__(self, header: Header, prefix: bytearray, dests: list[Destination], uri: str) -> None:
        self.header, self.prefix, self.uri = header, prefix, uri
        self.dests = [d for d in dests if d.entry.nbytes]  # in offset order, as header.tensors
        self.ends = [d.entry.end for d in self.dests]
        self.starts = [d.entry.start for d in self.dests]

    async def take(self, start: int, view: memoryview, executor: Any) -> None:
        data_start = self.header.data_start
        if start < data_start:  # the header again: it must be the one that was parsed
            stop = min(start + len(view), data_start)
            if view[: stop - start] != memoryview(self.prefix)[start:stop]:
                raise IntegrityError(f"{self.uri!r} changed during the load: its header differs")
        # the first tensor that ends after this view starts, and the first that starts after it
        first = bisect.bisect_right(self.ends, start - data_start)
        after = bisect.bisect_left(self.starts, start + len(view) - data_start)
        if after - first >= _INLINE_PIECES:  # cutting that many views is the loop's time else
            await run_blocking(executor, lambda: _copy_pieces(self._pieces(start, view, first)))
            return
        pieces = self._pieces(start, view, first)
        if sum(len(dst) for dst, _ in pieces) < _INLINE_COPY:
            for dst, src in pieces:
                dst[:] = src
        else:
            await run_blocking(executor, _copy_pieces, pieces)

    def _pieces(self, start: int, view: memoryview, first: int) -> list[tuple[memoryview, memoryview]]:
        """(destination, source) views of the tensors from index ``first`` that ``view`` (at
        object offset ``start``) holds bytes of."""
        end = start + len(view)
        data_start = self.header.data_start
        pieces: list[tuple[memoryview, memoryview]] = []
        for i in range(first, len(self.dests)):  # no slice: a copy of 80 000 entries per chunk
            d = self.dests[i]
            t_start, t_end = data_start + d.entry.start, data_start + d.entry.end
            if t_start >= end:
                break
            lo, hi = max(start, t_start), min(end, t_end)
            if lo < hi:
                pieces.append((d.view[lo - t_start : hi - t_start], view[lo - start : hi - start]))
            if t_end > end:
                break
        return pieces

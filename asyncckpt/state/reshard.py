"""Loading a step on any number of ranks: each rank reads only the byte ranges of the boxes
its destination needs, verifies every checksum block it touched, and copies each box's
intersection into its destination.

A rank's destination for each global tensor is a box: a ``DTensor`` of ``into=`` (its local
tensor and where the mesh places it), a :class:`Shard` of ``into=``, a plain array of
``into=`` (the whole tensor) or, without ``into=``, a new array of the whole tensor. Per
object, the byte range from the first to the last element of each (saved box ∩ wanted box)
is read (widened to 256 KiB checksum blocks). Where the intersection is one run of bytes in
both boxes (a ``Shard(0)`` split) the read bytes go straight into the destination; otherwise
into a temporary of those bytes only, copied out with strides after the read. Objects are
read one after the other, so temporary memory is at most what one object contributes. A
read of 4 MiB or more is copied out by the caller's threads together (it waits for the
load): copying into pages never touched before is mostly page faults, which two cores take
in about half the time; a smaller one is copied in the thread hop that verified it.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import math
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..blocking import run_blocking
from ..engine import dtypes
from ..engine.header import asyncckpt_metadata, read_prefix, state_header
from ..engine.load import Known, read
from ..engine.manifest import Manifest
from ..engine.pipeline import unwrap_group
from ..engine.runtime import Runtime
from ..engine.safetensors_format import TensorEntry
from ..errors import ConfigError, StateFormatError
from ..sinks.isolation import SharedBufferPool
from ..sinks.router import StorageRouter
from . import select
from .api import restore_values
from .arrays import allocate, byte_array
from .flatten import Key, flatten, is_torch_tensor, match_leaves, path_text, tensor_paths, unflatten
from .index import Box, StepIndex, Tensor
from .shard import dest_box

_KINDS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
#: the least a thread is given of one read's copy-out: a hop costs 0.2-1.5 ms on the reference
#: VM, while 2 MiB into pages never touched takes 1-7 ms there (touched pages: 0.2 ms)
SHARE_MIN = 2 << 20
_CUT = 64 << 10  # where a copy-out may be cut between threads (whole pages, either size)


@dataclass
class Want:
    """One global tensor as this rank needs it: its box and the bytes to fill."""

    tensor: Tensor
    offsets: tuple[int, ...]
    shape: tuple[int, ...]
    dest: np.ndarray[Any, Any]  # the box's elements as unsigned ints of the dtype's size
    result: Any


@dataclass
class Copy:
    """Saved box ∩ wanted box: where its bytes lie in the object and where they go."""

    want: Want
    box: Box
    lo: tuple[int, ...]
    hi: tuple[int, ...]
    first: int  # object offset of the intersection's first element
    last: int  # object offset just past its last element

    @property
    def direct(self) -> bool:
        """Whether the intersection is one run of bytes in the saved box and in the wanted box
        (it spans both boxes whole in every dimension after the first: a ``Shard(0)`` split):
        then the reads are copied straight into the destination, with no temporary."""
        dims = zip(self.lo[1:], self.hi[1:], self.box.shape[1:], self.want.shape[1:], strict=True)
        return all(h - low == s == d for low, h, s, d in dims)

    def dest_bytes(self) -> np.ndarray[Any, Any]:
        """The wanted box's bytes this direct copy fills, in order."""
        w = self.want
        flat = w.dest.reshape(-1).view(np.uint8)
        start = sum((a - o) * s for a, o, s in zip(self.lo, w.offsets, _strides(w.shape, 1), strict=True))
        start *= w.dest.dtype.itemsize
        return flat[start : start + self.last - self.first]


@dataclass
class Reads:
    """What one rank read: bytes from storage and bytes its destinations needed."""

    read: int = 0
    needed: int = 0
    objects: list[str] = field(default_factory=list)


def _kind(itemsize: int) -> Any:
    return _KINDS.get(itemsize, np.dtype(("V", itemsize)))


def _dest_of(t: Tensor, value: Any, where: str) -> tuple[tuple[int, ...], tuple[int, ...], Any, Any]:
    """(offsets, shape, local array or tensor, result) of an ``into=`` leaf; ConfigError on a
    global shape or dtype that is not the checkpoint's."""
    box = dest_box(value)
    if box is not None:
        global_shape, offsets, local = tuple(box.global_shape), tuple(box.offsets), box.data
        shape = tuple(int(d) for d in local.shape)
        code = _code(local, where)
    else:
        global_shape = tuple(int(d) for d in value.shape)
        offsets, shape, local, code = (0,) * len(global_shape), global_shape, value, _code(value, where)
    if code != t.dtype or global_shape != t.global_shape:
        raise ConfigError(
            f"into: {where} is {code}{list(global_shape)} but the checkpoint's tensor {t.name!r} is "
            f"{t.dtype}{list(t.global_shape)}"
        )
    return tuple(int(o) for o in offsets), tuple(int(d) for d in shape), local, value


def _code(array: Any, where: str) -> str:
    if is_torch_tensor(array):
        return dtypes.from_torch(array.dtype, where).code
    if isinstance(array, np.ndarray):
        return dtypes.from_numpy(array.dtype, where).code
    raise ConfigError(f"into: {where} is a {type(array).__name__}; in-place loads need arrays or tensors")


def wants(
    tensors: Mapping[str, Tensor],
    into: Mapping[Any, Any] | None,
    as_torch: bool,
    chosen: set[str] | None,
    paths: Mapping[tuple[Key, ...], str] | None = None,
) -> list[Want]:
    """This rank's boxes (blocking: binds every leaf); ``paths``: where the saved tree places
    each tensor, which ``into=``'s leaves are matched by (None: by their dotted names)."""
    out = []
    if into is None:
        ml = dtypes.optional_module("ml_dtypes")
        for t in tensors.values():
            if chosen is None or t.name in chosen:
                entry = _entry(t)
                d = allocate(entry, as_torch=as_torch, ml_dtypes=ml)
                dest = (
                    np.frombuffer(d.view, np.uint8).view(_kind(entry.dtype.itemsize)).reshape(t.global_shape)
                )
                out.append(Want(t, (0,) * len(t.global_shape), t.global_shape, dest, d.result))
        return out
    _, leaves = flatten(into)
    by_name, unknown = match_leaves(leaves, paths)
    if unknown:
        leaf = unknown[0]
        raise ConfigError(f"into: {path_text(leaf.path)} ({leaf.name!r}) is not in the checkpoint")
    for name, leaf in by_name.items():
        where = path_text(leaf.path)
        found = tensors.get(name)
        if found is None:
            raise ConfigError(f"into: {where} ({name!r}) is not in the checkpoint")
        if chosen is not None and name not in chosen:
            continue  # a partial load leaves the rest of into= alone
        offsets, shape, local, result = _dest_of(found, leaf.value, where)
        item = dtypes.lookup(found.dtype, found.name).itemsize
        dest = byte_array(local, f"into: {where}").view(_kind(item)).reshape(shape)
        out.append(Want(found, offsets, shape, dest, result))
    named = {w.tensor.name for w in out}
    missing = [n for n in tensors if (chosen is None or n in chosen) and n not in named]
    if missing:
        raise ConfigError(f"into lacks the checkpoint's tensor(s) {missing[:5]}")
    return out


async def load(
    rt: Runtime,
    storage: StorageRouter,
    base: str,
    index: StepIndex,
    *,
    into: Mapping[Any, Any] | None = None,
    as_torch: bool = False,
    keys: object = None,
    prefix: object = None,
    own: int = 0,
) -> tuple[Any, Reads]:
    """This rank's state of a step saved by any number of ranks: the sharded tensors' boxes
    it needs, and object ``own``'s plain tensors and other values (a plain tensor is a
    per-rank value: on the world size that saved the step each rank gets its own, on another
    every rank gets rank 0's)."""
    select.check(keys, prefix)
    if not 0 <= own < len(index.objects):
        raise ConfigError(f"rank {own} has no object in a step of {len(index.objects)} ranks")
    tensors = {**index.local[own], **index.tensors}
    try:
        chosen = select.select(list(tensors), keys, prefix)
    except ConfigError:
        if keys is None:
            raise
        # a key naming a value of the state (``step``) is told so, from the tree's header
        _, _, tree = await object_header(rt, storage, f"{base}/{index.objects[own]}")
        select.select(list(tensors), keys, prefix, select.value_paths(tree))
        raise
    executor = rt.executor()
    # into= is matched by where each leaf sits, which object ``own``'s tree says: its header
    # first (read once: its boxes' reads below use it)
    own_uri = f"{base}/{index.objects[own]}"
    head = None if into is None else await object_header(rt, storage, own_uri)
    first = None if head is None else head[2]
    want_list, by_obj = await run_blocking(executor, _wants_and_plan, tensors, into, as_torch, chosen, first)
    reads = Reads(needed=needed_bytes(want_list))
    trees: dict[int, Any] = {}
    for obj in sorted(by_obj):  # popped: an object's temporaries go once it is read
        known = head if obj == own else None
        uri = f"{base}/{index.objects[obj]}"
        trees[obj] = await read_object(rt, storage, uri, by_obj.pop(obj), reads, head=known)
    # object ``own``'s header holds the tree: read again only if none of its boxes was read
    tree = first if first is not None else trees.get(own)
    if tree is None:
        tree = await _tree(storage, own_uri)
    arrays = {w.tensor.name: w.result for w in want_list}
    state = await run_blocking(executor, _rebuild, tree, arrays, chosen, into)
    return state, reads


async def _tree(storage: StorageRouter, uri: str) -> Any:
    sink = await storage.handle(uri)
    try:
        _, header = await read_prefix(sink, await sink.size(), uri)
    finally:
        await sink.aclose()
    tree, _, _ = asyncckpt_metadata(header.metadata, uri)
    return tree


def _wants_and_plan(
    tensors: Mapping[str, Tensor],
    into: Mapping[Any, Any] | None,
    as_torch: bool,
    chosen: set[str] | None,
    tree: Any,
) -> tuple[list[Want], dict[int, _Spans]]:
    """This rank's boxes and, per object, where its reads land: one thread hop (blocking;
    each hop costs 0.2-1.5 ms on the reference VM, and a rank's load paid five of them)."""
    want_list = wants(tensors, into, as_torch, chosen, None if tree is None else tensor_paths(tree))
    return want_list, {obj: _Spans(copies) for obj, copies in plan(want_list).items()}


def _rebuild(
    tree: Any, arrays: Mapping[str, Any], chosen: set[str] | None, into: Mapping[Any, Any] | None
) -> Any:
    state = unflatten(select.prune(tree, chosen) if chosen is not None else tree, arrays)
    if into is not None and chosen is None:  # a partial load's tree holds placeholders only
        restore_values(into, state)
    return state


def _entry(t: Tensor) -> TensorEntry:
    dt = dtypes.lookup(t.dtype, t.name)
    return TensorEntry(t.name, dt, t.global_shape, 0, math.prod(t.global_shape) * dt.itemsize)


def plan(want_list: Sequence[Want]) -> dict[int, list[Copy]]:
    """Per object: the intersections of its saved boxes with this rank's boxes (blocking)."""
    by_obj: dict[int, list[Copy]] = {}
    for w in want_list:
        item = dtypes.lookup(w.tensor.dtype, w.tensor.name).itemsize
        w_hi = [o + n for o, n in zip(w.offsets, w.shape, strict=True)]
        for box in w.tensor.boxes:
            lo = tuple(max(a, b) for a, b in zip(w.offsets, box.offsets, strict=True))
            hi = tuple(min(a, b + n) for a, b, n in zip(w_hi, box.offsets, box.shape, strict=True))
            if any(h <= low for low, h in zip(lo, hi, strict=True)):
                continue
            strides = _strides(box.shape, item)
            first = box.start + sum((a - o) * s for a, o, s in zip(lo, box.offsets, strides, strict=True))
            last = (
                box.start
                + sum((h - 1 - o) * s for h, o, s in zip(hi, box.offsets, strides, strict=True))
                + item
            )
            by_obj.setdefault(box.obj, []).append(Copy(w, box, lo, hi, first, last))
    return by_obj


def _strides(shape: Sequence[int], item: int) -> tuple[int, ...]:
    out, step = [], item
    for n in reversed(shape):
        out.append(step)
        step *= n
    return tuple(reversed(out))


class _Spans:
    """Where one object's reads land: straight in the destination for direct copies, else in
    temporaries covering only the other copies' bytes (strided copies after the read), made
    at the object's first read (a load plans every object at once, reads one at a time)."""

    def __init__(self, copies: Sequence[Copy]) -> None:
        self.copies = list(copies)
        self.direct = sorted((c for c in copies if c.direct), key=lambda c: c.first)
        self.ends = [c.last for c in self.direct]
        spans = select.spans([(c.first, c.last) for c in copies if not c.direct], 1, 1 << 62)
        self.starts = [s for s, _ in spans]
        self.sizes = [n for _, n in spans]
        self.bufs: list[np.ndarray[Any, Any]] = []
        self.strided = [c for c in copies if not c.direct]
        self._made = threading.Lock()  # two threads may share an object's first read

    def put(self, at: int, view: memoryview) -> None:
        if len(self.bufs) < len(self.sizes):
            with self._made:
                if len(self.bufs) < len(self.sizes):
                    self.bufs = [np.empty(n, np.uint8) for n in self.sizes]
        end = at + len(view)
        src = np.frombuffer(view, np.uint8)
        i = bisect.bisect_right(self.ends, at)  # the first direct copy ending after ``at``
        while i < len(self.direct) and self.direct[i].first < end:
            c = self.direct[i]
            lo, hi = max(at, c.first), min(end, c.last)
            c.dest_bytes()[lo - c.first : hi - c.first] = src[lo - at : hi - at]
            i += 1
        j = max(0, bisect.bisect_right(self.starts, at) - 1)
        while j < len(self.starts) and self.starts[j] < end:
            lo, hi = max(at, self.starts[j]), min(end, self.starts[j] + self.sizes[j])
            if lo < hi:
                self.bufs[j][lo - self.starts[j] : hi - self.starts[j]] = src[lo - at : hi - at]
            j += 1

    def copy_out(self, c: Copy) -> None:
        """The intersection, read with the saved box's strides, into the wanted box."""
        w = c.want
        i = bisect.bisect_right(self.starts, c.first) - 1
        item = w.dest.dtype.itemsize
        src = np.ndarray(
            tuple(h - low for low, h in zip(c.lo, c.hi, strict=True)),
            dtype=w.dest.dtype,
            buffer=self.bufs[i],
            offset=c.first - self.starts[i],
            strides=_strides(c.box.shape, item),
        )
        where = tuple(slice(low - o, h - o) for low, h, o in zip(c.lo, c.hi, w.offsets, strict=True))
        np.copyto(w.dest[where], src)


async def object_header(rt: Runtime, storage: StorageRouter, uri: str) -> tuple[int, Manifest, Any]:
    """(size, manifest, state tree) of one asyncckpt state object, from its header."""
    sink = await storage.handle(uri)
    try:
        sink.check()
        if sink.uses_shared_arena:
            async with rt.lock:
                pool = await rt.pool(shared=True)
            if isinstance(pool, SharedBufferPool):
                sink.attach_arena(pool.arena)
        size = await sink.size()
        found = await state_header(sink, size, uri)
    finally:
        await sink.aclose()
    if found is None:
        raise StateFormatError(f"{uri!r}: not an asyncckpt state object (no checksums to verify against)")
    return size, found[0], found[1]


async def read_object(
    rt: Runtime,
    storage: StorageRouter,
    uri: str,
    temps: _Spans,
    reads: Reads,
    *,
    verify: bool = True,
    head: tuple[int, Manifest, Any] | None = None,
) -> Any:
    """Read the byte ranges ``temps``' copies need from one object, verified per checksum block,
    and copy each intersection to its destination; the state tree its header holds. ``head``:
    the object's :func:`object_header`, when already read."""
    size, manifest, tree = head if head is not None else await object_header(rt, storage, uri)
    spans = select.spans([(c.first, c.last) for c in temps.copies], manifest.chunk_size, size)
    executor = rt.executor()
    threads = rt.budget.blocked_threads

    delivered: set[int] = set()

    def deliver(at: int, view: memoryview, beside: bool) -> None:  # in the hop that verified it
        # beside other reads' copies, a read copies its own bytes: they already share the
        # threads; in the one in-order hop, a large copy is left to be shared out (take)
        if beside or len(share_cuts(len(view), threads)) == 1:
            temps.put(at, view)
            delivered.add(at)

    async def take(at: int, view: memoryview) -> None:  # verified; shared if not delivered
        if at in delivered:
            delivered.discard(at)
            return
        await put_shared(executor, temps, at, view, share_cuts(len(view), threads))

    await read(rt, storage, uri, take, known=Known(manifest, size, verify, spans), deliver=deliver)
    if temps.strided:  # a Shard(0) split has none: no hop
        await run_blocking(executor, _copy_all, temps)
    reads.read += sum(n for _, n in spans)
    reads.objects.append(uri)
    return tree


def share_cuts(n: int, threads: int) -> list[tuple[int, int]]:
    """(start, end) of each thread's share of a copy of ``n`` bytes: at most ``threads``
    shares and at most ``n // SHARE_MIN`` (one share when ``n`` is small), cut on 64 KiB."""
    shares = max(1, min(threads, n // SHARE_MIN))
    step = max(_CUT, -(-n // shares // _CUT) * _CUT)
    return [(lo, min(n, lo + step)) for lo in range(0, n, step)] if n else [(0, 0)]


async def put_shared(
    executor: Executor, temps: _Spans, at: int, view: memoryview, cuts: list[tuple[int, int]]
) -> None:
    """``temps.put(at, view)`` shared between worker threads, one per cut of
    :func:`share_cuts` (disjoint bytes of the destinations); every thread has finished when
    this returns or raises."""
    parts = [view[lo:hi] for lo, hi in cuts]
    try:  # a failure cancels the rest, and each cancelled copy still waits for its thread
        async with asyncio.TaskGroup() as tg:
            for (lo, _), part in zip(cuts, parts, strict=True):
                tg.create_task(run_blocking(executor, temps.put, at + lo, part))
    except BaseExceptionGroup as group:
        raise unwrap_group(group) from None
    finally:
        for part in parts:
            with contextlib.suppress(BufferError):
                part.release()


def _copy_all(temps: _Spans) -> None:
    for c in temps.strided:
        temps.copy_out(c)


def needed_bytes(want_list: Sequence[Want]) -> int:
    return sum(w.dest.nbytes for w in want_list)


def check_index_world(index: StepIndex, objects: Sequence[str], where: str) -> None:
    if list(index.objects) != list(objects):
        raise StateFormatError(
            f"{where}: the step index names objects {list(index.objects)[:4]}, "
            f"the commit record {list(objects)[:4]}"
        )

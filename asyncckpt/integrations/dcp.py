"""PyTorch Distributed Checkpoint (DCP) storage through asyncckpt.

``dcp.save``, ``dcp.async_save`` and ``dcp.load`` keep their planners, resharding and commit
order; only the bytes go through asyncckpt (O_DIRECT files, S3 multipart, a sealed manifest of
per-chunk CRC32C in every object, verified on load):

- each rank writes **one object** per save, ``__<rank>_0.distcp``: its write items back to
  back, tensors as their raw bytes (no ``torch.save`` per tensor: nothing is serialised or
  copied beyond the pool), ``BYTE_IO`` items as DCP's own ``torch.save`` bytes;
- the coordinator writes ``.metadata`` (DCP's :class:`Metadata`, pickled, as DCP does) only in
  ``finish``, which DCP calls after every rank's ``write_data`` returned, i.e. after every
  rank's object was committed; ``.metadata`` is committed atomically like any asyncckpt object,
  so a checkpoint directory without it was never complete and is refused by the reader.

The objects are asyncckpt objects (raw extents plus a sealed footer), so they are read with
:class:`AsyncCkptStorageReader`, not torch's ``FileSystemReader``.
"""

from __future__ import annotations

import atexit
import dataclasses
import io
import os
import pickle
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

from ..checkpointer import AsyncCheckpointer
from ..config import CheckpointConfig
from ..errors import ConfigError, ManifestError, MissingDependencyError, TargetNotFoundError, map_os_error
from ..sinks import capabilities, join_uri, local_path
from .loop_thread import CheckpointerThread

try:
    import torch
    from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
    from torch.distributed.checkpoint.planner import (
        LoadItemType,
        LoadPlan,
        LoadPlanner,
        ReadItem,
        SavePlan,
        SavePlanner,
        WriteItemType,
    )
    from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
    from torch.futures import Future
except ImportError:  # pragma: no cover - the [torch] extra
    raise MissingDependencyError("torch", "torch", "the PyTorch DCP integration") from None

METADATA = ".metadata"  # DCP's name for the committed plan
SUFFIX = ".distcp"


@dataclass(frozen=True)
class ItemLocation:
    """Where one write item's bytes are: object (relative to the checkpoint), range, layout.

    Stored in ``Metadata.storage_data``; ``dtype``/``shape`` (of the saved chunk) are ``None``
    for ``BYTE_IO`` items.
    """

    relative_path: str
    offset: int
    length: int
    dtype: torch.dtype | None = None
    shape: tuple[int, ...] | None = None


def join(root: str, name: str) -> str:
    """``root``/``name`` for a directory path or an ``s3://bucket/prefix``."""
    return join_uri(root, name)


def byte_view(tensor: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, shared with it (any dtype, 0-d and empty too)."""
    return tensor.reshape(-1).view(torch.uint8).numpy().data


def _as_saved(data: torch.Tensor) -> torch.Tensor:
    # only the projection counts (DCP hands views of shards); a copy only when not contiguous
    return data.detach().cpu().resolve_conj().resolve_neg().contiguous()


def _config(config: CheckpointConfig | None, options: dict[str, Any]) -> CheckpointConfig:
    if config is not None and options:
        raise ConfigError("pass either config= or keyword options, not both")
    return config if config is not None else CheckpointConfig.from_options(**options)


def _checkpoint_id(path: str | os.PathLike[str]) -> str:
    if not isinstance(path, (str, os.PathLike)):
        raise ConfigError(f"checkpoint_id must be a path or an s3:// URI, got {path!r}")
    text = os.fspath(path)
    capabilities(text)  # an unsupported scheme fails here, before any rank writes
    return text


# DCP's process-based async_save sends the writer, pickled, to its checkpoint daemon with every
# save: the copies of one writer share one checkpointer thread in that process (its pool stays
# allocated between saves), closed when the process exits.
_SHARED: dict[str, CheckpointerThread] = {}
_SHARED_GUARD = threading.Lock()


def _shared_thread(key: str, config: CheckpointConfig, name: str) -> CheckpointerThread:
    with _SHARED_GUARD:
        thread = _SHARED.get(key)
        if thread is None:
            if not _SHARED:
                atexit.register(close_shared_threads)
            thread = _SHARED[key] = CheckpointerThread(config, name=name)
        return thread


def close_shared_threads() -> None:
    """Close the threads of unpickled writers (run at exit: a save in flight finishes first)."""
    with _SHARED_GUARD:
        threads = list(_SHARED.values())
        _SHARED.clear()
    for thread in threads:
        thread.close()


class _Storage:
    """What the writer and reader share: the checkpoint location and the checkpointer thread."""

    def __init__(self, path: str | os.PathLike[str], config: CheckpointConfig, role: str) -> None:
        self.path = _checkpoint_id(path)
        self.config = config
        self.thread = CheckpointerThread(config, name=f"asyncckpt-dcp-{role}")
        self.rank: int | None = None
        self.use_collectives = True

    def reset_path(self, checkpoint_id: str | os.PathLike[str] | None) -> None:
        if checkpoint_id:
            self.path = _checkpoint_id(checkpoint_id)

    def metadata_uri(self, rank: int | None = None) -> str:
        """``.metadata``, or ``__<rank>.metadata`` when DCP saves without collectives."""
        if rank is None and not self.use_collectives:
            rank = self.rank
        return join(self.path, METADATA if rank is None else f"__{rank}{METADATA}")

    def close(self) -> None:
        """Stop the checkpointer thread (a write still in flight finishes first)."""
        self.thread.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        try:
            _checkpoint_id(checkpoint_id)
        except ConfigError:
            return False
        return True


class AsyncCkptStorageWriter(_Storage, StorageWriter):
    """A DCP ``StorageWriter`` whose objects are asyncckpt saves (see the module docstring).

    ``path``: a directory or ``s3://bucket/prefix``; options as for :class:`AsyncCheckpointer`.
    ``overwrite=False`` refuses a location holding a committed checkpoint; ``True`` first
    removes its ``.metadata``, so a save that dies midway leaves nothing loadable, never a mix.
    ``progress(nbytes)`` is called as this rank's object is written. ``close()`` (or ``with``)
    stops the writer's thread; one writer serves many saves.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        config: CheckpointConfig | None = None,
        overwrite: bool = True,
        progress: Callable[[int], None] | None = None,
        **options: Any,
    ) -> None:
        super().__init__(path, _config(config, options), "writer")
        self.overwrite = overwrite
        self.progress = progress
        self.save_id = str(uuid.uuid4())
        self.writer_id = str(uuid.uuid4())  # names its copies' shared thread in another process

    def __getstate__(self) -> dict[str, Any]:
        """Everything but the thread: DCP's process-based ``async_save`` pickles the writer."""
        if self.progress is not None:
            try:
                pickle.dumps(self.progress)
            except (pickle.PicklingError, TypeError, AttributeError) as exc:
                raise ConfigError(
                    f"progress={self.progress!r} cannot be pickled ({exc}), and DCP's process-based "
                    "async_save sends the writer to its checkpoint process: pass a module-level "
                    "function, or no progress"
                ) from None
        return {k: v for k, v in self.__dict__.items() if k != "thread"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.thread = _shared_thread(self.writer_id, self.config, "asyncckpt-dcp-writer")

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        self.reset_path(checkpoint_id)
        self.save_id = str(uuid.uuid4())

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.rank = kwargs.get("rank")
        self.use_collectives = kwargs.get("use_collectives", True)

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=self.path, save_id=self.save_id)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        if local_path(self.path) is not None:
            try:
                os.makedirs(self.path, exist_ok=True)
            except OSError as exc:
                raise map_os_error(exc, f"create checkpoint directory {self.path}") from exc
        if self.rank is not None and not self.use_collectives:  # no global plan names the objects
            return dataclasses.replace(plan, storage_data=f"__{self.rank}_")
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        """On the coordinator, before any rank writes: unpublish (or refuse) a committed checkpoint."""
        self.thread.run(self._unpublish)
        return [
            p if p.storage_data is not None else dataclasses.replace(p, storage_data=f"__{i}_")
            for i, p in enumerate(plans)
        ]

    async def _unpublish(self, ckpt: AsyncCheckpointer) -> None:
        uri = self.metadata_uri()
        if await ckpt.probe(uri) == "absent":
            return
        if not self.overwrite:
            raise ConfigError(f"a checkpoint is already committed at {self.path!r} and overwrite=False")
        await ckpt.delete(uri)

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        """This rank's items as one object, written on the writer's loop; the future resolves
        once the object is committed (the results then name where each item is)."""
        name = f"{plan.storage_data}0{SUFFIX}"
        pieces: list[memoryview] = []
        results: list[WriteResult] = []
        offset = 0
        # BYTE_IO first (small), then tensors, as DCP's writer orders them
        for item in sorted(plan.items, key=lambda i: i.type != WriteItemType.BYTE_IO):
            data = planner.resolve_data(item)
            if isinstance(data, io.BytesIO):
                view = data.getbuffer()
                loc = ItemLocation(name, offset, len(view))
            else:
                tensor = _as_saved(data)
                view = byte_view(tensor)
                loc = ItemLocation(name, offset, len(view), tensor.dtype, tuple(tensor.shape))
            pieces.append(view)
            results.append(WriteResult(index=item.index, size_in_bytes=len(view), storage_data=loc))
            offset += len(view)
        done: Future[list[WriteResult]] = Future()
        if offset == 0:  # nothing of this rank's (replicated items went to another rank)
            done.set_result(results)
            return done
        uri, size = join(self.path, name), offset

        async def save(ckpt: AsyncCheckpointer) -> list[WriteResult]:
            await ckpt.save(uri, size, data=pieces, progress=self.progress)
            return results

        def settle(f: Any) -> None:
            exc = f.exception()
            if exc is not None:
                done.set_exception(exc)
            else:
                done.set_result(f.result())

        self.thread.submit(save).add_done_callback(settle)
        return done

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """Commit: every rank's object is durable (DCP gathered their results); ``.metadata`` now."""
        metadata.storage_data = {r.index: r.storage_data for rank in results for r in rank}
        metadata.storage_meta = self.storage_meta()
        blob = pickle.dumps(metadata)
        uri = self.metadata_uri()

        async def commit(ckpt: AsyncCheckpointer) -> None:
            await ckpt.save(uri, len(blob), data=blob)

        self.thread.run(commit)


class AsyncCkptStorageReader(_Storage, StorageReader):
    """A DCP ``StorageReader`` for checkpoints of :class:`AsyncCkptStorageWriter`.

    Every object is streamed through asyncckpt's verified reader (each chunk's CRC32C checked
    before its bytes reach a tensor) and scattered into the destination tensors as it arrives:
    memory is the pool plus any tensor that must be resharded or converted.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, config: CheckpointConfig | None = None, **options: Any
    ) -> None:
        super().__init__(path, _config(config, options), "reader")
        self.storage_data: dict[MetadataIndex, ItemLocation] = {}
        self.load_id = str(uuid.uuid4())

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        self.reset_path(checkpoint_id)
        self.storage_data = {}
        self.load_id = str(uuid.uuid4())

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        uri = self.metadata_uri(kwargs.get("rank"))
        try:
            blob = self.thread.run(lambda ckpt: read_small(ckpt, uri))
        except TargetNotFoundError as exc:
            raise TargetNotFoundError(
                exc.errno,
                f"no committed DCP checkpoint at {self.path!r}: {uri!r} does not exist (a save that did not "
                "finish, or a wrong path)",
            ) from exc
        metadata = parse_metadata(blob, uri)
        if metadata.storage_meta is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        self.storage_data = dict(metadata.storage_data)
        self.rank = kwargs.get("rank")
        self.use_collectives = kwargs.get("use_collectives", True)

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """Stream each object this rank needs once, in order, filling its items (this thread)."""
        per_object: dict[str, list[ReadItem]] = {}
        for item in plan.items:
            per_object.setdefault(self.storage_data[item.storage_index].relative_path, []).append(item)
        for name, items in per_object.items():
            extents = [self._extent(item, planner) for item in items]
            stream_into(self.thread, join(self.path, name), extents)
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def _extent(self, item: ReadItem, planner: LoadPlanner) -> Extent:
        loc = self.storage_data[item.storage_index]
        if item.type == LoadItemType.BYTE_IO:
            buf = bytearray(loc.length)
            return Extent(loc.offset, memoryview(buf), lambda: planner.load_bytes(item, io.BytesIO(buf)))
        target = planner.resolve_tensor(item).detach()
        assert loc.dtype is not None and loc.shape is not None
        dtype, shape = loc.dtype, loc.shape
        whole = not any(item.storage_offsets) and tuple(item.lengths) == shape
        if whole and target.is_contiguous() and target.dtype == dtype and target.device.type == "cpu":
            return Extent(loc.offset, byte_view(target), lambda: planner.commit_tensor(item, target))
        buf = bytearray(loc.length)  # a chunk to narrow (resharding) or convert: staged whole

        def place() -> None:
            part = saved_tensor(buf, dtype, shape)
            for dim, (start, length) in enumerate(zip(item.storage_offsets, item.lengths, strict=True)):
                part = part.narrow(dim, start, length)
            if tuple(target.shape) != tuple(part.shape):
                raise ManifestError(
                    f"{item.storage_index.fqn}: the checkpoint holds {tuple(part.shape)}, "
                    f"the destination is {tuple(target.shape)}"
                )
            target.copy_(part)
            planner.commit_tensor(item, target)

        return Extent(loc.offset, memoryview(buf), place)

    def storage_meta(self) -> StorageMeta | None:
        return None


def parse_metadata(blob: bytes, uri: str) -> Metadata:
    """The ``.metadata`` of an :class:`AsyncCkptStorageWriter` checkpoint; ManifestError if not."""
    try:
        metadata = pickle.loads(blob)  # DCP's own format (and trust model): a pickled Metadata
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError) as exc:
        raise ManifestError(f"{uri!r} is not a readable DCP metadata pickle: {exc}") from exc
    if not isinstance(metadata, Metadata) or not all(
        isinstance(loc, ItemLocation) for loc in (metadata.storage_data or {}).values()
    ):
        raise ManifestError(
            f"{uri!r} is not the metadata of an AsyncCkptStorageWriter checkpoint "
            "(a FileSystemWriter checkpoint is read with torch's FileSystemReader)"
        )
    return metadata


def saved_tensor(buf: bytearray, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """The saved chunk whose raw bytes are ``buf`` (shares its memory)."""
    raw = torch.frombuffer(buf, dtype=torch.uint8) if buf else torch.empty(0, dtype=torch.uint8)
    return raw.view(dtype).reshape(shape)


@dataclass
class Extent:
    """Bytes ``[start, start + len(dest))`` of an object go into ``dest``; then ``finish()``."""

    start: int
    dest: memoryview
    finish: Callable[[], None]

    @property
    def end(self) -> int:
        return self.start + len(self.dest)


async def read_small(ckpt: AsyncCheckpointer, uri: str) -> bytes:
    """A whole (small) object, verified."""
    out = bytearray()
    async with ckpt.iter_load(uri) as stream:
        async for view in stream:
            out += view
    return bytes(out)


def stream_into(thread: CheckpointerThread, uri: str, extents: Sequence[Extent]) -> None:
    """Stream ``uri`` (verified) and copy each extent's bytes on *this* thread as they arrive.

    A view is valid until the next one is asked for, so the loop thread only fetches; the
    copies (memcpy of the whole checkpoint) stay off its loop. Stops once every extent is full.
    """
    pending = sorted((e for e in extents if len(e.dest)), key=lambda e: e.start)
    for e in extents:
        if not len(e.dest):
            e.finish()
    if not pending:
        return
    stream = thread.run(_open_stream(uri))
    views = aiter(stream)
    pos = 0
    try:
        while pending:
            view = thread.run(_next(views))
            if view is None:
                raise ManifestError(f"{uri!r} ended at byte {pos} before every item was read")
            end = pos + len(view)
            for e in pending:
                if e.start >= end:
                    break
                lo, hi = max(pos, e.start), min(end, e.end)
                if lo < hi:
                    e.dest[lo - e.start : hi - e.start] = view[lo - pos : hi - pos]
            for e in [e for e in pending if e.end <= end]:
                e.finish()
            pending = [e for e in pending if e.end > end]
            pos = end
    finally:
        thread.run(lambda _: stream.aclose())


def _open_stream(uri: str) -> Callable[[AsyncCheckpointer], Any]:
    async def open_(ckpt: AsyncCheckpointer) -> Any:
        return ckpt.iter_load(uri)

    return open_


def _next(views: Any) -> Callable[[AsyncCheckpointer], Any]:
    async def next_(_: AsyncCheckpointer) -> memoryview | None:
        try:
            view: memoryview = await anext(views)
        except StopAsyncIteration:
            return None
        return view

    return next_

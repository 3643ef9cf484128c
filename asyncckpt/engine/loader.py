"""The load path: manifest first, then ``num_readers`` concurrent range reads into pooled buffers.

Reads are issued in object order as buffers come free (the pool bounds memory and, with
``num_readers``, the reads in flight) and handed on in order, so verification and the caller
see one contiguous stream and an ``into=`` copy or a restore needs no reordering. Each read
is timed around the storage call; verification is timed inside its worker thread; the
caller's time with a view is measured between items. None of them hides in another.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from ..blocking import read_full, run_blocking
from ..errors import (
    ChecksumMismatchError,
    ConfigError,
    ManifestError,
    StallError,
    StorageError,
    TargetNotFoundError,
    TruncatedError,
)
from ..modes import VerifyMode
from ..pool import BufferPool, PoolBuffer, close_mapping
from ..results.metrics import CONSUMER, IO, ReadRecord, notify_progress
from ..results.records import LoadResult
from ..sinks.base import Sink
from .manifest import Manifest, object_name
from .monitor import now
from .pipeline import unwrap_group
from .verify import SYNTHETIC, BlockVerifier, Mismatch, RegenerateVerifier, Verifier

#: a blocking ``(object offset, view, beside)`` consumer run in the thread that verified the
#: view: ``beside`` is True where each read's view is verified and delivered as it lands, so
#: several run at once (a partial read of whole checksum blocks), False in the in-order hop
Deliver = Callable[[int, memoryview, bool], None]
#: run in a read's own task once its bytes landed: (its record, its view)
Landed = Callable[[ReadRecord, memoryview], Awaitable[None]]

VERIFY_MODES: dict[object, VerifyMode] = {
    True: "checksum",
    "checksum": "checksum",
    "regenerate": "regenerate",
    False: "none",
}


def verify_mode(verify: object) -> VerifyMode:
    """``True``/"checksum", "regenerate" or ``False`` → the mode name (ConfigError otherwise)."""
    try:
        return VERIFY_MODES[verify]
    except (KeyError, TypeError):
        raise ConfigError(f"verify must be True, False, 'checksum' or 'regenerate', got {verify!r}") from None


@dataclass
class LoadState:
    """What a load learned, filled in as it goes (the checkpointer builds the result from it)."""

    uri: str = ""
    backend: str = ""
    manifest: Manifest | None = None
    size: int = 0
    open_s: float = 0.0
    lock_wait_s: float = 0.0  # waiting for the checkpointer's lock (another save or load)
    records: list[ReadRecord] = field(default_factory=list)
    verify_mode: VerifyMode = "none"
    regen_s: float = 0.0
    identity_note: str = ""
    sink_facts: dict[str, Any] = field(default_factory=dict)
    result: LoadResult | None = None  # once the last view was consumed
    #: (offset, length) ranges to read, in object order; None: the whole object
    spans: tuple[tuple[int, int], ...] | None = None
    offset: int = 0  # object offset of the view last handed out


def identity_note(manifest: Manifest, facts: dict[str, Any], uri: str) -> str:
    """A sentence for error messages when the object is not the version the save published.

    Only fields known on both sides are compared: a backend whose save or HEAD learns no ETag
    (``None``) proves nothing either way. ETags compare without their optional quotes (S3
    sends ``"…"``, minio strips them), so a save and a load through different libraries agree.
    """
    saved, found = _flat(manifest.identity()), _flat({k: facts[k] for k in manifest.identity() if k in facts})
    notes = []
    changed = [
        f"{k} {saved[k]} → {found[k]}"
        for k in found
        if saved.get(k) is not None and found[k] is not None and _norm(k, found[k]) != _norm(k, saved[k])
    ]
    if changed:
        notes.append(f"the object changed after the save ({', '.join(changed)})")
    if manifest.object != object_name(uri):
        notes.append(f"the manifest names object {manifest.object!r}, not {object_name(uri)!r}")
    return "; ".join(notes)


def _norm(key: str, value: Any) -> Any:
    return value.strip('"') if key == "etag" and isinstance(value, str) else value


def _flat(identity: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in identity.items():
        if isinstance(value, dict):
            out.update(value)
        else:
            out[key] = value
    return out


def check_size(manifest: Manifest, size: int, uri: str, note: str) -> None:
    """Sizes must agree before any data is read; each disagreement has its own error."""
    suffix = f" ({note})" if note else ""
    if size < manifest.size:
        chunk = size // manifest.chunk_size
        raise TruncatedError(
            f"checkpoint {uri!r} is truncated: {size} bytes, its manifest says {manifest.size}; "
            f"first missing byte at offset {size} (chunk {chunk}){suffix}",
            offset=size,
        )
    if size > manifest.size:
        raise ManifestError(
            f"manifest of {uri!r} describes {manifest.size} bytes but the object has {size}: the "
            f"manifest belongs to another checkpoint or the object was replaced after the save{suffix}"
        )


def pieces(spans: Sequence[tuple[int, int]], read_chunk: int) -> Iterator[tuple[int, int]]:
    """(offset, length) of each read: the spans cut into ``read_chunk`` pieces."""
    for start, length in spans:
        for offset in range(start, start + length, read_chunk):
            yield offset, min(read_chunk, start + length - offset)


def truncated(uri: str, offset: int, size: int) -> TruncatedError:
    """A read that got no bytes at ``offset``, before the object's end: it shrank."""
    return TruncatedError(
        f"checkpoint {uri!r} ended at offset {offset} while reading "
        f"(expected {size} bytes): it was truncated during the load",
        offset=offset,
    )


class OrderedReader:
    """Concurrent reads, handed out in order; every buffer is reclaimed on any exit."""

    def __init__(
        self,
        sink: Sink,
        pool: BufferPool,
        *,
        size: int,
        read_chunk: int,
        num_readers: int,
        uri: str,
        spans: Sequence[tuple[int, int]] | None = None,
        landed: Landed | None = None,
    ) -> None:
        """``landed``: work on each read's bytes in that read's task (beside the other reads),
        before it is handed out in order."""
        self.sink, self.pool, self.size, self.read_chunk, self.uri = sink, pool, size, read_chunk, uri
        self.landed = landed
        self.spans = [(0, size)] if spans is None else list(spans)
        self._slots = asyncio.Semaphore(num_readers)
        self._queue: asyncio.Queue[tuple[PoolBuffer, ReadRecord, asyncio.Task[None]] | Exception | None]
        self._queue = asyncio.Queue()
        self._held: set[PoolBuffer] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self.records: list[ReadRecord] = []
        self._dispatcher = asyncio.create_task(self._dispatch(), name="asyncckpt-read-dispatch")

    async def _dispatch(self) -> None:
        try:
            await self._issue_reads()
        except Exception as exc:  # hand the failure to the consumer, which awaits the queue
            self._queue.put_nowait(exc)
            return
        self._queue.put_nowait(None)

    async def _issue_reads(self) -> None:
        for index, (offset, nbytes) in enumerate(pieces(self.spans, self.read_chunk)):
            t0 = now()
            buf = await self.pool.acquire()
            self._held.add(buf)
            rec = ReadRecord(index, offset, nbytes, t_acquire=t0)
            rec.wait_free_s = now() - t0
            await self._slots.acquire()
            task = asyncio.create_task(self._read(buf, rec), name=f"asyncckpt-read-{index}")
            self._tasks.append(task)
            self.records.append(rec)
            self._queue.put_nowait((buf, rec, task))

    async def _read(self, buf: PoolBuffer, rec: ReadRecord) -> None:
        try:
            rec.t_read_start = now()
            got = await read_full(self.sink.read_into, rec.offset, buf.view[: rec.nbytes])
            if got < rec.nbytes:  # zero bytes before the end: the object shrank
                raise truncated(self.uri, rec.offset + got, self.size)
            rec.t_read_end = now()
            rec.read_s = rec.t_read_end - rec.t_read_start
        finally:
            self._slots.release()
        if self.landed is not None:  # the buffer, not the read slot, is held meanwhile
            await self.landed(rec, buf.view[: rec.nbytes])

    async def next(self) -> tuple[PoolBuffer, ReadRecord] | None:
        """The next chunk in object order, once its read completed (None at the end)."""
        item = await self._queue.get()
        if item is None:
            return None
        if isinstance(item, Exception):
            raise item
        buf, rec, task = item
        t0 = now()
        await task
        rec.wait_data_s = now() - t0
        return buf, rec

    def release(self, buf: PoolBuffer) -> None:
        self._held.discard(buf)
        self.pool.release(buf)

    async def aclose(self) -> None:
        """Stop issuing reads, wait for those in flight (threads finish), reclaim buffers."""
        self._dispatcher.cancel()
        for task in self._tasks:
            task.cancel()
        pending = [self._dispatcher, *self._tasks]
        while True:
            try:
                await asyncio.gather(*pending, return_exceptions=True)
                break
            except asyncio.CancelledError:  # keep waiting: buffers must not be reused early
                continue
        self.pool.reclaim(list(self._held))
        self._held.clear()


async def pinpoint(
    bad: Mismatch, manifest: Manifest, sink: Sink, executor: Executor, *, threads: int
) -> Mismatch:
    """For a CRC mismatch in synthetic data, re-read the chunk and regenerate to find the byte."""
    if bad.offset is not None or manifest.generator not in SYNTHETIC or manifest.seed is None:
        return bad
    import mmap

    start, length = manifest.chunk_span(bad.chunk)
    scratch = mmap.mmap(-1, length)
    view = memoryview(scratch)
    regen = RegenerateVerifier(manifest, threads=threads)
    try:
        if await read_full(sink.read_into, start, view) < length:
            return bad
        regen.position = start
        found, _ = await run_blocking(executor, regen.check_sync, start, view[:length])
        return found if found is not None else bad
    finally:
        regen.close()
        view.release()
        close_mapping(scratch)


def mismatch_error(
    bad: Mismatch, manifest: Manifest, uri: str, mode: str, note: str
) -> ChecksumMismatchError:
    start, length = manifest.chunk_span(bad.chunk)
    where = (
        f"first bad byte at offset {bad.offset}"
        if bad.offset is not None
        else f"somewhere in bytes {start}..{start + length - 1} (caller data: the exact byte is unknown)"
    )
    how = (
        "CRC32C differs from the manifest"
        if mode == "checksum"
        else "bytes differ from the regenerated stream"
    )
    suffix = f"; {note}" if note else ""
    return ChecksumMismatchError(
        f"checkpoint {uri!r} is corrupt in chunk {bad.chunk} of {manifest.chunks}: {how}; {where}{suffix}",
        chunk=bad.chunk,
        offset=bad.offset if bad.offset is not None else start,
    )


async def stream_views(
    *,
    uri: str,
    sink: Sink,
    pool: BufferPool,
    executor: Executor,
    manifest: Manifest,
    verifier: Verifier | None,
    state: LoadState,
    read_chunk: int,
    num_readers: int,
    threads: int,
    progress: Callable[[int], None] | None = None,
    deliver: Deliver | None = None,
) -> AsyncGenerator[memoryview, None]:
    """Yield the object's bytes in order, verified; each view is valid until the next one.
    ``deliver`` gets each view first, once it verified: as each read lands, several at once,
    when every read holds whole checksum blocks (a partial read of a state object, whose
    blocks are checked one by one), else in order in the verification's thread hop."""
    if state.size == 0:
        raise TargetNotFoundError(errno.ENOENT, f"{uri!r}: size unknown (open the load first)")
    spans = state.spans if state.spans is not None else [(0, state.size)]
    beside = deliver is not None and (
        verifier is None or (isinstance(verifier, BlockVerifier) and verifier.whole_reads(spans, read_chunk))
    )
    found: dict[int, Mismatch] = {}
    blocks = verifier if isinstance(verifier, BlockVerifier) else None
    batches = Batched.plan(spans, read_chunk) if beside and sink.reads_in_batches else []
    if batches and 2 * len(batches) <= sum(map(len, batches)):  # two reads or more a batch
        assert deliver is not None
        state.records = [rec for batch in batches for rec in batch]
        batched = Batched(sink, pool, blocks, deliver, state, progress)
        failed = await batched.run(batches, num_readers)
        if failed is not None:
            state.offset = failed[0].offset
            raise await located(failed[1], verifier, sink, executor, state, threads)
        if verifier is not None:
            await run_blocking(executor, verifier.finish_sync)
        return

    async def landed(rec: ReadRecord, view: memoryview) -> None:
        bad, rec.verify_s, rec.verify_cpu_s = await run_blocking(
            executor, check_whole_then_deliver, blocks, deliver, rec.offset, view
        )
        if bad is not None:
            found[rec.index] = bad

    reader = OrderedReader(
        sink,
        pool,
        size=state.size,
        read_chunk=read_chunk,
        num_readers=num_readers,
        uri=uri,
        spans=state.spans,
        landed=landed if beside else None,
    )
    try:
        while (item := await reader.next()) is not None:
            buf, rec = item
            view = buf.view[: rec.nbytes]
            state.offset = rec.offset
            t0 = now()
            bad = found.pop(rec.index, None)
            if not beside and (verifier is not None or deliver is not None):
                bad, rec.verify_s, rec.verify_cpu_s = await run_blocking(
                    executor, check_then_deliver, verifier, deliver, rec.offset, view
                )
            if bad is not None:
                raise await located(bad, verifier, sink, executor, state, threads)
            yield view
            rec.consume_s = now() - t0  # verification + the caller
            with contextlib.suppress(BufferError):  # exported (e.g. to NumPy): cannot enforce
                view.release()  # a view kept past its turn raises instead of showing new bytes
            reader.release(buf)
            if progress is not None:
                notify_progress(progress, rec)
        if verifier is not None:
            await run_blocking(executor, verifier.finish_sync)
    finally:
        await reader.aclose()
        state.records = reader.records


async def located(
    bad: Mismatch, verifier: Verifier | None, sink: Sink, executor: Executor, state: LoadState, threads: int
) -> Exception:
    """The error for a read that did not verify: its first bad byte where it can be found, or
    an error saying the object was replaced meanwhile (then nothing is known to be corrupt)."""
    assert verifier is not None and state.manifest is not None
    with contextlib.suppress(StorageError, StallError):  # cannot ask: the mismatch stands
        await sink.check_unchanged()  # replaced by another save meanwhile: not corrupt
    bad = await pinpoint(bad, state.manifest, sink, executor, threads=threads)
    return mismatch_error(bad, state.manifest, state.uri, verifier.mode, state.identity_note)


class _Stop(Exception):
    """A read did not verify: the rest of its batch is not read."""


class Batched:
    """Reads of whole checksum blocks, each checked and delivered as it lands, for a store whose
    reads are blocking calls (``Sink.reads_in_batches``): ``num_readers`` workers, each holding
    one pool buffer, take batches of consecutive reads (up to ``read_chunk`` bytes) and do each
    batch in one thread hop: read, check, deliver, next. A resharded rank's 4 MiB reads paid two
    hops each on the ordered path (its 2 -> 4 load ran at 0.84-0.89 x a same-world load);
    here a batch of eight pays one. Used only where batches hold two reads or more on average:
    a worker does not read while it checks and copies, so a batch of one big read gives up the
    overlap the ordered path keeps (a 2 -> 1 load lost 5-10 %). The stall watchdog times each
    batch, its checks and copies included. Every buffer is back in the pool, and every thread
    finished, when :meth:`run` returns or raises."""

    def __init__(
        self,
        sink: Sink,
        pool: BufferPool,
        blocks: BlockVerifier | None,
        deliver: Deliver,
        state: LoadState,
        progress: Callable[[int], None] | None,
    ) -> None:
        self.sink, self.pool, self.blocks, self.deliver = sink, pool, blocks, deliver
        self.state, self.progress = state, progress
        self.bad: tuple[ReadRecord, Mismatch] | None = None

    @staticmethod
    def plan(spans: Sequence[tuple[int, int]], read_chunk: int) -> list[list[ReadRecord]]:
        """The reads of ``spans`` (each at most ``read_chunk`` bytes), grouped into batches of
        consecutive reads of at most ``read_chunk`` bytes together."""
        batches: list[list[ReadRecord]] = []
        size = 0
        for index, (offset, n) in enumerate(pieces(spans, read_chunk)):
            rec = ReadRecord(index, offset, n)
            if batches and size + n <= read_chunk:
                batches[-1].append(rec)
                size += n
            else:
                batches.append([rec])
                size = n
        return batches

    async def run(
        self, batches: list[list[ReadRecord]], num_readers: int
    ) -> tuple[ReadRecord, Mismatch] | None:
        """Read every batch; the first read that did not verify (and its mismatch), if any."""
        todo = iter(batches)  # shared: each worker takes the next batch
        try:
            async with asyncio.TaskGroup() as tg:
                for _ in range(min(num_readers, len(batches))):
                    tg.create_task(self._worker(todo))
        except BaseExceptionGroup as group:
            raise unwrap_group(group) from None
        return self.bad

    async def _worker(self, todo: Iterator[list[ReadRecord]]) -> None:
        t0 = now()
        buf = await self.pool.acquire()
        waited = now() - t0
        try:
            for batch in todo:
                if self.bad is not None:
                    return
                batch[0].wait_free_s, waited = waited, 0.0
                if not await self._batch(buf, batch):
                    return
        finally:
            self.pool.release(buf)

    async def _batch(self, buf: PoolBuffer, batch: list[ReadRecord]) -> bool:
        views = [buf.view[: rec.nbytes] for rec in batch]
        mark = now()
        failed: list[tuple[ReadRecord, Mismatch]] = []

        def after(i: int, got: int) -> None:  # in the read's thread
            nonlocal mark
            rec = batch[i]
            rec.t_acquire, rec.t_read_start, rec.t_read_end = mark, mark, now()
            rec.read_s = rec.t_read_end - mark
            if got < rec.nbytes:  # zero bytes before the end: the object shrank
                raise truncated(self.state.uri, rec.offset + got, self.state.size)
            bad, rec.verify_s, rec.verify_cpu_s = check_whole_then_deliver(
                self.blocks, self.deliver, rec.offset, views[i]
            )
            mark = now()
            rec.consume_s = mark - rec.t_read_end
            if bad is not None:
                failed.append((rec, bad))
                raise _Stop

        try:
            reads = [(rec.offset, view) for rec, view in zip(batch, views, strict=True)]
            await self.sink.read_batch(reads, after)
        except _Stop:  # on the loop: of several workers' bad reads, the first in the object
            if self.bad is None or failed[0][0].offset < self.bad[0].offset:
                self.bad = failed[0]
            return False
        finally:
            for view in views:
                with contextlib.suppress(BufferError):  # a store's client may still hold it
                    view.release()
        for rec in batch:
            self.state.offset = rec.offset
            if self.progress is not None:
                notify_progress(self.progress, rec)
        return True


def check_then_deliver(
    verifier: Verifier | None, deliver: Deliver | None, offset: int, view: memoryview
) -> tuple[Mismatch | None, float, float]:
    """Verify a view and, only if it verified, hand it to ``deliver``: one thread hop (each
    costs 0.2-1.5 ms on the reference VM; a resharded rank's many small reads paid two)."""
    bad, seconds, cpu = verifier.check_cpu_sync(offset, view) if verifier is not None else (None, 0.0, 0.0)
    if bad is None and deliver is not None:
        deliver(offset, view, False)
    return bad, seconds, cpu


def check_whole_then_deliver(
    verifier: BlockVerifier | None, deliver: Deliver | None, offset: int, view: memoryview
) -> tuple[Mismatch | None, float, float]:
    """:func:`check_then_deliver` for a read of whole checksum blocks, beside other reads."""
    bad, seconds, cpu = (
        verifier.check_whole_cpu_sync(offset, view) if verifier is not None else (None, 0.0, 0.0)
    )
    if bad is None and deliver is not None:
        deliver(offset, view, True)
    return bad, seconds, cpu


def label_loads(records: list[ReadRecord], readers: int) -> dict[str, int]:
    """I/O-bound unless the consumer (verify + caller) took longer than the reads deliver."""
    counts = {IO: 0, CONSUMER: 0}
    for rec in records:
        rec.bottleneck = CONSUMER if rec.consume_s > rec.read_s / readers else IO
        counts[rec.bottleneck] += 1
    return counts

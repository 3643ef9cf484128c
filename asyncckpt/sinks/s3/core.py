"""The S3 protocol, written once; each client library supplies a handful of primitives.

Two shapes of library exist. *Multipart* libraries (aiobotocore, minio) expose the S3 calls:
:class:`MultipartSink` owns the state machine (upload id, ETags by part number, parts in any
order, one PUT for objects below one part, the part-count check before complete, abort and
what is left for cleanup). *Append* libraries (s3dlio, Mountpoint) expose a stream that
uploads parts itself: :class:`AppendSink` admits writes in offset order, checks the length
before closing and drops the stream to abort. Both learn a missing ETag by one HEAD after
the commit. Every primitive raises the library's own exceptions; :meth:`S3SinkBase.guarded`
is the one boundary that maps them (see ``common.py``).
"""

from __future__ import annotations

import asyncio
import errno
import functools
import os
import time
from abc import abstractmethod
from typing import Any, ClassVar

from ...blocking import run_blocking
from ...errors import StorageError
from ...sources.base import GenSpec, ThreadedSource
from ...sources.spec import source_from_spec
from ..base import InPlaceWrite
from .ahead import Ahead, Placed
from .common import InOrder, S3SinkBase

__all__ = ["AppendSink", "MultipartSink", "Placed"]


class MultipartSink(S3SinkBase):
    """create → upload_part (any order, concurrently) → complete; a PUT below one part."""

    def __init__(self, uri: str, **kwargs: Any) -> None:
        super().__init__(uri, **kwargs)
        self._upload_id: str | None = None
        self._etags: dict[int, str] = {}
        self._small: bytes | None = None

    # -- the primitives a library supplies (foreign exceptions pass through) -----------
    @abstractmethod
    async def _create(self) -> str:
        """Start a multipart upload of this key; return its upload id."""

    @abstractmethod
    async def _upload_part(self, upload_id: str, number: int, body: memoryview) -> str:
        """Upload part ``number``; return its ETag. ``body`` is the pool's memory: it must not
        be kept after this returns."""

    @abstractmethod
    async def _complete(self, upload_id: str, parts: list[tuple[int, str]]) -> str | None:
        """Complete the upload from (part number, ETag) pairs; return the object's ETag."""

    @abstractmethod
    async def _abort(self, upload_id: str) -> None:
        """Abort the upload (its parts are discarded)."""

    # -- the protocol ------------------------------------------------------------------
    async def open(self, size: int) -> None:
        self.layout(size)
        self._etags.clear()
        self._small = None
        if not self.single_put:
            self._upload_id = await self.guarded("create multipart upload for", self._create)

    async def _send(self, number: int, body: memoryview) -> None:
        assert self._upload_id is not None
        started = time.perf_counter()
        etag = await self.guarded(
            f"upload part {number} of", self._upload_part, self._upload_id, number, body
        )
        self.record_part(started)
        self._etags[number] = etag

    async def write_part(self, offset: int, data: memoryview) -> float | None:
        if self.single_put:
            self._small = bytes(data)  # < one part: copied, PUT at complete (invisible until then)
            return None
        parts = self.parts_of(offset, data)
        started = time.perf_counter()
        if len(parts) == 1:
            await self._send(*parts[0])
        else:
            try:
                async with asyncio.TaskGroup() as tg:
                    for number, body in parts:
                        tg.create_task(self._send(number, body))
            except BaseExceptionGroup as group:  # the first part's failure is the cause
                raise group.exceptions[0] from None
        return time.perf_counter() - started

    async def complete(self) -> dict[str, float]:
        started = time.perf_counter()
        if self.single_put:
            return await self._put_small(started)
        if len(self._etags) != self._nparts:
            raise StorageError(
                errno.EIO,
                self.what("complete") + f": {len(self._etags)} of {self._nparts} parts were uploaded",
            )
        assert self._upload_id is not None
        parts = [(n, self._etags[n]) for n in sorted(self._etags)]
        etag = await self.guarded("complete multipart upload of", self._complete, self._upload_id, parts)
        self._upload_id = None
        await self._learn_etag(etag)
        return {"complete_s": time.perf_counter() - started}

    async def abort(self) -> None:
        self._small = None
        upload_id, self._upload_id = self._upload_id, None
        if upload_id is not None:
            await self._abort_quietly(upload_id, self._abort, upload_id)


class AppendSink(S3SinkBase):
    """A stream the library uploads as parts itself, fed strictly in offset order.

    The pipeline issues ``write_part`` calls concurrently and possibly out of order; each
    waits for its turn (:class:`InOrder`), so the stream stays sequential without holding
    pool buffers longer than the library needs them.
    """

    #: whether the library has a single PUT (else small objects go through the stream too)
    has_put: ClassVar[bool] = True
    #: whether the library lends out its own memory to fill (``_generate``): synthetic chunks
    #: are then generated there, with no copy (``begin_generation``)
    generates_in_place: ClassVar[bool] = False

    def __init__(self, uri: str, **kwargs: Any) -> None:
        super().__init__(uri, **kwargs)
        self._stream: Any = None
        self._order = InOrder()
        self._small: bytes | None = None
        self._generator: ThreadedSource | None = None
        #: bytes copied into the library's memory (``_append``) / generated there (``_generate``)
        self.copied_bytes = 0
        self.generated_bytes = 0
        self._generator_facts: dict[str, Any] | None = None
        self._ahead: Ahead | None = None  # generates the chunks after begin_generation
        self._generated_total = 0
        self._generated_checksums = True  # the spec's: take each generated chunk's CRC32C
        #: chunks already generated when their request came (the generating thread runs ahead)
        self.generated_ready_when_asked = 0

    @abstractmethod
    async def _open_stream(self) -> Any:
        """Start the upload; return the stream."""

    @abstractmethod
    def _append(self, data: memoryview) -> None:
        """Append ``data`` to ``self._stream`` (blocking; run in a worker thread). It must not
        keep ``data`` after it returns: copy it into memory the library owns."""

    def _generate(self, source: ThreadedSource, nbytes: int) -> Placed:
        """Fill the next ``nbytes`` of the stream from ``source`` in the library's own memory
        and commit them (blocking; run chunk after chunk in the generating thread of
        :class:`~.ahead.Ahead`); return the committed bytes still readable (they are
        checksummed, then the view is released). Libraries with
        ``generates_in_place`` supply it."""
        raise NotImplementedError(f"{self.backend} does not generate in place")

    @abstractmethod
    async def _close_stream(self) -> str | None:
        """Take ``self._stream`` (set it to None) and complete it; return the ETag if known."""

    @abstractmethod
    async def _drop_stream(self) -> None:
        """Take ``self._stream`` (set it to None) and abort it; return once it is gone."""

    @property
    def single_put(self) -> bool:
        return self.has_put and super().single_put

    async def open(self, size: int) -> None:
        self.layout(size)
        self._order = InOrder()
        self._small = None
        if not self.single_put:
            self._stream = await self.guarded("start upload of", self._open_stream)

    def _timed_append(self, data: memoryview) -> float:
        started = time.perf_counter()
        self._append(data)
        return time.perf_counter() - started

    async def begin_generation(self, spec: GenSpec) -> bool:
        if not self.generates_in_place or self.single_put or self._stream is None or self._order.next:
            return False
        self._generator = await run_blocking(self.executor, source_from_spec, spec)  # starts dgen's pool
        self._generated_total = spec.total_size
        self._generated_checksums = spec.checksums
        self._generator_facts = {**self._generator.describe(), "pid": os.getpid()}
        return True

    async def write_generated(self, offset: int, nbytes: int) -> InPlaceWrite:
        source = self._generator
        if source is None:
            raise RuntimeError("write_generated before begin_generation")
        if self._ahead is None:  # the first request gives the chunk size: the whole layout
            total = self._generated_total
            layout = [(o, min(nbytes, total - o)) for o in range(0, total, nbytes)]
            make = functools.partial(self._generate, source)
            self._ahead = Ahead(make, layout, self.executor, checksums=self._generated_checksums)
        try:
            got = await self.guarded(f"write at offset {offset} of", self._ahead.take, offset, nbytes)
        finally:
            await self._order.advance(nbytes)  # on failure the whole save aborts anyway
        placed = got.placed
        self.generated_bytes += nbytes
        self.generated_ready_when_asked += got.ready_when_asked
        self.part_latency.append(placed.write_s)
        return InPlaceWrite(
            fill_s=placed.fill_s, write_s=placed.write_s, checksum=got.checksum, checksum_s=got.checksum_s
        )

    async def _stop_generating(self) -> None:
        """End the generating threads (before the stream is closed or dropped: they use it)."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            await ahead.stop()

    async def write_part(self, offset: int, data: memoryview) -> float | None:
        if self.single_put:
            self._small = bytes(data)
            return None
        await self._order.wait(offset)
        try:
            elapsed: float = await self.blocking(f"write at offset {offset} of", self._timed_append, data)
        finally:
            await self._order.advance(len(data))  # on failure the whole save aborts anyway
        self.copied_bytes += len(data)
        self.part_latency.append(elapsed)
        return elapsed

    async def complete(self) -> dict[str, float]:
        started = time.perf_counter()
        if self.single_put:
            return await self._put_small(started)
        await self._stop_generating()
        if self._order.next != self._size:
            raise StorageError(
                errno.EIO, self.what("complete") + f": {self._order.next} of {self._size} B written"
            )
        etag = await self.guarded("complete upload of", self._close_stream)
        await self._learn_etag(etag)
        return {"complete_s": time.perf_counter() - started}

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        # the mechanism's own account (tests/test_s3dlio_in_place.py): bytes that reached the
        # library by a copy into its memory vs bytes generated there
        out["copied_into_library_bytes"] = self.copied_bytes
        out["generated_in_library_bytes"] = self.generated_bytes
        if self._generator_facts is not None:  # the generator that ran here (its own thread pool)
            out["generated_in_library_by"] = self._generator_facts
            out["generated_ready_when_asked"] = self.generated_ready_when_asked
        return out

    async def abort(self) -> None:
        self._small = None
        try:
            await self._stop_generating()
        finally:
            self._generator = None
        if self._stream is not None:
            try:
                await self._abort_quietly(f"upload of unknown id ({self.backend})", self._drop_stream)
            finally:
                self._stream = None

"""The append protocol, written once for every store whose library uploads parts itself from a
stream (s3dlio, Mountpoint, obstore's writer on any of its stores): writes admitted in offset
order, the length checked before the stream is closed (the commit), the stream dropped to
abort, and synthetic chunks generated in the library's own memory where it lends it
(:mod:`.ahead`). Every primitive raises the library's own exceptions;
:meth:`~.base.ObjectStoreSink.guarded` is the one boundary that maps them.
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
from .base import ObjectStoreSink, S

__all__ = ["AppendSink", "InOrder", "Placed"]


class InOrder:
    """Admits writers strictly by offset, for libraries that only append (s3dlio, Mountpoint).

    The pipeline issues ``write_part`` calls concurrently and possibly out of order; each
    waits here for its turn, so the stream stays sequential without holding pool buffers
    longer than the library needs them.
    """

    def __init__(self) -> None:
        self.next = 0
        self._cond = asyncio.Condition()

    async def wait(self, offset: int) -> None:
        async with self._cond:
            await self._cond.wait_for(lambda: self.next == offset)

    async def advance(self, nbytes: int) -> None:
        async with self._cond:
            self.next += nbytes
            self._cond.notify_all()


class AppendSink(ObjectStoreSink[S]):
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

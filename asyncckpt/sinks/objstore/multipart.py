"""The multipart protocol, written once for every store whose library exposes the calls
(create, upload a numbered part, complete, abort: S3's aiobotocore and minio; Azure's block
blobs and GCS's XML API have the same shape): the upload id, ETags by part number, parts in any
order and concurrently, one PUT for objects below one part, the part-count check before
complete, and what is left for cleanup. Every primitive raises the library's own exceptions;
:meth:`~.base.ObjectStoreSink.guarded` is the one boundary that maps them.
"""

from __future__ import annotations

import asyncio
import errno
import time
from abc import abstractmethod
from typing import Any

from ...errors import StorageError
from .base import ObjectStoreSink, S

__all__ = ["MultipartSink"]


class MultipartSink(ObjectStoreSink[S]):
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

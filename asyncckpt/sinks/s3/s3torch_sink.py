"""s3torchconnector's client ``s3torchconnectorclient`` (Mountpoint over the AWS CRT; no torch).

``put_object`` returns an append-only stream that the CRT uploads as a multipart upload of
``part_size`` parts and completes at ``close()``; dropping it unclosed aborts. Writes are
admitted in offset order (:class:`InOrder`); the binding accepts only ``bytes``, so each
chunk is copied once and the pool's buffer is free when ``write_part`` returns. The CRT
reads credentials from the environment, so the resolved settings are exported there (see
:func:`export_to_environment`). Objects below one part still go through the stream: the
library exposes no single PUT.
"""

from __future__ import annotations

import asyncio
import errno
import time
from typing import Any

from ..._blocking import run_blocking
from ...errors import MissingDependencyError, StorageError
from .common import InOrder, S3SinkBase, export_to_environment, log, storage_error
from .sigv4 import upload_ids

try:
    from s3torchconnectorclient._mountpoint_s3_client import MountpointS3Client, S3Exception
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise MissingDependencyError(
        "s3torchconnectorclient", "s3torchconnector", "backend 's3torchconnector' (s3://)"
    ) from exc


ABORT_WAIT_S = 10.0  # how long abort() waits for the CRT's background abort to show
#: Mountpoint's answer to a write or close after the upload failed in the background: it
#: drops that failure (a part's 503, say) and reports only this (mountpoint-s3-client 0.14)
LOST_CAUSE_MARKERS = ("AWS_ERROR_S3_REQUEST_HAS_COMPLETED", "previous write operation did not complete")
LOST_CAUSE_HINT = (
    " (the upload had already failed in the background; Mountpoint drops that first failure, so "
    "its cause — e.g. a part refused with 503 by a full or overloaded store — is not known here)"
)


class S3TorchSink(S3SinkBase):
    """``s3://bucket/key`` through ``MountpointS3Client``."""

    backend = "s3torchconnector"
    default_in_flight = 2

    def __init__(self, uri: str, **kwargs: Any) -> None:
        super().__init__(uri, **kwargs)
        self._client: Any = None
        self._stream: Any = None
        self._order = InOrder()

    def _s3(self) -> Any:
        if self._client is None:
            s = self.settings
            export_to_environment(s)
            self._client = MountpointS3Client(
                s.region,
                endpoint=s.endpoint_url,
                force_path_style=s.path_style,
                part_size=self.part_size or 8 << 20,
                max_attempts=s.max_attempts,
                unsigned=False,
            )
        return self._client

    def _map(self, exc: BaseException, action: str) -> StorageError:
        text = str(exc)
        low = text.lower()
        if any(m in text for m in LOST_CAUSE_MARKERS):
            text += LOST_CAUSE_HINT
        code = text
        if "403" in text or "forbidden" in low or "access denied" in low or "signature" in low:
            code = "AccessDenied"
        elif "nosuchbucket" in low or "no such bucket" in low or "not found" in low or "404" in text:
            code = "NotFound"
        elif "connect" in low or "io error" in low:
            return storage_error("", f"cannot reach the endpoint ({text})", self.what(action), self.settings)
        return storage_error(code, f"{type(exc).__name__}: {text}", self.what(action), self.settings)

    async def _run(self, action: str, fn: Any, *args: Any) -> Any:
        try:
            return await run_blocking(self.executor, fn, *args)
        except (S3Exception, OSError, ValueError) as exc:
            raise self.first_cause(exc if isinstance(exc, StorageError) else self._map(exc, action)) from None

    async def open(self, size: int) -> None:
        self.layout(size)
        self._order = InOrder()
        self._stream = await self._run(
            "start upload of", lambda: self._s3().put_object(self.bucket, self.key)
        )

    def _write_sync(self, data: memoryview) -> float:
        started = time.perf_counter()
        self._stream.write(bytes(data))  # the binding takes only bytes: one copy
        return time.perf_counter() - started

    async def write_part(self, offset: int, data: memoryview) -> float | None:
        await self._order.wait(offset)
        try:
            elapsed: float = await self._run(f"write at offset {offset} of", self._write_sync, data)
        finally:
            await self._order.advance(len(data))
        self.part_latency.append(elapsed)
        return elapsed

    async def complete(self) -> dict[str, float]:
        started = time.perf_counter()
        if self._order.next != self._size:
            raise StorageError(
                errno.EIO, self.what("complete") + f": {self._order.next} of {self._size} B written"
            )
        stream, self._stream = self._stream, None
        await self._run("complete upload of", stream.close)
        # close() returns no ETag; one HEAD learns it, so a load can tell a replaced object. The
        # object is published by now: a failed HEAD only loses that check, not the save
        try:
            await self.size()
        except StorageError as exc:
            log.warning("saved, but its ETag is unknown (a replaced object goes unnoticed): %s", exc)
        return {"complete_s": time.perf_counter() - started}

    async def abort(self) -> None:
        stream, self._stream = self._stream, None
        if stream is None:
            return
        del stream  # the last reference: Mountpoint aborts an unclosed upload when dropped
        await self._wait_aborted()

    async def _wait_aborted(self) -> None:
        """Return once no upload of this key is listed: the CRT aborts in the background.

        Dropping the stream only *starts* the abort (on Swift the upload stayed listed for
        ≈ 0.15-0.2 s); the sink contract is that nothing is left once ``abort`` returns, so
        poll ListMultipartUploads (signed here: the binding cannot list uploads) up to
        :data:`ABORT_WAIT_S`. An upload of the same key left by someone else is reported for
        cleanup, never deleted.
        """
        deadline = time.monotonic() + ABORT_WAIT_S
        delay = 0.02
        while True:
            try:
                left = await run_blocking(self.executor, upload_ids, self.settings, self.bucket, self.key)
            except (OSError, ValueError) as exc:  # no explicit credentials, or the server is gone
                log.info("cannot confirm the abort of s3://%s/%s: %s", self.bucket, self.key, exc)
                return
            if not left:
                return
            if time.monotonic() >= deadline:
                self.cleanup_needed = ", ".join(left)
                log.warning(
                    "upload(s) %s of s3://%s/%s still listed %.0f s after the abort; "
                    "list_multipart_uploads shows them for cleanup",
                    self.cleanup_needed,
                    self.bucket,
                    self.key,
                    ABORT_WAIT_S,
                )
                return
            await asyncio.sleep(delay)  # polling the server's state, bounded by the deadline
            delay = min(delay * 2, 0.5)

    def _read_sync(self, offset: int, buf: memoryview) -> int:
        n = 0
        for piece in self._s3().get_object(self.bucket, self.key, offset, offset + len(buf)):
            take = min(len(piece), len(buf) - n)
            buf[n : n + take] = piece[:take]
            n += take
        return n

    async def read_into(self, offset: int, buf: memoryview) -> int:
        if not len(buf) or offset >= await self.known_size():
            return 0
        result: int = await self._run("read", self._read_sync, offset, buf)
        return result

    async def _head_size(self) -> int:
        info = await self._run("stat", lambda: self._s3().head_object(self.bucket, self.key))
        self.etag = info.etag
        return int(info.size)

    async def delete(self) -> None:
        self._object_size = None
        await self._run("delete", lambda: self._s3().delete_object(self.bucket, self.key))

    async def aclose(self) -> None:
        await self.abort()
        self._client = None

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out["single_put"] = False
        out["parts"] = -(-self._size // self.part_size) if self.part_size else 0
        out["payload_signing"] = "CRT default (signed)"
        out["part_latency_note"] = "time to hand a chunk to the CRT stream"
        return out

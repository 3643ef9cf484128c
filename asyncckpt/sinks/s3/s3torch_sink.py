"""s3torchconnector's client ``s3torchconnectorclient`` (Mountpoint over the AWS CRT; no torch).

``put_object`` returns an append-only stream that the CRT uploads as a multipart upload of
``part_size`` parts and completes at ``close()``; dropping it unclosed aborts. Writes are
admitted in offset order (:class:`AppendSink`); the binding accepts only ``bytes``, so each
chunk is copied once and the pool's buffer is free when ``write_part`` returns. The CRT
reads credentials from the environment, so the resolved settings are exported there (see
:func:`export_to_environment`). Objects below one part still go through the stream: the
library exposes no single PUT.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from ...blocking import run_blocking
from ...errors import AsyncCkptError, MissingDependencyError
from .common import ErrorFields, export_to_environment, fields_from_text, log
from .core import AppendSink
from .sigv4 import upload_ids

try:
    from s3torchconnectorclient._mountpoint_s3_client import MountpointS3Client
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


class S3TorchSink(AppendSink):
    """``s3://bucket/key`` through ``MountpointS3Client``."""

    backend = "s3torchconnector"
    default_in_flight = 2
    has_put = False  # the binding has no single PUT: small objects go through the stream

    def __init__(self, uri: str, **kwargs: Any) -> None:
        super().__init__(uri, **kwargs)

    def _s3(self) -> Any:
        """One Mountpoint client (a CRT connection pool) for every object of the store."""
        return self.shared.get(("mountpoint", self.part_size), self._build)

    def _build(self) -> Any:
        s = self.settings
        export_to_environment(s)
        return MountpointS3Client(
            s.region,
            endpoint=s.endpoint_url,
            force_path_style=s.path_style,
            part_size=self.part_size or 8 << 20,
            max_attempts=s.max_attempts,
            unsigned=False,
        )

    def error_fields(self, exc: Exception) -> ErrorFields | None:
        if isinstance(exc, AsyncCkptError):
            return None  # asyncckpt's own
        fields = fields_from_text(exc, unreachable_markers=("connect", "io error"))
        if any(m in str(exc) for m in LOST_CAUSE_MARKERS):
            return ErrorFields(fields.code, fields.message + LOST_CAUSE_HINT, fields.status)
        return fields

    async def _call(self, fn: Any, *args: Any) -> Any:
        return await run_blocking(self.executor, fn, *args)

    async def _open_stream(self) -> Any:
        return await self._call(lambda: self._s3().put_object(self.bucket, self.key))

    def _append(self, data: memoryview) -> None:
        self._stream.write(bytes(data))  # the binding takes only bytes: one copy

    async def _close_stream(self) -> str | None:
        stream, self._stream = self._stream, None
        await self._call(stream.close)
        return None  # close() returns no ETag: one HEAD learns it

    async def _drop_stream(self) -> None:
        self._stream = None  # the last reference: Mountpoint aborts an unclosed upload when dropped
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

    async def _put(self, data: bytes) -> str | None:  # pragma: no cover - has_put is False
        raise NotImplementedError("Mountpoint's binding has no single PUT")

    def _read_sync(self, offset: int, buf: memoryview) -> int:
        n = 0
        for piece in self._s3().get_object(self.bucket, self.key, offset, offset + len(buf)):
            take = min(len(piece), len(buf) - n)
            buf[n : n + take] = piece[:take]
            n += take
        return n

    async def _get(self, offset: int, buf: memoryview) -> int:
        n: int = await self._call(self._read_sync, offset, buf)
        return n

    async def _head(self) -> tuple[int, str | None]:
        info = await self._call(lambda: self._s3().head_object(self.bucket, self.key))
        return int(info.size), info.etag

    async def _delete(self) -> None:
        await self._call(lambda: self._s3().delete_object(self.bucket, self.key))

    async def _list(self, prefix: str) -> list[str]:
        def keys() -> list[str]:
            pages = self._s3().list_objects(self.bucket, prefix)
            return [info.key for page in pages for info in page.object_info]

        listed: list[str] = await self._call(keys)
        return listed

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out["single_put"] = False
        out["parts"] = -(-self._size // self.part_size) if self.part_size else 0
        out["payload_signing"] = "CRT default (signed)"
        out["part_latency_note"] = "time to hand a chunk to the CRT stream"
        return out

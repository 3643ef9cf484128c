"""minio-py: its multipart calls, each blocking one worker thread per part in flight.

``put_object`` with a stream would read the whole object itself (its own buffers and
threads); the multipart primitives (``_create_multipart_upload`` / ``_upload_part`` /
``_complete_multipart_upload`` / ``_abort_multipart_upload``, stable since minio 7.0) let the
pipeline's buffers go straight into requests, bounded by the pipeline's window. minio signs
the payload (SHA-256) over plain HTTP and sends UNSIGNED-PAYLOAD over HTTPS; that is the
library's choice and is recorded in the result.
"""

from __future__ import annotations

import errno
import io
import time
from typing import Any
from urllib.parse import urlsplit

from ..._blocking import run_blocking
from ...errors import MissingDependencyError, StorageError
from .common import S3SinkBase, log, storage_error

try:
    import urllib3
    from minio import Minio
    from minio.datatypes import Part
    from minio.error import MinioException, S3Error
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise MissingDependencyError("minio", "minio", "backend 'minio' (s3://)") from exc


class MinioSink(S3SinkBase):
    """``s3://bucket/key`` through minio-py."""

    backend = "minio"
    default_in_flight = 4

    def __init__(self, uri: str, **kwargs: Any) -> None:
        super().__init__(uri, **kwargs)
        s = self.settings
        ep = urlsplit(s.endpoint_url or "https://s3.amazonaws.com")
        http = urllib3.PoolManager(
            maxsize=max(10, s.max_in_flight * 2),
            cert_reqs="CERT_REQUIRED" if ep.scheme == "https" else "CERT_NONE",
            ca_certs=s.ca_bundle,
            # read: each socket wait once connected (sending a part included)
            timeout=urllib3.Timeout(connect=s.connect_timeout, read=s.request_timeout),
            retries=urllib3.Retry(
                total=s.max_attempts - 1, backoff_factor=0.2, status_forcelist=(500, 502, 503, 504)
            ),
        )
        self._http = http
        self._client = Minio(
            ep.netloc,
            access_key=s.access_key_id,
            secret_key=s.revealed("secret_access_key"),
            session_token=s.revealed("session_token"),
            secure=ep.scheme == "https",
            region=s.region,
            http_client=http,
        )
        self._upload_id: str | None = None
        self._etags: dict[int, str] = {}
        self._small: bytes | None = None

    def _map(self, exc: Exception, action: str) -> StorageError:
        if isinstance(exc, S3Error):
            return storage_error(
                exc.code or "", f"{exc.code}: {exc.message}", self.what(action), self.settings
            )
        if isinstance(exc, urllib3.exceptions.HTTPError):
            return storage_error(
                "",
                f"cannot reach the endpoint ({type(exc).__name__}: {exc})",
                self.what(action),
                self.settings,
            )
        return storage_error("", f"{type(exc).__name__}: {exc}", self.what(action), self.settings)

    async def _run(self, action: str, fn: Any, *args: Any) -> Any:
        try:
            return await run_blocking(self.executor, fn, *args)
        except (MinioException, urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            raise self.first_cause(exc if isinstance(exc, StorageError) else self._map(exc, action)) from None

    async def open(self, size: int) -> None:
        self.layout(size)
        self._etags.clear()
        self._small = None
        if not self.single_put:
            headers = {"Content-Type": "application/octet-stream"}
            self._upload_id = await self._run(
                "create multipart upload for",
                self._client._create_multipart_upload,
                self.bucket,
                self.key,
                headers,
            )

    def _upload_sync(self, number: int, body: memoryview) -> None:
        started = time.perf_counter()
        assert self._upload_id is not None
        # typed as bytes, but the body only goes to hashlib and urllib3, which take any buffer
        etag = self._client._upload_part(self.bucket, self.key, body, None, self._upload_id, number)  # type: ignore[arg-type]
        self.record_part(started)
        self._etags[number] = etag

    async def write_part(self, offset: int, data: memoryview) -> float | None:
        if self.single_put:
            self._small = bytes(data)
            return None
        started = time.perf_counter()
        for number, body in self.parts_of(offset, data):
            await self._run(f"upload part {number} of", self._upload_sync, number, body)
        return time.perf_counter() - started

    async def complete(self) -> dict[str, float]:
        started = time.perf_counter()
        if self.single_put:
            if self._small is None:
                raise StorageError(errno.EIO, self.what("complete") + ": object data was not written")
            small, self._small = self._small, None
            result = await self._run(
                "put", self._client.put_object, self.bucket, self.key, io.BytesIO(small), len(small)
            )
            self.etag = result.etag
            return {"put_s": time.perf_counter() - started}
        if len(self._etags) != self._nparts:
            raise StorageError(
                errno.EIO, self.what("complete") + f": {len(self._etags)} of {self._nparts} parts uploaded"
            )
        parts = [Part(n, self._etags[n]) for n in sorted(self._etags)]
        result = await self._run(
            "complete multipart upload of",
            self._client._complete_multipart_upload,
            self.bucket,
            self.key,
            self._upload_id,
            parts,
        )
        self._upload_id = None
        self.etag = result.etag
        return {"complete_s": time.perf_counter() - started}

    async def abort(self) -> None:
        self._small = None
        upload_id, self._upload_id = self._upload_id, None
        if upload_id is None:
            return
        try:
            await self._run(
                "abort multipart upload of",
                self._client._abort_multipart_upload,
                self.bucket,
                self.key,
                upload_id,
            )
        except StorageError as exc:
            self.cleanup_needed = upload_id
            log.warning(
                "could not abort upload %s; list_multipart_uploads shows it for cleanup: %s", upload_id, exc
            )

    def _read_sync(self, offset: int, buf: memoryview) -> int:
        response = self._client.get_object(self.bucket, self.key, offset, len(buf))
        try:
            n = 0
            for piece in response.stream(1 << 20):
                buf[n : n + len(piece)] = piece
                n += len(piece)
            return n
        finally:
            response.close()
            response.release_conn()

    async def read_into(self, offset: int, buf: memoryview) -> int:
        if not len(buf) or offset >= await self.known_size():
            return 0
        result: int = await self._run("read", self._read_sync, offset, buf)
        return result

    async def _head_size(self) -> int:
        stat = await self._run("stat", self._client.stat_object, self.bucket, self.key)
        self.etag = stat.etag  # the load compares it with the saved one
        return int(stat.size)

    async def delete(self) -> None:
        self._object_size = None
        await self._run("delete", self._client.remove_object, self.bucket, self.key)

    async def aclose(self) -> None:
        await self.abort()
        self._http.clear()

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out["payload_signing"] = "minio default: SHA-256 over http, unsigned over https"
        return out

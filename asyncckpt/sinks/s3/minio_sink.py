"""minio-py: its multipart calls, each blocking one worker thread per part in flight.

``put_object`` with a stream would read the whole object itself (its own buffers and
threads); the multipart primitives (``_create_multipart_upload`` / ``_upload_part`` /
``_complete_multipart_upload`` / ``_abort_multipart_upload``, stable since minio 7.0) let the
pipeline's buffers go straight into requests, bounded by the pipeline's window. minio signs
the payload (SHA-256) over plain HTTP and sends UNSIGNED-PAYLOAD over HTTPS; that is the
library's choice and is recorded in the result.
"""

from __future__ import annotations

import functools
import io
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import urlsplit

from ...blocking import run_blocking
from ...errors import MissingDependencyError
from .common import ErrorFields
from .core import MultipartSink

if TYPE_CHECKING:
    import urllib3
    from minio import Minio


class _Library(NamedTuple):
    urllib3: Any
    Minio: Any
    Part: Any
    MinioException: Any
    S3Error: Any


@functools.cache
def _minio() -> _Library:
    """minio (and urllib3), imported on first use: 0.2 s, and this module is imported for the
    class's capabilities when a configuration is checked, on the caller's loop; a checkpointer
    imports the library in a thread (``import_library``)."""
    try:
        import urllib3
        from minio import Minio
        from minio.datatypes import Part
        from minio.error import MinioException, S3Error
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise MissingDependencyError("minio", "minio", "backend 'minio' (s3://)") from exc
    return _Library(urllib3, Minio, Part, MinioException, S3Error)


class MinioSink(MultipartSink):
    """``s3://bucket/key`` through minio-py: each blocking call in a worker thread."""

    backend = "minio"
    pins_version = True
    default_in_flight = 4

    @classmethod
    def import_library(cls) -> None:
        _minio()

    @property
    def _client(self) -> Minio:
        """The store's one client, made on first use (a sink is made before ``import_library``
        ran in a thread for ``iter_load``: building the client in ``__init__`` imported minio)."""
        client: Minio = self.shared.get("minio", self._build, close=lambda c: c[1].clear())[0]
        return client

    def _build(self) -> tuple[Minio, urllib3.PoolManager]:
        """One client and connection pool for every object of the store."""
        s = self.settings
        ep = urlsplit(s.endpoint_url or "https://s3.amazonaws.com")
        lib = _minio()
        http = lib.urllib3.PoolManager(
            maxsize=max(10, s.max_in_flight * 2),
            cert_reqs="CERT_REQUIRED" if ep.scheme == "https" else "CERT_NONE",
            ca_certs=s.ca_bundle,
            # read: each socket wait once connected (sending a part included)
            timeout=lib.urllib3.Timeout(connect=s.connect_timeout, read=s.request_timeout),
            retries=lib.urllib3.Retry(
                total=s.max_attempts - 1, backoff_factor=0.2, status_forcelist=(500, 502, 503, 504)
            ),
        )
        client = lib.Minio(
            ep.netloc,
            access_key=s.access_key_id,
            secret_key=s.revealed("secret_access_key"),
            session_token=s.revealed("session_token"),
            secure=ep.scheme == "https",
            region=s.region,
            http_client=http,
        )
        return client, http

    def error_fields(self, exc: Exception) -> ErrorFields | None:
        lib = _minio()
        if isinstance(exc, lib.S3Error):
            status = exc.response.status if exc.response is not None else None
            return ErrorFields(exc.code or "", f"{exc.code}: {exc.message}", status)
        if isinstance(exc, lib.urllib3.exceptions.HTTPError):
            return ErrorFields(message=f"{type(exc).__name__}: {exc}", unreachable=True)
        if isinstance(exc, (lib.MinioException, ValueError)):
            return ErrorFields(message=f"{type(exc).__name__}: {exc}")
        return super().error_fields(exc)

    async def _call(self, fn: Any, *args: Any) -> Any:
        return await run_blocking(self.executor, fn, *args)

    async def _create(self) -> str:
        headers = {"Content-Type": "application/octet-stream"}
        upload_id: str = await self._call(
            self._client._create_multipart_upload, self.bucket, self.key, headers
        )
        return upload_id

    async def _upload_part(self, upload_id: str, number: int, body: memoryview) -> str:
        # typed as bytes, but the body only goes to hashlib and urllib3, which take any buffer
        etag: str = await self._call(
            self._client._upload_part, self.bucket, self.key, body, None, upload_id, number
        )
        return etag

    async def _complete(self, upload_id: str, parts: list[tuple[int, str]]) -> str | None:
        listed = [_minio().Part(n, etag) for n, etag in parts]
        result = await self._call(
            self._client._complete_multipart_upload, self.bucket, self.key, upload_id, listed
        )
        return result.etag  # type: ignore[no-any-return]

    async def _abort(self, upload_id: str) -> None:
        await self._call(self._client._abort_multipart_upload, self.bucket, self.key, upload_id)

    async def _put(self, data: bytes) -> str | None:
        result = await self._call(self._client.put_object, self.bucket, self.key, io.BytesIO(data), len(data))
        return result.etag  # type: ignore[no-any-return]

    def _read_sync(self, client: Minio, offset: int, buf: memoryview) -> int:
        pin = self.read_pin()
        headers: dict[str, str | list[str] | tuple[str]] | None = {"If-Match": pin} if pin else None
        response = client.get_object(self.bucket, self.key, offset, len(buf), request_headers=headers)
        try:
            n = 0
            for piece in response.stream(1 << 20):
                buf[n : n + len(piece)] = piece
                n += len(piece)
            return n
        finally:
            response.close()
            response.release_conn()

    async def _get(self, offset: int, buf: memoryview) -> int:
        n: int = await self._call(self._read_sync, self._client, offset, buf)  # made on the loop
        return n

    async def _head(self) -> tuple[int, str | None]:
        stat = await self._call(self._client.stat_object, self.bucket, self.key)
        return int(stat.size), stat.etag

    async def _delete(self) -> None:
        await self._call(self._client.remove_object, self.bucket, self.key)

    async def _list(self, prefix: str) -> list[str]:
        client = self._client  # made here, on the loop, never by two threads at once

        def keys() -> list[str]:
            found = client.list_objects(self.bucket, prefix=prefix, recursive=True)
            return [o.object_name for o in found]

        listed: list[str] = await self._call(keys)
        return listed

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out["payload_signing"] = "minio default: SHA-256 over http, unsigned over https"
        return out

"""aiobotocore: native asyncio multipart upload, one ``upload_part`` per pipeline write.

aiobotocore has no managed transfer, so this is the whole protocol: create → upload_part
(the pipeline's ``max_in_flight`` writers form the sliding window; ``write_part`` returns only
once its part is stored, so the pool may reuse the buffer) → complete; abort on any error or
cancellation. botocore's first client loads large JSON models; that happens once per
process in a worker thread, so the event loop never stalls on it.

Several endpoints (front ends of one store, see ``asyncckpt.sinks.s3.endpoints``): one client per
endpoint, made when the endpoint is first used; each ``upload_part`` and each range GET goes through
the :class:`EndpointRouter` (strategy, failover to another endpoint, per-endpoint statistics);
create/complete/abort/HEAD/DELETE go to one endpoint, the next one when it is unreachable.
With one endpoint none of this runs.

A part goes from the pool's memory to the socket without a copy: the body is a
:class:`~.part_body.PartBody` (aiohttp would otherwise copy a plain ``memoryview`` up to three
times on the event-loop thread, see ``part_body.py``). The options keep the request botocore
would send: ``payload_signing`` hands botocore the ``memoryview`` to hash (SHA-256 on the loop
thread, by botocore), ``checksums="when_supported"`` sends the CRC32 botocore would add, but
computed in a worker thread and given as ``ChecksumCRC32`` (botocore then skips its own).

Retries are asyncckpt's, never botocore's (see ``_retries``): botocore must rewind a body to
resend it, and the pool's memoryview (zero-copy) cannot be rewound. A transient failure
(connection reset or refused, timeout, 5xx, throttling) is retried as a fresh request with the
same buffer: on another endpoint by the router, or on the one endpoint by ``_retrying``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import random
import threading
import zlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from ...blocking import run_blocking
from ...errors import MissingDependencyError
from .common import ErrorFields, log
from .core import MultipartSink
from .endpoints import is_failover_error
from .log_guard import guard_botocore_logs
from .part_body import part_body_class

if TYPE_CHECKING:
    from aiobotocore.session import AioSession


class _Library(NamedTuple):
    AioConfig: Any
    get_session: Callable[[], AioSession]
    ClientError: Any
    EndpointConnectionError: Any
    PartBody: Any


@functools.cache
def _aiobotocore() -> _Library:
    """aiobotocore (with aiohttp and the part body), imported on first use: 0.4 s, and this
    module is imported for the class's capabilities when a configuration is checked, on the
    caller's loop; a checkpointer imports the library in a thread (``import_library``)."""
    try:
        from aiobotocore.config import AioConfig
        from aiobotocore.session import get_session
        from botocore.exceptions import ClientError, EndpointConnectionError
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise MissingDependencyError("aiobotocore", "aiobotocore", "backend 'aiobotocore' (s3://)") from exc
    return _Library(AioConfig, get_session, ClientError, EndpointConnectionError, part_body_class())


T = TypeVar("T")
_session: AioSession | None = None
_session_lock = threading.Lock()
#: error codes botocore's standard retry mode treats as transient or throttling (some are 4xx)
_TRANSIENT_CODES = frozenset(
    {
        "RequestTimeout",
        "RequestTimeoutException",
        "PriorRequestNotComplete",
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
    }
)
_BACKOFF_BASE_S = 0.1
_BACKOFF_CAP_S = 5.0


def _server_busy(exc: BaseException) -> bool:
    """A 5xx or 429 answer, or a throttling/timeout code (503 SlowDown, 400 RequestTimeout, ...):
    worth another try, on another endpoint when there are several (not marked down)."""
    if not isinstance(exc, _aiobotocore().ClientError):
        return False
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    code = exc.response.get("Error", {}).get("Code")
    return (isinstance(status, int) and (status >= 500 or status == 429)) or code in _TRANSIENT_CODES


def _backoff(attempt: int) -> float:
    """Seconds before retry ``attempt`` (1, 2, ...): exponential, capped, half of it jittered."""
    step = min(_BACKOFF_CAP_S, _BACKOFF_BASE_S * 2.0 ** (attempt - 1))
    return step / 2 + random.uniform(0, step / 2)


def warm_session() -> AioSession:
    """A process-wide session whose loader has read the S3 model (blocking file I/O)."""
    global _session
    with _session_lock:
        if _session is None:
            session = _aiobotocore().get_session()
            loader = session.get_component("data_loader")
            for name in ("endpoints", "partitions", "_retry", "sdk-default-configuration"):
                with contextlib.suppress(Exception):
                    loader.load_data(name)
            for kind in ("service-2", "endpoint-rule-set-1", "paginators-1", "waiters-2"):
                with contextlib.suppress(Exception):
                    loader.load_service_model("s3", kind)
            _session = session
        return _session


class AiobotocoreSink(MultipartSink):
    """``s3://bucket/key`` through aiobotocore: the S3 calls, retried and routed here."""

    backend = "aiobotocore"
    pins_version = True
    default_in_flight = 4
    per_request_endpoints = True

    @classmethod
    def import_library(cls) -> None:
        _aiobotocore()

    def __init__(self, uri: str, **kwargs: Any) -> None:
        super().__init__(uri, **kwargs)
        self.retries = 0  # asyncckpt's retries on the one endpoint (the router counts its own)

    async def _s3(self, url: str | None) -> Any:
        """The client for endpoint ``url`` (None: AWS default), made on its first use and
        shared by every object of the store."""

        async def make() -> Any:
            session = await run_blocking(self.executor, warm_session)
            return self._new_client(session, url)

        return await self.shared.enter(("aiobotocore", url), make)

    def _retries(self) -> dict[str, Any]:
        """botocore makes one attempt per call; asyncckpt retries (``_retrying``, the router).

        A botocore retry of ``upload_part`` must rewind the body, which the pool's memoryview
        cannot do (UnseekableStreamError), and with several endpoints retrying an unreachable
        one only delays the failover. One policy for every call keeps the counts honest.
        """
        return {"total_max_attempts": 1, "mode": "standard"}

    def _new_client(self, session: AioSession, url: str | None) -> Any:
        s = self.settings
        guard_botocore_logs()  # its DEBUG logs would show the session token
        config = _aiobotocore().AioConfig(
            s3={
                "addressing_style": "path" if s.path_style else "virtual",
                "payload_signing_enabled": s.payload_signing,
            },
            request_checksum_calculation=s.checksums,
            response_checksum_validation="when_required",
            retries=self._retries(),
            connect_timeout=s.connect_timeout,
            read_timeout=s.request_timeout,  # each wait for the server's bytes (aiohttp sock_read)
            max_pool_connections=max(16, s.max_in_flight * 2),
            # botocore's validator only admits bytes/bytearray/file bodies; the request path
            # itself takes the pool's memoryview as is, which saves a copy per part
            parameter_validation=False,
        )
        return session.create_client(
            "s3",
            region_name=s.region,
            endpoint_url=url,
            aws_access_key_id=s.access_key_id,
            aws_secret_access_key=s.revealed("secret_access_key"),
            aws_session_token=s.revealed("session_token"),
            verify=s.ca_bundle,
            config=config,
        )

    def error_fields(self, exc: Exception) -> ErrorFields | None:
        lib = _aiobotocore()
        if isinstance(exc, lib.ClientError):
            err = exc.response.get("Error", {})
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            code = str(err.get("Code", "")) or str(status or "")
            message = f"{code}: {err.get('Message', '') or 'no message'}"
            return ErrorFields(code, message, status if isinstance(status, int) else None)
        if isinstance(exc, lib.EndpointConnectionError):
            return ErrorFields(message=str(exc), unreachable=True)
        return ErrorFields(message=f"{type(exc).__name__}: {exc}")  # aiohttp, timeouts, ...

    async def _raw(self, url: str | None, method: str, **kwargs: Any) -> Any:
        """One botocore call on endpoint ``url``; foreign exceptions pass through."""
        client = await self._s3(url)
        return await getattr(client, method)(Bucket=self.bucket, Key=self.key, **kwargs)

    async def _retrying(self, fn: Callable[[], Awaitable[T]]) -> T:
        """``await fn()`` on the one endpoint, up to ``max_attempts`` times while it fails
        transiently (unreachable, timeout, 5xx, throttling); never after a 4xx like AccessDenied.

        Each retry is a fresh request with the same arguments (a part's memoryview is sent
        again, not copied), counted in ``retries``, after a short exponential backoff.
        """
        attempts = self.settings.max_attempts
        for attempt in range(1, attempts + 1):
            try:
                return await fn()
            except Exception as exc:
                if attempt >= attempts or not (is_failover_error(exc) or _server_busy(exc)):
                    raise
                log.debug("retrying after %s (attempt %d of %d)", type(exc).__name__, attempt, attempts)
            self.retries = (self.retries or 0) + 1
            await asyncio.sleep(_backoff(attempt))
        raise AssertionError("unreachable")  # pragma: no cover

    async def _control(self, method: str, **kwargs: Any) -> Any:
        """A one-off request: retried on the one endpoint, or on one endpoint of several (an
        unreachable one is marked down and the next tried)."""
        if self.router is None:
            url = self.settings.endpoint_url
            return await self._retrying(lambda: self._raw(url, method, **kwargs))
        order = self.router.control_order()
        for i, url in enumerate(order):
            try:
                return await self._raw(url, method, **kwargs)
            except Exception as exc:
                down = is_failover_error(exc)
                if not (down or _server_busy(exc)) or i + 1 == len(order):
                    raise
                if down:
                    self.router.mark_down(url)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _routed(self, fn: Callable[[str | None], Awaitable[T]], nbytes: int) -> T:
        """``fn(endpoint)`` on the one endpoint, or through the router (failover, statistics)."""
        if self.router is None:
            url = self.settings.endpoint_url
            return await self._retrying(lambda: fn(url))
        return await self.router.call(fn, nbytes, retry_on=_server_busy)

    # -- the primitives ----------------------------------------------------------------
    async def _create(self) -> str:
        response = await self._control("create_multipart_upload")
        return str(response["UploadId"])

    async def _upload_part(self, upload_id: str, number: int, body: memoryview) -> str:
        args: dict[str, Any] = {"UploadId": upload_id, "PartNumber": number, "ContentLength": body.nbytes}
        if self.settings.checksums == "when_supported":
            # the CRC32 botocore would add, computed in a worker thread (zlib releases the GIL)
            # rather than by botocore on the event-loop thread; a header already present makes
            # botocore skip its own, so the request is the same and the body stays zero-copy
            crc = await run_blocking(self.executor, zlib.crc32, body)
            args.update(
                ChecksumAlgorithm="CRC32", ChecksumCRC32=base64.b64encode(crc.to_bytes(4, "big")).decode()
            )
        signed = self.settings.payload_signing
        response = await self._routed(
            # a fresh body per attempt; SHA-256 payload signing needs a bytes-like body (botocore
            # hashes it on the loop thread, the cost the option is measured with)
            lambda url: self._raw(
                url, "upload_part", Body=body if signed else _aiobotocore().PartBody(body), **args
            ),
            len(body),
        )
        return str(response["ETag"])

    async def _complete(self, upload_id: str, parts: list[tuple[int, str]]) -> str | None:
        listed = [{"PartNumber": n, "ETag": etag} for n, etag in parts]
        response = await self._control(
            "complete_multipart_upload", UploadId=upload_id, MultipartUpload={"Parts": listed}
        )
        return response.get("ETag")  # type: ignore[no-any-return]

    async def _abort(self, upload_id: str) -> None:
        await self._control("abort_multipart_upload", UploadId=upload_id)

    async def _put(self, data: bytes) -> str | None:
        response = await self._control("put_object", Body=data)
        return response.get("ETag")  # type: ignore[no-any-return]

    async def _get(self, offset: int, buf: memoryview) -> int:
        return await self._routed(lambda url: self._get_from(url, offset, buf), len(buf))

    async def _get_from(self, url: str | None, offset: int, buf: memoryview) -> int:
        """One range GET into ``buf`` (repeatable: a retry elsewhere overwrites from the start)."""
        pin = self.read_pin()
        ranged = {"Range": f"bytes={offset}-{offset + len(buf) - 1}"} | ({"IfMatch": pin} if pin else {})
        response = await self._raw(url, "get_object", **ranged)
        n = 0
        async with response["Body"] as body:
            async for piece in body.iter_chunks(1 << 20):
                buf[n : n + len(piece)] = piece
                n += len(piece)
        return n

    async def _head(self) -> tuple[int, str | None]:
        response = await self._control("head_object")
        return int(response["ContentLength"]), response.get("ETag")

    async def _delete(self) -> None:
        await self._control("delete_object")

    # -- leftovers (asyncckpt.sinks.leftovers) -----------------------------------------------------
    async def _list(self, prefix: str) -> list[str]:
        client = await self._s3(self.settings.endpoint_url)
        args: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix}
        keys: list[str] = []
        while True:  # ListObjectsV2, page by page (1000 keys each)
            page = await client.list_objects_v2(**args)
            keys.extend(o["Key"] for o in page.get("Contents", []))
            if not page.get("IsTruncated"):
                return keys
            args["ContinuationToken"] = page["NextContinuationToken"]

    async def pending_uploads(self) -> list[dict[str, Any]]:
        """Multipart uploads whose key starts with this sink's key (taken as a prefix)."""
        return await self.guarded("list multipart uploads under", self._list_uploads)

    async def _list_uploads(self) -> list[dict[str, Any]]:
        client = await self._s3(self.settings.endpoint_url)
        args: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self.key}
        found: list[dict[str, Any]] = []
        while True:
            page = await client.list_multipart_uploads(**args)
            found.extend(page.get("Uploads", []))
            if not page.get("IsTruncated"):
                return found
            args.update(KeyMarker=page["NextKeyMarker"], UploadIdMarker=page["NextUploadIdMarker"])

    async def abort_upload(self, key: str, upload_id: str) -> None:
        client = await self._s3(self.settings.endpoint_url)
        await self.guarded(
            f"abort upload {upload_id} of s3://{self.bucket}/{key} at",
            lambda: client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id),
        )

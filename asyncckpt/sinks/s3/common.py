"""What every S3 sink shares: target parsing, part layout, statistics, error mapping, ordering.

Foreign exceptions (botocore, minio, s3dlio, Mountpoint) are mapped here to the asyncckpt
hierarchy by their S3 error code or, for libraries that only give text, by the code in the
message. Messages are built from what the sink knows (bucket, key, backend, endpoint) and the
library's error code and text; settings hold secrets as ``Secret``, so none can be part of one.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import re
import time
from abc import abstractmethod
from dataclasses import replace
from typing import Any, ClassVar

from ...endpoints import EndpointRouter
from ...errors import ConfigError, StorageError, StoragePermissionError, TargetNotFoundError
from ...metrics import percentiles
from ..base import Sink
from .config import S3Settings, parse_s3_uri, plan_parts

log = logging.getLogger("asyncckpt")

NOT_FOUND_CODES = ("NoSuchBucket", "NoSuchKey", "NotFound", "NoSuchUpload", "404")
DENIED_CODES = (
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "InvalidClientTokenId",
    "AllAccessDisabled",
    "403",
    "Forbidden",
)


# whole words only: "404" inside a bucket name or request id ("t-96f7ea404ee…") is no status
_NOT_FOUND = re.compile(r"\b(?:" + "|".join(NOT_FOUND_CODES) + r")\b")
_DENIED = re.compile(r"\b(?:" + "|".join(DENIED_CODES) + r")\b")

#: how a 503 looks in each library's error (code or text): S3 throttling, or a full store
UNAVAILABLE_MARKERS = (
    "ServiceUnavailable",
    "Service Unavailable",
    "SlowDown",
    "503 error responses",  # urllib3 (minio) after its retries
    "reduce your request rate",
    "Request throttled",  # Mountpoint (s3torchconnector)
)
UNAVAILABLE_HINT = (
    " (the server answered 503 Service Unavailable after retries: it is out of space or overloaded; "
    "OpenStack Swift reports a full disk this way; free space or lower the request rate)"
)


def storage_error(code: str, message: str, what: str, settings: S3Settings) -> StorageError:
    """The asyncckpt error for an S3 error ``code`` (or free text containing one)."""
    text = f"{what}: {message}"
    if any(m in code or m in message for m in UNAVAILABLE_MARKERS):
        return StorageError(errno.EIO, text + UNAVAILABLE_HINT)
    if _NOT_FOUND.search(code):
        return TargetNotFoundError(errno.ENOENT, text)
    if _DENIED.search(code):
        hint = " (check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN and the bucket policy)"
        return StoragePermissionError(errno.EACCES, text + hint)
    return StorageError(errno.EIO, text)


class S3SinkBase(Sink):
    """One object ``s3://bucket/key``; parts are ``part_size`` slices of ``chunk_size`` buffers."""

    default_in_flight = 4
    #: whether each request may go to a different endpoint (one client per endpoint)
    per_request_endpoints: ClassVar[bool] = False

    def __init__(self, uri: str, **kwargs: Any) -> None:
        super().__init__(uri, **kwargs)
        self.bucket, self.key = parse_s3_uri(uri)
        self.settings = S3Settings.resolve(self.options.extra)
        self.router: EndpointRouter | None = None
        self.endpoint_strategy: str | None = None
        if len(self.settings.endpoints) > 1:
            self._plan_endpoints()
        self.part_size = self.settings.part_size or self.options.chunk_size or 0
        self._size = 0
        self._nparts = 0
        self.part_latency: list[float] = []
        self.retries: int | None = None  # None: the library does not report its retries
        self._object_size: int | None = None  # of the published object, learnt by size()
        self.etag: str | None = None
        self.cleanup_needed: str | None = None  # an upload id an abort could not remove
        self._first_failure: StorageError | None = None  # of the upload in progress

    def _plan_endpoints(self) -> None:
        """Several endpoints: a router for backends that switch per request, else ``rank % N``.

        A per-request strategy asked for explicitly of a backend that cannot do it is an error
        (raised here, before any I/O) rather than a silent downgrade; left at its default, the
        strategy becomes ``rank`` and describe() says why.
        """
        from ...distributed import rank_info_from_env

        s, rank = self.settings, rank_info_from_env().rank
        if self.per_request_endpoints:
            self.router = EndpointRouter(s.endpoints, s.lb_strategy, rank=rank)
            self.endpoint_strategy = s.lb_strategy
            return
        if s.lb_strategy != "rank" and s.lb_strategy_explicit:
            raise ConfigError(
                f"backend {self.backend!r} cannot send each part to a different endpoint, but load-balance "
                f"strategy {s.lb_strategy!r} was requested ({s.sources.get('lb_strategy', 'option')}) for "
                f"{len(s.endpoints)} endpoints; use strategy 'rank' (one endpoint per MPI rank, rank % N) "
                "or backend 'aiobotocore'"
            )
        self.settings = replace(s, endpoint_url=s.endpoints[rank % len(s.endpoints)])
        self.endpoint_strategy = f"rank (per-request balancing not supported by {self.backend})"

    def check(self) -> None:
        if self.part_size:
            plan_parts(max(self.part_size, 1), self.part_size, self.options.chunk_size)

    @abstractmethod
    async def _head_size(self) -> int:
        """HEAD the published object (each backend's own call)."""

    async def size(self) -> int:
        self._object_size = await self._head_size()
        return self._object_size

    async def known_size(self) -> int:
        """The object size, HEADed once per sink: loads read many ranges of one object."""
        if self._object_size is None:
            return await self.size()
        return self._object_size

    def layout(self, size: int) -> int:
        """Validate the part layout for ``size`` (before any request); return the part count."""
        if not self.part_size:
            raise StorageError(errno.EINVAL, "S3 sink needs chunk_size or part_size to lay out parts")
        self._size = size
        self._object_size = None
        self._first_failure = None
        self._nparts = plan_parts(size, self.part_size, self.options.chunk_size)
        return self._nparts

    def first_cause(self, err: StorageError) -> StorageError:
        """The upload's first failure wins; a later one is most likely its consequence (the
        upload already aborted, "request has already completed") and only becomes a note."""
        first = self._first_failure
        if first is None or first is err:
            self._first_failure = err
            return err
        again = type(first)(first.errno, first.strerror)  # each raise gets its own error
        again.add_note(f"(then, most likely as a consequence: {err.strerror})")
        return again

    @property
    def single_put(self) -> bool:
        """Objects smaller than one part go up in one PUT at complete (S3 has no 0-part MPU)."""
        return self._size < self.part_size

    def parts_of(self, offset: int, data: memoryview) -> list[tuple[int, memoryview]]:
        """(part number, bytes) pairs covering ``data`` written at ``offset``."""
        if offset % self.part_size:
            raise StorageError(
                errno.EINVAL, f"write at offset {offset} is not on a part boundary ({self.part_size} B)"
            )
        first = offset // self.part_size + 1
        return [
            (first + i, data[i * self.part_size : (i + 1) * self.part_size])
            for i in range(-(-len(data) // self.part_size))
        ]

    def what(self, action: str) -> str:
        endpoint = self.settings.endpoint_url or "AWS"
        if self.router is not None:
            endpoint = f"{len(self.router.endpoints)} endpoints, {self.router.strategy}"
        return f"{action} s3://{self.bucket}/{self.key} ({self.backend}, endpoint {endpoint})"

    def record_part(self, started: float) -> float:
        elapsed = time.perf_counter() - started
        self.part_latency.append(elapsed)
        return elapsed

    def describe(self) -> dict[str, Any]:
        lat = percentiles(self.part_latency)
        out: dict[str, Any] = {
            "direct_io": False,
            "direct_io_reason": f"not applicable to {self.backend} (object store)",
            "part_size": self.part_size,
            "parts": self._nparts if not self.single_put else 0,
            "single_put": self.single_put,
            "retries": self.retries,
            "etag": self.etag,
            "part_latency_p50_s": lat.p50,
            "part_latency_p99_s": lat.p99,
            **self.settings.describe(),
        }
        if self.cleanup_needed:
            out["upload_left_for_cleanup"] = self.cleanup_needed
        if self.endpoint_strategy is not None:
            out["endpoint_strategy"] = self.endpoint_strategy
            out["endpoints_configured"] = len(self.settings.endpoints)
        if self.router is not None:
            stats = self.router.stats()
            out["endpoint_retries"] = stats["retries"]
            out["endpoints"] = stats["endpoints"]
        return out


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


_SECRET_VARS = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


def export_to_environment(settings: S3Settings) -> tuple[object, ...]:
    """Publish resolved settings as AWS_* variables for libraries that only read the environment.

    s3dlio and Mountpoint's CRT take credentials and endpoint process-wide from the
    environment; this is the one place asyncckpt writes ``os.environ``, and only for those
    backends (in an isolated writer process it touches the child alone). Returns a
    fingerprint to detect a second, conflicting configuration in the same process.
    """
    import os

    values = {
        "AWS_ENDPOINT_URL": settings.endpoint_url,
        "AWS_ACCESS_KEY_ID": settings.access_key_id,
        "AWS_SECRET_ACCESS_KEY": settings.revealed("secret_access_key"),
        "AWS_SESSION_TOKEN": settings.revealed("session_token"),
        "AWS_REGION": settings.region,
        "AWS_DEFAULT_REGION": settings.region,
        "AWS_CA_BUNDLE": settings.ca_bundle,
    }
    for name, value in values.items():
        if value is not None:
            os.environ[name] = value
    if settings.access_key_id is not None and settings.session_token is None:
        os.environ.pop("AWS_SESSION_TOKEN", None)  # a stale token would not match the new key
    # the fingerprint keeps secrets wrapped (Secret compares by value, prints masked)
    return (
        *(v for k, v in values.items() if k not in _SECRET_VARS),
        settings.secret_access_key,
        settings.session_token,
    )

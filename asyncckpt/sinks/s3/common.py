"""What every S3 sink shares: target parsing, part layout, statistics, the error boundary.

Foreign exceptions (botocore, minio, s3dlio, Mountpoint, obstore) are mapped in one place,
:meth:`S3SinkBase.guarded`: each backend only says how to read an :class:`ErrorFields`
(status, S3 code, message, unreachable) from its exceptions, and :func:`classify` turns that
into the asyncckpt hierarchy. Messages are built from what the sink knows (bucket, key,
backend, endpoint) and the library's code and text; settings hold secrets as ``Secret``, so
none can be part of one.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import re
import time
from abc import abstractmethod
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar, TypeVar

from ... import env
from ...blocking import run_blocking
from ...errors import ConfigError, StorageError, StoragePermissionError, TargetNotFoundError
from ...node.distributed import rank_info_from_env
from ...results.metrics import percentiles
from ..base import Sink
from .config import S3Settings, parse_s3_uri, plan_parts
from .endpoints import EndpointRouter

log = logging.getLogger("asyncckpt")
T = TypeVar("T")

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


@dataclass(frozen=True)
class ErrorFields:
    """What a client library's exception says, in S3's terms (each backend reads its own)."""

    code: str = ""  # the S3 error code ("NoSuchKey"), or "" when the library does not give one
    message: str = ""  # the text shown to the user (code and server message, no secrets)
    status: int | None = None  # the HTTP status, when known
    unreachable: bool = False  # no answer at all: refused, reset, name resolution, connect timeout


def classify(fields: ErrorFields, what: str) -> StorageError:
    """The asyncckpt error for what a library said: unavailable (503), missing (404), denied
    (403), unreachable, else a plain storage error. Codes match as whole words only."""
    text = f"{what}: {fields.message or fields.code or 'no message'}"
    if fields.unreachable:
        text = f"{what}: cannot reach the endpoint ({fields.message})"
    code = fields.code or ("" if fields.status is None else str(fields.status))
    if fields.status == 503 or any(m in code or m in fields.message for m in UNAVAILABLE_MARKERS):
        return StorageError(errno.EIO, text + UNAVAILABLE_HINT)
    if fields.unreachable:
        return StorageError(errno.EIO, text)
    if fields.status == 404 or _NOT_FOUND.search(code):
        return TargetNotFoundError(errno.ENOENT, text)
    if fields.status == 403 or _DENIED.search(code):
        hint = " (check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN and the bucket policy)"
        return StoragePermissionError(errno.EACCES, text + hint)
    return StorageError(errno.EIO, text)


def storage_error(code: str, message: str, what: str, settings: S3Settings) -> StorageError:
    """The asyncckpt error for an S3 error ``code`` (or free text containing one)."""
    del settings  # messages never include settings: no secret can reach one
    return classify(ErrorFields(code=code, message=message), what)


def fields_from_text(exc: BaseException, *, unreachable_markers: tuple[str, ...]) -> ErrorFields:
    """For libraries that give only text (s3dlio, Mountpoint): names first, then whole-word
    statuses, so a request id such as "…f403a…" never turns a missing object into a denial."""
    text = str(exc)
    low = text.lower()
    message = f"{type(exc).__name__}: {text}"
    if any(n in text for n in ("NotFound", "NoSuchKey", "NoSuchBucket")) or "not found" in low:
        return ErrorFields("NotFound", message)
    if _DENIED.search(text) or "access denied" in low or "forbidden" in low:
        return ErrorFields("AccessDenied", message)
    if re.search(r"\b404\b", text):
        return ErrorFields("NotFound", message, 404)
    if re.search(r"\b403\b", text):
        return ErrorFields("AccessDenied", message, 403)
    if any(m in low for m in unreachable_markers):
        return ErrorFields(message=message, unreachable=True)
    return ErrorFields(message=message)


class S3SinkBase(Sink):
    """One object ``s3://bucket/key``; parts are ``part_size`` slices of ``chunk_size`` buffers."""

    can_list: ClassVar[bool] = True
    multi_endpoint: ClassVar[bool] = True

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> None:
        S3Settings.resolve({**options, "dotenv": False}, env={})

    @classmethod
    def check_root(cls, uri: str) -> None:
        if "/" not in uri[len("s3://") :].strip("/"):
            raise ConfigError(f"root {uri!r} must name an s3://bucket/prefix, not a whole bucket")

    default_in_flight = 4
    #: whether each request may go to a different endpoint (one client per endpoint)
    per_request_endpoints: ClassVar[bool] = False

    def __init__(self, uri: str, **kwargs: Any) -> None:
        super().__init__(uri, **kwargs)
        self.bucket, self.key = parse_s3_uri(uri)
        # resolved once per store (``.env`` is read once), not once per object
        self.settings = self.shared.get("s3-settings", lambda: S3Settings.resolve(self.options.extra))
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
        self._small: bytes | None = None  # an object below one part, PUT at complete

    def _plan_endpoints(self) -> None:
        """Several endpoints: a router for backends that switch per request, else ``rank % N``.

        A per-request strategy asked for explicitly of a backend that cannot do it is an error
        (raised here, before any I/O) rather than a silent downgrade; left at its default, the
        strategy becomes ``rank`` and describe() says why.
        """
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

    # -- the error boundary ------------------------------------------------------------
    def error_fields(self, exc: Exception) -> ErrorFields | None:
        """How this library's exception reads in S3 terms; None: not one of its errors (a
        bug, which propagates unmapped). Backends override it; nothing else maps errors."""
        if isinstance(exc, (OSError, TimeoutError)):
            return ErrorFields(message=f"{type(exc).__name__}: {exc}")
        return None

    def map_error(self, exc: Exception, action: str) -> StorageError:
        fields = self.error_fields(exc) or ErrorFields(message=f"{type(exc).__name__}: {exc}")
        return classify(fields, self.what(action))

    async def guarded(self, action: str, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """``await fn(*args)``, the one place a library's exceptions become asyncckpt's; the
        upload's first failure is the one reported (:meth:`first_cause`)."""
        try:
            return await fn(*args)
        except StorageError as exc:
            raise self.first_cause(exc) from None
        except Exception as exc:
            if self.error_fields(exc) is None:
                raise
            raise self.first_cause(self.map_error(exc, action)) from None

    async def blocking(self, action: str, fn: Callable[..., T], *args: Any) -> T:
        """A blocking library call in a worker thread, behind the boundary."""
        return await self.guarded(action, run_blocking, self.executor, fn, *args)

    # -- whole-object primitives every library supplies (foreign exceptions pass through)
    @abstractmethod
    async def _put(self, data: bytes) -> str | None:
        """PUT the whole object; return its ETag if the library reports it."""

    @abstractmethod
    async def _get(self, offset: int, buf: memoryview) -> int:
        """Read ``len(buf)`` bytes at ``offset`` into ``buf`` (repeatable); return the count."""

    @abstractmethod
    async def _head(self) -> tuple[int, str | None]:
        """(size, ETag) of the published object."""

    @abstractmethod
    async def _delete(self) -> None:
        """Remove the object (absent is not an error)."""

    @abstractmethod
    async def _list(self, prefix: str) -> list[str]:
        """Every key of the bucket that starts with ``prefix`` (all pages)."""

    # -- shared by both protocols ------------------------------------------------------
    async def _put_small(self, started: float) -> dict[str, float]:
        small, self._small = self._small, None
        if small is None or len(small) != self._size:
            raise StorageError(errno.EIO, self.what("complete") + ": object data was not written")
        etag = await self.guarded("put", self._put, small)
        put_s = time.perf_counter() - started
        await self._learn_etag(etag)
        return {"put_s": put_s}

    async def _learn_etag(self, etag: str | None) -> None:
        """Keep the published ETag; one HEAD learns it when the library does not say. The
        object is published by now: a failed HEAD only loses the replaced-object check."""
        self.etag = etag
        if etag is None:
            try:
                await self.size()
            except StorageError as exc:
                log.warning("saved, but its ETag is unknown (a replaced object goes unnoticed): %s", exc)

    async def _abort_quietly(self, what: str, fn: Callable[..., Awaitable[None]], *args: Any) -> None:
        """Abort; a failure leaves the upload listed for ``cleanup`` and is only logged."""
        try:
            await self.guarded("abort multipart upload of", fn, *args)
        except StorageError as exc:
            self.cleanup_needed = self.cleanup_needed or what
            log.warning("could not abort %s; list_multipart_uploads shows it for cleanup: %s", what, exc)

    async def read_into(self, offset: int, buf: memoryview) -> int:
        if not len(buf) or offset >= await self.known_size():  # S3 answers 416 past the end
            return 0
        return await self.guarded(f"read bytes {offset}-{offset + len(buf) - 1} of", self._get, offset, buf)

    async def size(self) -> int:
        size, self.etag = await self.guarded("stat", self._head)  # a load compares the ETag
        self._object_size = size
        return size

    async def delete(self) -> None:
        self._object_size = None
        await self.guarded("delete", self._delete)

    async def list_names(self) -> list[str]:
        """One level under ``<key>/``: the first component of each key below it."""
        prefix = self.key.rstrip("/") + "/"
        keys = await self.guarded("list objects under", self._list, prefix)
        return sorted({k[len(prefix) :].split("/", 1)[0] for k in keys if k.startswith(prefix)} - {""})

    async def aclose(self) -> None:
        await self.abort()  # an upload left open is discarded, never published
        await self.release_shared()

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
    values = {
        "AWS_ENDPOINT_URL": settings.endpoint_url,
        "AWS_ACCESS_KEY_ID": settings.access_key_id,
        "AWS_SECRET_ACCESS_KEY": settings.revealed("secret_access_key"),
        "AWS_SESSION_TOKEN": settings.revealed("session_token"),
        "AWS_REGION": settings.region,
        "AWS_DEFAULT_REGION": settings.region,
        "AWS_CA_BUNDLE": settings.ca_bundle,
    }
    env.export({name: value for name, value in values.items() if value is not None})
    if settings.access_key_id is not None and settings.session_token is None:
        env.export({"AWS_SESSION_TOKEN": None})  # a stale token would not match the new key
    # the fingerprint keeps secrets wrapped (Secret compares by value, prints masked)
    return (
        *(v for k, v in values.items() if k not in _SECRET_VARS),
        settings.secret_access_key,
        settings.session_token,
    )

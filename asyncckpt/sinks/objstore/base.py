"""What every object-store sink shares, whatever the store: one object ``<scheme>://<bucket>/<key>``
(a bucket, or a container), parts laid out over it, whole-object calls, statistics and the
error boundary.

A store (S3, Azure Blob, GCS, ...) subclasses :class:`ObjectStoreSink` once with its own
settings type and hooks (:meth:`~ObjectStoreSink.parse_target`,
:meth:`~ObjectStoreSink.resolve_settings`, :meth:`~ObjectStoreSink.plan_layout`,
:meth:`~ObjectStoreSink.location`, its :class:`~.errors.ErrorVocabulary`); each client library
then supplies the whole-object primitives (``_put``, ``_get``, ``_head``, ``_delete``,
``_list``) and one of the two upload protocols (``multipart.py``, ``append.py``). Nothing here
knows a store: obspec's small per-operation protocols are these primitives, and its typed
per-store configuration is the settings type parameter.
"""

from __future__ import annotations

import errno
import logging
import time
from abc import abstractmethod
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from ...blocking import run_blocking
from ...errors import AsyncCkptError, ConfigError, IntegrityError, StorageError
from ...results.metrics import percentiles
from ..base import Sink
from .errors import ErrorFields, ErrorVocabulary, classify

log = logging.getLogger("asyncckpt")
T = TypeVar("T")


#: a name under a root, to check the root as objects under it will be
ROOT_PROBE = "step-0"


#: error codes of a refused ``If-Match`` (S3's, Azure's), beside the status 412
PRECONDITION_CODES = ("PreconditionFailed", "ConditionNotMet")


class StoreSettings(Protocol):
    """What the generic layer reads of a store's resolved settings (frozen, secrets wrapped)."""

    @property
    def part_size(self) -> int | None: ...  # None: the pipeline's chunk size (one chunk = one part)

    def describe(self) -> dict[str, Any]: ...  # facts for the run metadata, no secrets


S = TypeVar("S", bound=StoreSettings)


class ObjectStoreSink(Sink, Generic[S]):
    """One object in a store; parts are ``part_size`` slices of ``chunk_size`` buffers."""

    can_list: ClassVar[bool] = True
    default_in_flight = 4
    #: the URI scheme and the word for a bucket, for messages and root checks ("s3", "bucket")
    scheme: ClassVar[str] = "abstract"
    container_word: ClassVar[str] = "bucket"
    #: the store's name in messages ("S3")
    store_name: ClassVar[str] = "object store"
    #: the store's error codes and hints (:func:`~.errors.classify`)
    error_vocabulary: ClassVar[ErrorVocabulary] = ErrorVocabulary()
    #: what a user does about an upload that could not be removed
    leftover_hint: ClassVar[str] = "the store keeps its parts until they are cleaned up"

    # -- the store's hooks ---------------------------------------------------------------
    @classmethod
    @abstractmethod
    def parse_target(cls, uri: str) -> tuple[str, str]:
        """``uri`` -> (bucket or container, key), with a clear error naming what is wrong."""

    @classmethod
    @abstractmethod
    def resolve_settings(cls, options: Mapping[str, Any]) -> S:
        """The store's settings from ``backend_options`` and the environment (once per store)."""

    @abstractmethod
    def plan_layout(self, size: int) -> int:
        """Validate the part layout of ``size`` bytes against the store's limits; the part count."""

    @abstractmethod
    def location(self) -> str:
        """Where requests go, for messages ("endpoint http://127.0.0.1:9000")."""

    def configure(self) -> None:
        """Adjust ``self.settings`` for this handle (an endpoint per rank), before the part size
        and the libraries' clients are chosen from it."""

    @classmethod
    def check_target(cls, uri: str) -> None:
        cls.parse_target(uri)

    @classmethod
    def check_root(cls, uri: str) -> None:
        if "/" not in uri[len(cls.scheme) + 3 :].strip("/"):
            word = cls.container_word
            raise ConfigError(f"root {uri!r} must name an {cls.scheme}://{word}/prefix, not a whole {word}")
        probe = f"{uri.rstrip('/')}/{ROOT_PROBE}"  # an object under it: the bucket's name, the form
        try:
            cls.parse_target(probe)
        except ConfigError as exc:
            raise ConfigError(str(exc).replace(probe, uri)) from None

    def __init__(self, uri: str, **kwargs: Any) -> None:
        super().__init__(uri, **kwargs)
        self.bucket, self.key = self.parse_target(uri)
        # resolved once per store (an ``.env`` file is read once), not once per object
        self.settings: S = self.shared.get(
            "store-settings", lambda: self.resolve_settings(self.options.extra)
        )
        self.configure()
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

    #: whether ``_get`` sends ``If-Match: read_pin()``: the store then refuses a read of an
    #: object another save replaced during the load, instead of serving the new bytes
    pins_version: ClassVar[bool] = False

    @property
    def object_uri(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.key}"

    def check(self) -> None:
        if self.part_size:
            self.plan_layout(max(self.part_size, 1))

    # -- the error boundary ------------------------------------------------------------
    def error_fields(self, exc: Exception) -> ErrorFields | None:
        """How this library's exception reads in the store's terms; None: not one of its errors
        (a bug, which propagates unmapped). Backends override it; nothing else maps errors."""
        if isinstance(exc, (OSError, TimeoutError)):
            return ErrorFields(message=f"{type(exc).__name__}: {exc}")
        return None

    def map_error(self, exc: Exception, action: str) -> StorageError:
        fields = self.error_fields(exc) or ErrorFields(message=f"{type(exc).__name__}: {exc}")
        return classify(fields, self.what(action), self.error_vocabulary)

    async def guarded(self, action: str, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """``await fn(*args)``, the one place a library's exceptions become asyncckpt's; the
        upload's first failure is the one reported (:meth:`first_cause`)."""
        try:
            return await fn(*args)
        except StorageError as exc:
            raise self.first_cause(exc) from None
        except AsyncCkptError:
            raise  # already ours (an object replaced under a load)
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
            log.warning("could not abort %s; %s: %s", what, self.leftover_hint, exc)

    async def read_into(self, offset: int, buf: memoryview) -> int:
        if not len(buf) or offset >= await self.known_size():  # stores answer 416 past the end
            return 0
        action = f"read bytes {offset}-{offset + len(buf) - 1} of"
        return await self.guarded(action, self._pinned_get, offset, buf)

    def read_pin(self) -> str | None:
        """The ETag, quoted, that a load's ranged reads ask the store to match (``If-Match``):
        the version its stat saw. None when no ETag is known."""
        return None if self.etag is None else '"' + self.etag.strip('"') + '"'

    async def _pinned_get(self, offset: int, buf: memoryview) -> int:
        try:
            return await self._get(offset, buf)
        except Exception as exc:
            fields = self.error_fields(exc) if self.pins_version else None
            if fields is not None and (fields.status == 412 or fields.code in PRECONDITION_CODES):
                raise self.replaced_error() from None
            raise

    def replaced_error(self) -> IntegrityError:
        return IntegrityError(
            f"{self.uri!r} was replaced while it was being read: the version the load began with "
            f"(ETag {self.etag}) is no longer the object's (another save wrote the same key); "
            "load it again"
        )

    async def check_unchanged(self) -> None:
        """IntegrityError if the object is not the version this load's stat saw (asked after a
        checksum mismatch, so that a replaced object is not reported as corrupt)."""
        if self.etag is None:
            return
        _, etag = await self.guarded("stat", self._head)
        if etag is not None and etag.strip('"') != self.etag.strip('"'):
            raise self.replaced_error()

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
            raise StorageError(
                errno.EINVAL, f"{self.store_name} sink needs chunk_size or part_size to lay out parts"
            )
        self._size = size
        self._object_size = None
        self._first_failure = None
        self._nparts = self.plan_layout(size)
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
        """Objects smaller than one part go up in one PUT at complete (no 0-part upload)."""
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
        return f"{action} {self.object_uri} ({self.backend}, {self.location()})"

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
        return out

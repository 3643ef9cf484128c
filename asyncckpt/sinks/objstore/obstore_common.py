"""obstore (Rust ``object_store`` on Tokio) on any of its stores: its buffered writer fed in
offset order, its exceptions mapped, its native async whole-object calls.

obstore exposes no multipart primitives (no upload id, no part numbers), only a writer
that buffers ``part_size`` bytes and uploads each full buffer as a part, up to
``max_in_flight`` at once: an :class:`~.append.AppendSink`. ``write()`` keeps a zero-copy
reference to the buffer it is given until that part is uploaded, long after it returns (a pool
memoryview stays exported: ``BufferError`` on reuse), so each chunk is copied once into a
``bytes`` the writer owns. The append contract is a blocking call in a worker thread, so the
stream uses the synchronous writer (it releases the GIL while it waits for a free upload
slot); whole-object calls (PUT, ranged GET, HEAD, DELETE, LIST) use obstore's native async API
on the event loop, with no thread. Aborting the writer aborts its multipart upload.

Everything here works on an ``obstore.store.ObjectStore`` (``S3Store``, ``AzureStore``,
``GCSStore``): a store's sink adds its settings (a subclass of the store's
:class:`~.base.ObjectStoreSink`) and :meth:`ObstoreSink.build_store`.

After a process has used obstore, a ``fork``ed child hangs on its first obstore call (the
Tokio runtime's threads are not in the child); ``needs_isolation`` runs it in a writer
process (forkserver), as s3dlio.
"""

from __future__ import annotations

import re
from abc import abstractmethod
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ...blocking import run_blocking
from ...errors import MissingDependencyError
from .append import AppendSink
from .base import StoreSettings, log
from .errors import ErrorFields

try:
    import obstore
    from obstore.exceptions import BaseError, PermissionDeniedError, PreconditionError, UnauthenticatedError
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise MissingDependencyError("obstore", "obstore", "backend 'obstore'") from exc

if TYPE_CHECKING:
    from obstore import WritableFile
    from obstore.store import ClientConfig, ObjectStore, RetryConfig

_CODE = re.compile(r"<Code>([^<]*)</Code>")
_MESSAGE = re.compile(r"<Message>([^<]*)</Message>")
_STATUS = re.compile(r"status code: (\d{3})")
#: obstore's text for "no answer": the request never went out (refused, name resolution, connect)
_UNREACHABLE = ("error sending request", "connection refused", "dns error")


class TransportSettings(StoreSettings, Protocol):
    """What obstore's client and retry options are made of, in any store's settings."""

    @property
    def endpoint_url(self) -> str | None: ...
    @property
    def ca_bundle(self) -> str | None: ...
    @property
    def connect_timeout(self) -> float: ...
    @property
    def request_timeout(self) -> float: ...
    @property
    def max_in_flight(self) -> int: ...
    @property
    def max_attempts(self) -> int: ...


TS = TypeVar("TS", bound=TransportSettings)


def summary(text: str) -> str:
    """obstore's first paragraph: its ``Debug source`` dump repeats the same, multi-line."""
    return text.split("\n\nDebug source:", 1)[0].strip()


def obstore_error_fields(exc: Exception) -> ErrorFields | None:
    """obstore raises ``FileNotFoundError`` for 404, its own classes for other answers and a
    plain ``OSError`` for what its writer's background uploads met; the store's code and status
    are only in the text (the server's XML, "status code: 403")."""
    if not isinstance(exc, (BaseError, OSError)):
        return None  # not obstore's: a bug, which propagates unmapped
    text = summary(str(exc))
    code = m.group(1) if (m := _CODE.search(text)) else ""
    status = int(found.group(1)) if (found := _STATUS.search(text)) else None
    if isinstance(exc, FileNotFoundError):
        status, code = 404, code or "NotFound"
    elif isinstance(exc, (PermissionDeniedError, UnauthenticatedError)) and status is None:
        status = 403
    elif isinstance(exc, PreconditionError) and status is None:  # an If-Match refused
        status = 412
    server = m.group(1) if (m := _MESSAGE.search(text)) else ""
    first_line = text.splitlines()[0].rstrip(": ") if text else "no message"
    message = f"{code}: {server}" if code and server else f"{type(exc).__name__}: {first_line}"
    unreachable = status is None and (
        isinstance(exc, ConnectionRefusedError) or any(w in text.lower() for w in _UNREACHABLE)
    )
    return ErrorFields(code, message, status, unreachable)


class ObstoreSink(AppendSink[TS]):
    """One object through an obstore ``ObjectStore``; the store's subclass builds the store."""

    backend = "obstore"
    pins_version = True
    default_in_flight = 2  # the writer uploads max_in_flight parts itself; two chunks keep it fed
    #: as s3dlio: in the caller its Tokio runtime and the parts' copies cost loop lag (p99 52 ms vs
    #: 9 ms isolated) and RSS (+133 MiB vs +1 MiB), and a fork after it hangs (docs/s3.md)
    needs_isolation = True

    def __init__(self, uri: str, **kwargs: Any) -> None:
        super().__init__(uri, **kwargs)
        # one store (client and connection pool) per bucket for every object of the store
        key = ("obstore", self.bucket, self.location(), self.part_size)
        self._store = self.shared.get(key, self.build_store)

    @abstractmethod
    def build_store(self) -> ObjectStore:
        """The obstore store of ``self.bucket`` from ``self.settings`` (``client_options()`` and
        ``retry_config()`` give the transport)."""

    def client_options(self) -> ClientConfig:
        s = self.settings
        options: ClientConfig = {
            "allow_http": (s.endpoint_url or "").startswith("http://"),
            "connect_timeout": timedelta(seconds=s.connect_timeout),
            # each wait for response bytes, as botocore's read_timeout
            "read_timeout": timedelta(seconds=s.request_timeout),
            # object_store also bounds a whole request (30 s by default, short for a large part
            # on a slow link): room to send one part at 1 MB/s, on top of request_timeout
            "timeout": timedelta(seconds=s.request_timeout + self.part_size / 1e6),
            "pool_max_idle_per_host": str(max(10, s.max_in_flight * 2)),
        }
        if s.ca_bundle:
            options["root_certificate"] = Path(s.ca_bundle).read_text()
        return options

    def retry_config(self) -> RetryConfig:
        # object_store retries 5xx, connection errors and timeouts itself (backoff 0.1 s doubling)
        return {"max_retries": self.settings.max_attempts - 1}

    def error_fields(self, exc: Exception) -> ErrorFields | None:
        return obstore_error_fields(exc)

    # -- the stream --------------------------------------------------------------------
    async def _open_stream(self) -> WritableFile:
        # no request yet: the writer starts the multipart upload once a part's worth is buffered
        return obstore.open_writer(
            self._store,
            self.key,
            buffer_size=self.part_size,
            max_concurrency=self.settings.max_in_flight,
        )

    def _append(self, data: memoryview) -> None:
        self._stream.write(bytes(data))  # the one copy: write() keeps what it is given

    async def _close_stream(self) -> str | None:
        writer, self._stream = self._stream, None
        try:
            await run_blocking(self.executor, writer.close)
        except Exception:
            # close() takes the writer out before it waits for the last parts: after a failed
            # close nothing is left to abort, and obstore does not abort the upload itself
            self.cleanup_needed = self.cleanup_needed or f"upload of unknown id ({self.backend})"
            log.warning(
                "completing %s failed after its upload started; %s", self.object_uri, self.leftover_hint
            )
            raise
        return None  # close() returns no ETag: one HEAD learns it

    async def _drop_stream(self) -> None:
        writer, self._stream = self._stream, None
        # leaving the writer's context with an exception is obstore's abort (close() commits)
        await run_blocking(self.executor, writer.__exit__, RuntimeError, RuntimeError("abort"), None)

    # -- whole objects -----------------------------------------------------------------
    async def _put(self, data: bytes) -> str | None:
        result = await obstore.put_async(self._store, self.key, data, use_multipart=False)
        return result["e_tag"]

    async def _get(self, offset: int, buf: memoryview) -> int:
        pin = self.read_pin()
        if pin is None:
            data = await obstore.get_range_async(self._store, self.key, start=offset, length=len(buf))
        else:
            got = await obstore.get_async(
                self._store, self.key, options={"range": (offset, offset + len(buf)), "if_match": pin}
            )
            data = await got.bytes_async()
        view = memoryview(data)
        buf[: len(view)] = view
        return len(view)

    async def _head(self) -> tuple[int, str | None]:
        meta = await obstore.head_async(self._store, self.key)
        return meta["size"], meta["e_tag"]

    async def _delete(self) -> None:
        await obstore.delete_async(self._store, self.key)

    async def _list(self, prefix: str) -> list[str]:
        # object_store lists by path segments: "a/b/" and "a/b" both mean the folder a/b
        keys: list[str] = []
        async for batch in obstore.list(self._store, prefix.rstrip("/") or None, chunk_size=1000):
            keys.extend(meta["path"] for meta in batch)
        return keys

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out["part_latency_note"] = "time to hand a chunk to obstore's writer (it uploads in the background)"
        return out

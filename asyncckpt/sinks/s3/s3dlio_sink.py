"""s3dlio (Rust/Tokio): a streaming ``MultipartUploadWriter`` fed in offset order.

The writer appends, so concurrent ``write_part`` calls are admitted strictly by offset
(:class:`InOrder`); its own ``max_in_flight`` window uploads parts concurrently. Each chunk
is copied once into memory the writer owns (``reserve()`` → fill → ``commit()``), because
``write()`` *borrows* a buffer until ``close()`` and the pool reuses buffers long before
that (reusing one raises ``BufferError`` in s3dlio 0.10). Every call blocks, so each runs
through :func:`run_blocking`.

s3dlio configures one client per process on first use, from the environment (and
``configure_s3``). After a process has used it, a ``fork``ed child hangs on its first
s3dlio call: run this backend in a spawn/forkserver writer process (issue 3 isolation).
"""

from __future__ import annotations

import errno
import math
import re
import threading
import time
from typing import Any

from ..._blocking import run_blocking
from ...errors import ConfigError, MissingDependencyError, StorageError
from .common import InOrder, S3SinkBase, export_to_environment, log, storage_error
from .sigv4 import error_code, error_message, request_with_settings

try:
    import s3dlio
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise MissingDependencyError("s3dlio", "s3dlio", "backend 's3dlio' (s3://)") from exc

_configured: tuple[object, ...] | None = None
#: endpoints seen refusing s3dlio's DeleteObjects: later deletes go straight to a plain DELETE
_NEEDS_PLAIN_DELETE: set[str | None] = set()
_config_lock = threading.Lock()


def _configure(sink: S3dlioSink) -> None:
    """Configure s3dlio's process-wide client once; refuse a conflicting second setup."""
    global _configured
    s = sink.settings
    import os

    fingerprint = (*export_to_environment(s), s.payload_signing, s.request_timeout, s.connect_timeout)
    with _config_lock:
        if _configured is None:
            # read once, when s3dlio builds its client; whole seconds. The operation timeout
            # covers a whole request (a part upload included); a value the user exported wins
            os.environ.setdefault("S3DLIO_OPERATION_TIMEOUT_SECS", str(math.ceil(s.request_timeout)))
            os.environ.setdefault("S3DLIO_CONNECT_TIMEOUT_SECS", str(math.ceil(s.connect_timeout)))
            if s.payload_signing:
                os.environ.pop("S3DLIO_UNSIGNED_PAYLOAD", None)
            else:
                os.environ["S3DLIO_UNSIGNED_PAYLOAD"] = "1"
            s3dlio.configure_s3(endpoint_url=s.endpoint_url, region=s.region, ca_bundle=s.ca_bundle)
            _configured = fingerprint
        elif _configured != fingerprint:
            raise ConfigError(
                "s3dlio configures one S3 client per process and it is already set up with other "
                "settings (endpoint, credentials or payload signing); use one configuration per "
                "process or run the save in an isolated writer process"
            )


_DENIED_NAMES = ("AccessDenied", "Forbidden", "InvalidAccessKeyId", "SignatureDoesNotMatch")


class S3dlioSink(S3SinkBase):
    """``s3://bucket/key`` through s3dlio."""

    backend = "s3dlio"
    default_in_flight = 2  # s3dlio parallelises inside; two writers keep it fed

    def __init__(self, uri: str, **kwargs: Any) -> None:
        super().__init__(uri, **kwargs)
        self._writer: Any = None
        self._order = InOrder()
        self._small: bytes | None = None
        self._parts = 0

    def _map(self, exc: BaseException, action: str) -> StorageError:
        text = str(exc)
        code = text
        # names first, then whole-word status codes: a request id such as "…f403a…" in the
        # message must not turn a missing object into a permission error
        if any(n in text for n in ("NotFound", "NoSuchKey", "NoSuchBucket")) or "not found" in text.lower():
            code = "NotFound"
        elif any(
            n in text for n in ("AccessDenied", "Forbidden", "InvalidAccessKeyId", "SignatureDoesNotMatch")
        ):
            code = "AccessDenied"
        elif re.search(r"\b404\b", text):
            code = "NotFound"
        elif re.search(r"\b403\b", text):
            code = "AccessDenied"
        elif "connect" in text.lower() or "dispatch failure" in text.lower():
            return storage_error(
                "",
                f"cannot reach the endpoint ({type(exc).__name__}: {text})",
                self.what(action),
                self.settings,
            )
        return storage_error(code, f"{type(exc).__name__}: {text}", self.what(action), self.settings)

    async def _run(self, action: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await run_blocking(self.executor, lambda: fn(*args, **kwargs))
        except StorageError as exc:
            raise self.first_cause(exc) from None
        except Exception as exc:
            if isinstance(exc, (ConfigError, BufferError)):
                raise
            raise self.first_cause(self._map(exc, action)) from None

    async def open(self, size: int) -> None:
        self.layout(size)
        _configure(self)
        self._order = InOrder()
        self._small = None
        if not self.single_put:
            self._writer = await self._run(
                "create multipart upload for",
                s3dlio.MultipartUploadWriter.from_uri,
                self.uri,
                part_size=self.part_size,
                max_in_flight=self.settings.max_in_flight,
                abort_on_drop=True,
            )

    def _append_sync(self, data: memoryview) -> float:
        started = time.perf_counter()
        view = self._writer.reserve(len(data))
        view[:] = data  # the one copy: the pool's buffer is free once this returns
        self._writer.commit(len(data))
        view.release()
        return time.perf_counter() - started

    async def write_part(self, offset: int, data: memoryview) -> float | None:
        if self.single_put:
            self._small = bytes(data)
            return None
        await self._order.wait(offset)
        try:
            elapsed: float = await self._run(f"write at offset {offset} of", self._append_sync, data)
        finally:
            await self._order.advance(len(data))  # on failure the whole save aborts anyway
        self.part_latency.append(elapsed)
        return elapsed

    async def complete(self) -> dict[str, float]:
        started = time.perf_counter()
        if self.single_put:
            if self._small is None:
                raise StorageError(errno.EIO, self.what("complete") + ": object data was not written")
            small, self._small = self._small, None
            await self._run("put", s3dlio.put_bytes, self.uri, small)
            put_s = time.perf_counter() - started
            self.etag = (await self._run("stat", s3dlio.stat, self.uri)).get("etag")  # put returns none
            return {"put_s": put_s}
        if self._order.next != self._size:
            raise StorageError(
                errno.EIO, self.what("complete") + f": {self._order.next} of {self._size} B written"
            )
        writer, self._writer = self._writer, None
        info = await self._run("complete multipart upload of", writer.close)
        self.etag = info.get("etag")
        self._parts = int(info.get("parts", 0))
        return {"complete_s": time.perf_counter() - started}

    async def abort(self) -> None:
        self._small = None
        writer, self._writer = self._writer, None
        if writer is None:
            return
        try:
            await self._run("abort multipart upload of", writer.abort)
        except StorageError as exc:
            self.cleanup_needed = "unknown upload id (s3dlio)"
            log.warning(
                "could not abort the s3dlio upload; list_multipart_uploads shows it for cleanup: %s", exc
            )

    async def read_into(self, offset: int, buf: memoryview) -> int:
        if not len(buf) or offset >= await self.known_size():
            return 0
        _configure(self)
        data = await self._run("read", s3dlio.get_range, self.uri, offset, len(buf))
        view = memoryview(data).cast("B")
        buf[: len(view)] = view
        return len(view)

    async def _head_size(self) -> int:
        _configure(self)
        info = await self._run("stat", s3dlio.stat, self.uri)
        self.etag = info.get("etag")  # a load compares it with the manifest's
        return int(info["size"])

    async def delete(self) -> None:
        self._object_size = None
        _configure(self)
        endpoint = self.settings.endpoint_url
        if endpoint not in _NEEDS_PLAIN_DELETE:
            try:
                await run_blocking(self.executor, s3dlio.delete, self.uri)
                return
            except Exception as exc:
                if "Content-MD5" not in str(exc):
                    raise self._map(exc, "delete") from None
                # s3dlio 0.10 deletes through DeleteObjects without Content-MD5; stores that
                # follow the S3 spec strictly (OpenStack Swift) refuse it: one plain DELETE works
                log.info(
                    "endpoint %s refuses s3dlio's DeleteObjects (Content-MD5); deleting with DELETE", endpoint
                )
                _NEEDS_PLAIN_DELETE.add(endpoint)
        await run_blocking(self.executor, self._plain_delete_sync)

    def _plain_delete_sync(self) -> None:
        """One SigV4-signed ``DELETE`` of this object (404 counts as deleted, as in S3)."""
        s = self.settings
        try:
            status, body = request_with_settings(s, "DELETE", self.bucket, self.key)
        except ValueError as exc:
            raise StorageError(
                errno.EOPNOTSUPP,
                self.what("delete") + ": the server refuses s3dlio's DeleteObjects (no Content-MD5) and "
                f"the plain DELETE asyncckpt sends instead {exc}",
            ) from None
        except OSError as exc:
            raise storage_error(
                "", f"cannot reach the endpoint ({type(exc).__name__}: {exc})", self.what("delete"), s
            ) from None
        if status in (200, 204, 404):
            return
        code = error_code(body) or str(status)
        text = f"HTTP {status} {code}: {error_message(body) or 'no message'}"
        raise storage_error(code, text, self.what("delete"), s)

    async def aclose(self) -> None:
        await self.abort()

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out["parts"] = self._parts or out["parts"]
        out["part_latency_note"] = "time to hand a chunk to s3dlio (it uploads in the background)"
        return out

"""s3dlio (Rust/Tokio): a streaming ``MultipartUploadWriter`` fed in offset order.

The writer appends (:class:`AppendSink` admits writes in offset order); its own
``max_in_flight`` window uploads parts concurrently. Synthetic chunks are generated straight
into memory the writer owns (``reserve()`` → dgen-py fills it → ``commit()``: no copy;
``_generate``); the committed view stays readable, so the CRC32C of those bytes runs while
the next chunk is generated. Caller data is copied once into that memory (``_append``), because
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
import threading
import time
from typing import Any

from ... import env
from ...blocking import run_blocking
from ...errors import ConfigError, MissingDependencyError, StorageError
from ...sources.base import ThreadedSource
from .common import ErrorFields, export_to_environment, fields_from_text, log, storage_error
from .core import AppendSink, Placed
from .sigv4 import error_code, error_message, request_with_settings


def _s3dlio() -> Any:
    """s3dlio, imported on first use: the import takes 1-1.6 s (its runtime starts), and this
    module is imported for the class's capabilities when a configuration is checked, on the
    caller's loop; a checkpointer imports the library itself in a thread (``import_backend``)."""
    try:
        import s3dlio
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise MissingDependencyError("s3dlio", "s3dlio", "backend 's3dlio' (s3://)") from exc
    return s3dlio


_configured: tuple[object, ...] | None = None
#: endpoints seen refusing s3dlio's DeleteObjects: later deletes go straight to a plain DELETE
_NEEDS_PLAIN_DELETE: set[str | None] = set()
_config_lock = threading.Lock()


def _configure(sink: S3dlioSink) -> None:
    """Configure s3dlio's process-wide client once; refuse a conflicting second setup."""
    global _configured
    s = sink.settings
    fingerprint = (*export_to_environment(s), s.payload_signing, s.request_timeout, s.connect_timeout)
    with _config_lock:
        if _configured is None:
            # read once, when s3dlio builds its client; whole seconds. The operation timeout
            # covers a whole request (a part upload included); a value the user exported wins
            env.export(
                {
                    name: env.s3dlio_variable(name) or value  # a value the user exported wins
                    for name, value in (
                        ("S3DLIO_OPERATION_TIMEOUT_SECS", str(math.ceil(s.request_timeout))),
                        ("S3DLIO_CONNECT_TIMEOUT_SECS", str(math.ceil(s.connect_timeout))),
                    )
                }
            )
            env.export({"S3DLIO_UNSIGNED_PAYLOAD": None if s.payload_signing else "1"})
            _s3dlio().configure_s3(endpoint_url=s.endpoint_url, region=s.region, ca_bundle=s.ca_bundle)
            _configured = fingerprint
        elif _configured != fingerprint:
            raise ConfigError(
                "s3dlio configures one S3 client per process and it is already set up with other "
                "settings (endpoint, credentials or payload signing); use one configuration per "
                "process or run the save in an isolated writer process"
            )


class S3dlioSink(AppendSink):
    """``s3://bucket/key`` through s3dlio."""

    backend = "s3dlio"
    default_in_flight = 2  # s3dlio parallelises inside; two writers keep it fed
    needs_isolation = True  # its Tokio runtime: loop lag and RSS in the caller (issue 9, item 1)
    generates_in_place = True  # reserve() lends its memory: synthetic chunks are made there

    @classmethod
    def import_library(cls) -> None:
        _s3dlio()

    def __init__(self, uri: str, **kwargs: Any) -> None:
        super().__init__(uri, **kwargs)
        self._parts = 0

    def error_fields(self, exc: Exception) -> ErrorFields | None:
        if isinstance(exc, (ConfigError, BufferError)):
            return None  # asyncckpt's own refusal, or a misuse of s3dlio's buffers: not storage
        return fields_from_text(exc, unreachable_markers=("connect", "dispatch failure"))

    async def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` in a thread; ``fn`` is a name of s3dlio's (``"put_bytes"``,
        looked up there: the first use imports s3dlio) or a callable."""

        def call() -> Any:
            _configure(self)
            found = getattr(_s3dlio(), fn) if isinstance(fn, str) else fn
            return found(*args, **kwargs)

        return await run_blocking(self.executor, call)

    async def _open_stream(self) -> Any:
        return await self._call(
            lambda *a, **k: _s3dlio().MultipartUploadWriter.from_uri(*a, **k),
            self.uri,
            part_size=self.part_size,
            max_in_flight=self.settings.max_in_flight,
            abort_on_drop=True,
        )

    def _append(self, data: memoryview) -> None:
        view = self._stream.reserve(len(data))
        view[:] = data  # the one copy: the pool's buffer is free once this returns
        self._stream.commit(len(data))
        view.release()

    def _generate(self, source: ThreadedSource, nbytes: int) -> Placed:
        t0 = time.perf_counter()
        view = self._stream.reserve(nbytes)
        t1 = time.perf_counter()
        try:
            filled = source.fill_sync(view)  # generated in the writer's memory: no copy
            t2 = time.perf_counter()
            if filled != nbytes:
                raise RuntimeError(f"the generator produced {filled} of {nbytes} bytes")
            self._stream.commit(nbytes)  # the view stays readable: the CRC32C is taken after
            t3 = time.perf_counter()
        except BaseException:
            view.release()
            raise
        return Placed(view=view, fill_s=t2 - t1, write_s=(t1 - t0) + (t3 - t2))  # reserve + commit

    def write_behind(self) -> int:
        """s3dlio 0.10 takes parts into its memory and uploads them in the background: against a
        stopped server, ``commit()`` returned for ``2 x max_in_flight + 1`` parts (measured with
        1, 2, 3 and 8 in flight), then blocked; a commit beyond that proves one acknowledged."""
        if self.single_put or not self.part_size:
            return 0
        window = 2 * self.settings.max_in_flight * self.part_size
        return window + max(self.part_size, self.options.chunk_size or 0)

    async def _close_stream(self) -> str | None:
        writer, self._stream = self._stream, None
        info = await self._call(writer.close)
        self._parts = int(info.get("parts", 0))
        return info.get("etag")  # type: ignore[no-any-return]

    async def _drop_stream(self) -> None:
        writer, self._stream = self._stream, None
        await self._call(writer.abort)

    async def _put(self, data: bytes) -> str | None:
        await self._call("put_bytes", self.uri, data)
        return None  # s3dlio's put returns no ETag: one HEAD learns it

    async def _get(self, offset: int, buf: memoryview) -> int:
        data = await self._call("get_range", self.uri, offset, len(buf))
        view = memoryview(data).cast("B")
        buf[: len(view)] = view
        return len(view)

    async def _head(self) -> tuple[int, str | None]:
        info = await self._call("stat", self.uri)
        return int(info["size"]), info.get("etag")

    async def _delete(self) -> None:
        endpoint = self.settings.endpoint_url
        if endpoint not in _NEEDS_PLAIN_DELETE:
            try:
                await self._call("delete", self.uri)
                return
            except Exception as exc:
                if "Content-MD5" not in str(exc):
                    raise
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

    async def _list(self, prefix: str) -> list[str]:
        found = await self._call("list", f"s3://{self.bucket}/{prefix}", recursive=True)
        base = f"s3://{self.bucket}/"  # s3dlio answers with URIs (older versions: keys)
        return [str(u)[len(base) :] if str(u).startswith(base) else str(u) for u in found]

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out["parts"] = self._parts or out["parts"]
        out["part_latency_note"] = "time to hand a chunk to s3dlio (it uploads in the background)"
        return out

"""s3dlio on Azure Blob: ``create_azure_writer`` (4 MiB blocks, one block list at ``finalize``)
fed in offset order; a dropped writer commits nothing.

s3dlio has no account-key mode on Azure: it takes a SAS (``S3DLIO_AZURE_CREDENTIAL=sas``) and the
blob *host* (``AZURE_BLOB_ENDPOINT_URL``, without the account), process-wide from the
environment, and names blobs ``az://ACCOUNT/container/key``. A dead endpoint is retried for
over a minute (docs/azure-gcs.md): the stall watchdog bounds it. As on S3, it runs in a writer
process (``needs_isolation``: its Tokio runtime, and a fork after it hangs).
"""

from __future__ import annotations

import re
import threading
from typing import Any

from ... import env
from ...blocking import run_blocking
from ...errors import ConfigError, MissingDependencyError
from ..objstore.append import AppendSink
from ..objstore.errors import ErrorFields
from .common import AzureSinkBase
from .config import AzureSettings

_UNREACHABLE = ("connect", "dispatch failure", "error sending request", "connection refused")
_configured: tuple[object, ...] | None = None
_lock = threading.Lock()


def _s3dlio() -> Any:
    """s3dlio, imported on first use (its import starts a runtime and takes over a second)."""
    try:
        import s3dlio
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise MissingDependencyError("s3dlio", "s3dlio", "backend 's3dlio-azure' (az://)") from exc
    return s3dlio


def blob_host(settings: AzureSettings) -> str | None:
    """The host s3dlio appends the account to: the account URL without ``/ACCOUNT``."""
    url = settings.endpoint_url
    if url is None:
        return None
    suffix = f"/{settings.account}"
    return url[: -len(suffix)] if url.endswith(suffix) else url


def _configure(settings: AzureSettings) -> None:
    """Export s3dlio's Azure variables once per process; refuse a conflicting second setup."""
    global _configured
    if settings.sas_token is None:
        raise ConfigError(
            "backend 's3dlio-azure' needs a SAS token (AZURE_STORAGE_SAS_TOKEN or backend option "
            "sas_token): s3dlio has no account-key mode; use backend 'obstore-azure' with a key"
        )
    fingerprint = (settings.account, blob_host(settings), settings.sas_token)
    with _lock:
        if _configured is None:
            env.export(
                {
                    "AZURE_BLOB_ENDPOINT_URL": blob_host(settings),
                    "S3DLIO_AZURE_CREDENTIAL": "sas",
                    "S3DLIO_AZURE_SAS_TOKEN": settings.sas_token.reveal().lstrip("?"),
                    "AZURE_STORAGE_ENDPOINT": None,  # s3dlio prefers it, with another meaning
                }
            )
            _configured = fingerprint
        elif _configured != fingerprint:
            raise ConfigError(
                "s3dlio reads its Azure account, endpoint and SAS once per process and they are already "
                "set up with other values; use one configuration per process or a writer process"
            )


def s3dlio_error_fields(exc: Exception) -> ErrorFields | None:
    """s3dlio gives text only ("404 … BlobNotFound", "403 … AuthorizationFailure")."""
    if isinstance(exc, (ConfigError, BufferError)):
        return None  # asyncckpt's own refusal, or a misuse of s3dlio's buffers: not storage
    text = f"{type(exc).__name__}: {exc}"
    code = (
        m.group(0)
        if (m := re.search(r"\b(?:ContainerNotFound|BlobNotFound|Authorization\w+)\b", text))
        else ""
    )
    status = int(m.group(1)) if (m := re.search(r"\b(403|404|503)\b", text)) else None
    unreachable = status is None and any(w in text.lower() for w in _UNREACHABLE)
    body = re.search(r"<Code>([^<]*)</Code>\s*<Message>([^<]*)</Message>", text)
    if body is not None:  # the server's XML after "404: ": its code and message say what failed
        head = text.split("<?xml", 1)[0].strip().rstrip(":")
        return ErrorFields(code or body[1], f"{head}: {body[1]}: {body[2]}"[:500], status, unreachable)
    return ErrorFields(code, text.splitlines()[0][:500], status, unreachable)


class AzureS3dlioSink(AzureSinkBase, AppendSink[AzureSettings]):
    """``az://container/key`` through s3dlio (SAS only)."""

    backend = "s3dlio-azure"
    default_in_flight = 2
    needs_isolation = True

    @classmethod
    def import_library(cls) -> None:
        _s3dlio()

    @property
    def s3dlio_uri(self) -> str:
        return f"az://{self.settings.account}/{self.bucket}/{self.key}"

    def error_fields(self, exc: Exception) -> ErrorFields | None:
        return s3dlio_error_fields(exc)

    async def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        def call() -> Any:
            _configure(self.settings)
            return getattr(_s3dlio(), name)(*args, **kwargs)

        return await run_blocking(self.executor, call)

    async def _open_stream(self) -> Any:
        return await self._call("create_azure_writer", self.s3dlio_uri)

    def _append(self, data: memoryview) -> None:
        self._stream.write_chunk(bytes(data))

    async def _close_stream(self) -> str | None:
        writer, self._stream = self._stream, None
        await run_blocking(self.executor, writer.finalize)
        return None  # finalize reports sizes, no ETag: one HEAD learns it

    async def _drop_stream(self) -> None:
        self._stream = None  # s3dlio has no abort: a dropped writer never commits its block list

    async def _put(self, data: bytes) -> str | None:
        await self._call("put_bytes", self.s3dlio_uri, data)
        return None

    async def _get(self, offset: int, buf: memoryview) -> int:
        data = await self._call("get_range", self.s3dlio_uri, offset, len(buf))
        view = memoryview(data).cast("B")
        buf[: len(view)] = view
        return len(view)

    async def _head(self) -> tuple[int, str | None]:
        info = await self._call("stat", self.s3dlio_uri)
        return int(info["size"]), info.get("etag")

    async def _delete(self) -> None:
        await self._call("delete", self.s3dlio_uri)  # a missing blob succeeds (measured)

    async def _list(self, prefix: str) -> list[str]:
        base = f"az://{self.settings.account}/{self.bucket}/"
        found = await self._call("list", base + prefix, recursive=True)  # one level by default
        return [str(u)[len(base) :] if str(u).startswith(base) else str(u) for u in found]

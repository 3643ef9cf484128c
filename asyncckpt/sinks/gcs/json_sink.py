"""``gs://bucket/key`` through GCS's own JSON API, spoken with aiohttp on the event loop.

Writes are a *resumable upload*, the protocol google-cloud-storage itself uses for large
objects: one ``POST .../upload/storage/v1/b/BUCKET/o?uploadType=resumable&name=KEY`` opens a
session, each chunk is a ``PUT`` of the session URI with ``Content-Range: bytes a-b/*`` (a
multiple of 256 KiB; GCS answers 308), and the object appears only with the final chunk
(``bytes a-b/TOTAL``). The pipeline may end a save after its last write and before its
commit, so the final chunk is kept (one copy of at most one part) and sent by ``complete``:
nothing is visible before. A failed or cancelled save ``DELETE``s the session (GCS answers
499); a session that could not be deleted expires by itself after a week and is never
visible. Chunks are not retried (a resent chunk would need the session's status, which
fake-gcs-server does not answer faithfully): a failed chunk fails the save. Whole-object calls
(a simple upload below one part, ranged ``alt=media`` reads, metadata, delete, list) are
retried while the store is unreachable or answers 5xx / 429.

Integrity: the CRC32C of the bytes sent is computed alongside (a running CRC, chunk after
chunk), sent with the final request (``X-Goog-Hash: crc32c=``, which real GCS checks) and
compared with the CRC32C GCS answers for the whole object; a mismatch is an
:class:`~asyncckpt.errors.IntegrityError` (fake-gcs-server does not check the header: the
comparison is what catches a corrupted upload there).

aiohttp is imported on first use (``import_library``), not by this module: the class's
capabilities are asked on the caller's loop. No runtime of its own, nothing that breaks a
fork: it runs in the caller's process (``needs_isolation`` is False), as aiobotocore.
"""

from __future__ import annotations

import asyncio
import base64
import errno
import functools
import json
import logging
import random
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, NamedTuple, TypeVar
from urllib.parse import quote, urlsplit

from ...blocking import run_blocking
from ...checksum import crc
from ...errors import IntegrityError, MissingDependencyError, StorageError
from ...secrets import Secret
from ..commit import note_publication
from ..objstore.append import InOrder
from ..objstore.base import ObjectStoreSink
from ..objstore.errors import ErrorFields, ErrorVocabulary
from .auth import TokenSource
from .config import GcsSettings, parse_gs_uri, plan_chunks

log = logging.getLogger("asyncckpt")
T = TypeVar("T")

GCS_ERRORS = ErrorVocabulary(
    not_found=("notFound",),
    denied=("forbidden", "unauthorized", "authError", "accessDenied", "insufficientPermissions"),
    unavailable=("backendError", "rateLimitExceeded"),
    denied_hint=" (check the credential: backend option token or GOOGLE_OAUTH_ACCESS_TOKEN, or the "
    "service-account key's account and roles)",
)
_BACKOFF_BASE_S = 0.1
_BACKOFF_CAP_S = 5.0
#: statuses DELETE of a session may answer: 499 cancelled (GCS), 404/410 already gone
_CANCELLED = (200, 204, 404, 410, 499)


class _Library(NamedTuple):
    aiohttp: Any
    URL: Any


@functools.cache
def _aiohttp() -> _Library:
    """aiohttp (a dependency of aiobotocore; the ``gcs`` extra), imported on first use."""
    try:
        import aiohttp
        from yarl import URL
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise MissingDependencyError("aiohttp", "gcs", "backend 'gcs' (gs://)") from exc
    return _Library(aiohttp, URL)


class GcsHttpError(Exception):
    """An answer of the store that is not the one asked for (its JSON error, read)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"HTTP {status} {reason}: {message}")
        self.status, self.reason, self.message = status, reason, message
        self.sent: Mapping[str, str] = {}  # the request's headers (a refused token is in them)


def read_error(status: int, body: bytes) -> GcsHttpError:
    """GCS's ``{"error": {"code", "message", "errors": [{"reason"}]}}``, or the text it sent."""
    reason, message = "", body.decode(errors="replace").strip()[:300]
    try:
        err = json.loads(body)["error"]
        message = str(err.get("message") or "")[:300]
        reason = str((err.get("errors") or [{}])[0].get("reason") or "")
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        pass
    return GcsHttpError(status, reason.replace(" ", ""), message or "no message")


def crc32c_b64(value: int) -> str:
    """GCS's form of a CRC32C: base64 of its four big-endian bytes."""
    return base64.b64encode(value.to_bytes(4, "big")).decode()


def _crc_and_copy(piece: memoryview | bytes, running: int, copy: bool) -> tuple[int, bytes | None]:
    """The running CRC32C extended by ``piece``, and ``piece`` copied when asked (blocking)."""
    return crc(piece, running), bytes(piece) if copy else None


def _backoff(attempt: int) -> float:
    step = min(_BACKOFF_CAP_S, _BACKOFF_BASE_S * 2.0 ** (attempt - 1))
    return step / 2 + random.uniform(0, step / 2)


class GcsSink(ObjectStoreSink[GcsSettings]):
    """One object ``gs://bucket/key`` through the JSON API (resumable upload, ranged reads)."""

    backend = "gcs"
    scheme = "gs"
    container_word = "bucket"
    store_name = "Google Cloud Storage"
    error_vocabulary = GCS_ERRORS
    leftover_hint = (
        "GCS discards an unfinished resumable upload session by itself (after 7 days); nothing is "
        "visible and no call lists sessions"
    )
    #: chunks go one after the other; a second buffer is filled while the first is sent
    default_in_flight = 2

    @classmethod
    def import_library(cls) -> None:
        _aiohttp()

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> None:
        GcsSettings.resolve(options, env={"STORAGE_EMULATOR_HOST": "http://check.invalid"})

    @classmethod
    def parse_target(cls, uri: str) -> tuple[str, str]:
        return parse_gs_uri(uri)

    @classmethod
    def resolve_settings(cls, options: Mapping[str, Any]) -> GcsSettings:
        return GcsSettings.resolve(options)

    def __init__(self, uri: str, **kwargs: Any) -> None:
        super().__init__(uri, **kwargs)
        self.retries = 0
        self._session_uri: str | None = None  # the open resumable upload
        self._order = InOrder()
        self._crc = 0  # CRC32C of the bytes handed over so far, in object order
        self._final: bytes | None = None  # the last chunk, sent by complete()
        self._broken = False  # a chunk failed: the others wait for the abort
        # the generation a load's stat saw: every ranged read asks for it, so an object another
        # save replaces mid-load is refused by name instead of read half old, half new
        self._generation: str | None = None

    def plan_layout(self, size: int) -> int:
        return plan_chunks(size, self.part_size, self.options.chunk_size)

    def location(self) -> str:
        return f"endpoint {self.settings.endpoint_url}"

    # -- the transport -------------------------------------------------------------------
    async def _client(self) -> Any:
        """The store's one aiohttp session, made on first use, shared by its objects."""
        s = self.settings

        async def make() -> Any:
            lib = _aiohttp().aiohttp
            context = ssl.create_default_context(cafile=s.ca_bundle) if s.ca_bundle else None
            connector = lib.TCPConnector(limit=max(8, s.max_in_flight * 4), ssl=context if context else True)
            timeout = lib.ClientTimeout(
                total=None, sock_connect=s.connect_timeout, sock_read=s.request_timeout
            )
            return lib.ClientSession(connector=connector, timeout=timeout, auto_decompress=False)

        return await self.shared.enter(("gcs", s.endpoint_url), make)

    def _token_source(self) -> TokenSource | None:
        """The store's one source of tokens for a service-account key (None: no key in use)."""
        s = self.settings
        if s.service_account_key is None or s.client_email is None or s.token_uri is None:
            return None
        key, email, uri = s.service_account_key, s.client_email, s.token_uri
        timeout = (s.connect_timeout, s.request_timeout)
        return self.shared.get(("gcs-token", uri, email), lambda: TokenSource(key, email, uri, timeout))

    async def _headers(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        headers = dict(extra or {})
        token: Secret | None = self.settings.token
        source = self._token_source()
        if source is not None:
            try:
                token = await source.token(self.executor)
            except StorageError as exc:  # the token endpoint's refusal, with the object's context
                raise type(exc)(exc.errno, f"{self.what('get a token for')}: {exc.strerror}") from None
        if token is not None:
            headers["Authorization"] = f"Bearer {token.reveal()}"
        return headers

    def _url(self, text: str) -> Any:
        return _aiohttp().URL(text, encoded=True)  # names are quoted here, once

    def _object_url(self, *, media: bool = False) -> str:
        name = quote(self.key, safe="")
        pinned = f"&generation={self._generation}" if self._generation else ""
        return f"{self.settings.endpoint_url}/storage/v1/b/{self.bucket}/o/{name}" + (
            f"?alt=media{pinned}" if media else ""
        )

    async def _request(
        self,
        method: str,
        url: str,
        *,
        ok: tuple[int, ...] = (200,),
        data: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> tuple[int, Mapping[str, str], bytes]:
        """One request; an answer not in ``ok`` raises :class:`GcsHttpError` (aiohttp's own
        exceptions pass through: the boundary maps them)."""
        client = await self._client()
        for first in (True, False):
            try:
                sent = await self._headers(headers)
            except StorageError as exc:
                if method in ("POST", "PUT"):  # a commit that failed for its token sent nothing
                    note_publication(exc, self.uri, published=False)
                raise
            async with client.request(method, self._url(url), data=data, headers=sent) as r:
                body = await r.read()
                if r.status == 401 and first and self._token_refused(sent):
                    continue  # once, with a new token: the request was not carried out
                if r.status not in ok:
                    raise read_error(r.status, body)
                return r.status, r.headers, body
        raise AssertionError("unreachable")  # pragma: no cover

    def _token_refused(self, sent: Mapping[str, str]) -> bool:
        """GCS answered 401 to a key's token before its expiry (revoked): the token source
        forgets it, and the caller may send its request once more. False for a fixed token."""
        source = self._token_source()
        if source is None:
            return False
        source.refused(sent.get("Authorization", "").removeprefix("Bearer "))
        return True

    def transient(self, exc: BaseException) -> bool:
        """Worth another try: no answer, a timeout, a dropped connection, 5xx or 429."""
        if isinstance(exc, GcsHttpError):
            return exc.status >= 500 or exc.status == 429
        return isinstance(exc, (TimeoutError, _aiohttp().aiohttp.ClientError))

    async def _retrying(self, fn: Callable[[], Awaitable[T]]) -> T:
        """``await fn()`` up to ``max_attempts`` times while it fails transiently."""
        attempts = self.settings.max_attempts
        for attempt in range(1, attempts + 1):
            try:
                return await fn()
            except Exception as exc:
                if attempt >= attempts or not self.transient(exc):
                    raise
                log.debug("retrying after %s (attempt %d of %d)", type(exc).__name__, attempt, attempts)
            self.retries = (self.retries or 0) + 1
            await asyncio.sleep(_backoff(attempt))  # backoff between attempts, not a synchronisation
        raise AssertionError("unreachable")  # pragma: no cover

    def error_fields(self, exc: Exception) -> ErrorFields | None:
        if isinstance(exc, GcsHttpError):
            message = f"HTTP {exc.status}" + (f" {exc.reason}" if exc.reason else "") + f": {exc.message}"
            status = 403 if exc.status == 401 else exc.status  # both: the credential is refused
            return ErrorFields(exc.reason, message, status)
        lib = _aiohttp().aiohttp
        if isinstance(exc, lib.ClientConnectorError):
            return ErrorFields(message=f"{type(exc).__name__}: {exc}", unreachable=True)
        if isinstance(exc, TimeoutError):
            return ErrorFields(
                message=f"{type(exc).__name__}: no answer within request_timeout "
                f"{self.settings.request_timeout:g} s"
            )
        if isinstance(exc, (lib.ClientError, OSError)):
            return ErrorFields(message=f"{type(exc).__name__}: {exc}")
        return None  # not the transport's: a bug, which propagates unmapped

    # -- the resumable upload --------------------------------------------------------------
    async def open(self, size: int) -> None:
        self.layout(size)
        self._order = InOrder()
        self._crc, self._final, self._small, self._broken = 0, None, None, False
        if not self.single_put:
            self._session_uri = await self.guarded("start upload of", self._start_session, size)

    async def _start_session(self, size: int) -> str:
        s = self.settings
        url = (
            f"{s.endpoint_url}/upload/storage/v1/b/{self.bucket}/o"
            f"?uploadType=resumable&name={quote(self.key, safe='')}"
        )
        headers = {
            "Content-Type": "application/json; charset=UTF-8",
            "X-Upload-Content-Type": "application/octet-stream",
            "X-Upload-Content-Length": str(size),
        }
        body = json.dumps({"name": self.key, "contentType": "application/octet-stream"}).encode()
        _, answer, _ = await self._retrying(lambda: self._request("POST", url, data=body, headers=headers))
        location = answer.get("Location")
        if not location:
            raise GcsHttpError(200, "", "the resumable upload was opened without a session URI (Location)")
        # the session's path and query, on the endpoint configured: GCS answers the host the request
        # went to; fake-gcs-server its -external-url, which a proxy or relay in front of it is not
        where = urlsplit(location)
        return f"{s.endpoint_url}{where.path}?{where.query}"

    async def write_part(self, offset: int, data: memoryview) -> float | None:
        if self.single_put:
            self._small = bytes(data)
            return None
        await self._order.wait(offset)
        started = time.perf_counter()
        try:
            if self._broken:
                raise StorageError(
                    errno.EIO, self.what(f"write at offset {offset} of") + ": an earlier chunk failed"
                )
            for number, piece in self.parts_of(offset, data):
                at = (number - 1) * self.part_size
                final = at + len(piece) == self._size
                # off the loop: a CRC32C of a part, and the final part's copy (up to a chunk)
                self._crc, kept = await run_blocking(self.executor, _crc_and_copy, piece, self._crc, final)
                if final:
                    self._final = kept  # sent by complete(): nothing visible before
                else:
                    await self.guarded(f"write at offset {at} of", self._put_chunk, at, piece)
        except BaseException:
            self._broken = True
            raise
        finally:
            await self._order.advance(len(data))
        return self.record_part(started)

    async def _put_chunk(self, at: int, piece: memoryview | bytes, total: int | None = None) -> bytes:
        """PUT ``piece`` at ``at`` of the session; ``total``: the final chunk (sent with the
        object's CRC32C). Returns the answer's body (the object's JSON on the final one)."""
        assert self._session_uri is not None
        end = f"{at + len(piece) - 1}" if len(piece) else "*"
        headers = {
            "Content-Type": "application/octet-stream",
            "Content-Range": f"bytes {at}-{end}/{'*' if total is None else total}"
            if len(piece)
            else f"bytes */{total}",
        }
        if total is not None:
            headers["X-Goog-Hash"] = f"crc32c={crc32c_b64(self._crc)}"
        ok = (200, 201) if total is not None else (308,)
        _, answer, body = await self._request("PUT", self._session_uri, ok=ok, data=piece, headers=headers)
        if total is None:
            persisted = answer.get("Range", "")
            if persisted and persisted != f"bytes=0-{at + len(piece) - 1}":
                raise GcsHttpError(308, "", f"the store kept {persisted} of bytes 0-{at + len(piece) - 1}")
        return body

    async def complete(self) -> dict[str, float]:
        started = time.perf_counter()
        if self.single_put:
            return await self._put_small(started)
        if self._order.next != self._size or self._final is None:
            raise StorageError(
                errno.EIO, self.what("complete") + f": {self._order.next} of {self._size} B written"
            )
        final, self._final = self._final, None
        body = await self.guarded(
            "complete upload of", self._put_chunk, self._size - len(final), final, self._size
        )
        self._session_uri = None  # committed: nothing left to abort
        self._check_object(body, "complete upload of")
        await self._learn_etag(json.loads(body).get("etag"))
        return {"complete_s": time.perf_counter() - started}

    def _check_object(self, body: bytes, action: str) -> None:
        """The object GCS answers is the bytes sent: its CRC32C and size, compared here."""
        try:
            obj = json.loads(body)
        except ValueError:
            obj = {}
        got, want = obj.get("crc32c"), crc32c_b64(self._crc)
        if got != want or int(obj.get("size", -1)) != self._size:
            raise IntegrityError(
                self.what(action) + f": the store holds {obj.get('size')} B with CRC32C {got!r}, "
                f"but {self._size} B with CRC32C {want!r} were sent"
            )

    async def abort(self) -> None:
        self._small = self._final = None
        self._broken = True
        uri, self._session_uri = self._session_uri, None
        if uri is not None:
            await self._abort_quietly("a resumable upload session", self._cancel, uri)

    async def _cancel(self, uri: str) -> None:
        await self._retrying(lambda: self._request("DELETE", uri, ok=_CANCELLED))

    # -- whole objects -----------------------------------------------------------------------
    async def _put(self, data: bytes) -> str | None:
        self._crc = (await run_blocking(self.executor, _crc_and_copy, data, 0, False))[0]
        url = (
            f"{self.settings.endpoint_url}/upload/storage/v1/b/{self.bucket}/o"
            f"?uploadType=media&name={quote(self.key, safe='')}"
        )
        headers = {
            "Content-Type": "application/octet-stream",
            "X-Goog-Hash": f"crc32c={crc32c_b64(self._crc)}",
        }
        _, _, body = await self._retrying(lambda: self._request("POST", url, data=data, headers=headers))
        self._check_object(body, "put")
        etag = json.loads(body).get("etag")
        return str(etag) if etag is not None else None

    async def _get(self, offset: int, buf: memoryview) -> int:
        return await self._retrying(lambda: self._get_once(offset, buf))

    async def _get_once(self, offset: int, buf: memoryview) -> int:
        """One ranged ``alt=media`` read into ``buf`` (repeatable: a retry overwrites it)."""
        client = await self._client()
        ranged = {"Range": f"bytes={offset}-{offset + len(buf) - 1}"}
        try:
            return await self._get_into(client, ranged, offset, buf)
        except GcsHttpError as exc:
            if exc.status != 401 or not self._token_refused(exc.sent):
                raise
        return await self._get_into(client, ranged, offset, buf)  # once, with a new token

    async def _get_into(self, client: Any, ranged: Mapping[str, str], offset: int, buf: memoryview) -> int:
        headers = await self._headers(ranged)
        async with client.get(self._url(self._object_url(media=True)), headers=headers) as r:
            if r.status not in (200, 206):
                err = read_error(r.status, await r.read())
                if r.status == 404 and self._generation:
                    raise IntegrityError(
                        f"{self.uri!r} was replaced while it was being read: generation "
                        f"{self._generation}, which the load began with, is gone (another save "
                        "wrote this key meanwhile, or it was deleted); load it again"
                    ) from err
                err.sent = headers
                raise err
            if r.status == 200 and offset:  # the whole object, not the range: never misplace bytes
                raise GcsHttpError(200, "", f"the store ignored Range bytes={offset}-")
            n = 0
            async for piece in r.content.iter_chunked(1 << 20):
                take = min(len(piece), len(buf) - n)
                buf[n : n + take] = piece[:take]
                n += take
            return n

    async def _head(self) -> tuple[int, str | None]:
        _, _, body = await self._retrying(lambda: self._request("GET", self._object_url()))
        meta = json.loads(body)
        generation = meta.get("generation")
        self._generation = str(generation) if generation is not None else None
        return int(meta["size"]), meta.get("etag")

    async def _delete(self) -> None:
        await self._retrying(lambda: self._request("DELETE", self._object_url(), ok=(200, 204, 404)))

    async def _list(self, prefix: str) -> list[str]:
        base = f"{self.settings.endpoint_url}/storage/v1/b/{self.bucket}/o?prefix={quote(prefix, safe='')}"
        keys: list[str] = []
        token = ""
        while True:
            url = base + (f"&pageToken={quote(token, safe='')}" if token else "")
            _, _, body = await self._retrying(lambda u=url: self._request("GET", u))  # type: ignore[misc]
            page = json.loads(body)
            keys.extend(item["name"] for item in page.get("items", []))
            token = page.get("nextPageToken") or ""
            if not token:
                return keys

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out["upload"] = "resumable (JSON API), the final chunk sent at complete"
        out["crc32c"] = crc32c_b64(self._crc)
        source = self._token_source()
        if source is not None:
            out["token_refreshes"] = source.refreshes
        return out

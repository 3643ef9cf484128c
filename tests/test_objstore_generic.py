"""The object-store protocols (``asyncckpt/sinks/objstore/``) carry no S3: a store that is not S3
plugs in with its settings type and hooks alone, through either protocol.

The store here keeps objects as files under a root (scheme ``objtest://volume/key``). Two
libraries serve it, as two libraries would serve Azure Blob or GCS: obstore's ``LocalStore``
through the store-generic obstore sink (the append protocol), and a small multipart "library"
over files (create / upload_part / complete / abort, as S3's and Azure's block calls), through
the generic multipart protocol. Both run the sink contract and a checkpointer save and load.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import uuid
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from obstore.store import LocalStore

from asyncckpt import AsyncCheckpointer, ConfigError, StorageError, TargetNotFoundError
from asyncckpt.sinks import BACKENDS, SCHEMES, SinkOptions, make_sink, register_backend
from asyncckpt.sinks.objstore import ErrorFields, ErrorVocabulary, ObjectStoreSink, classify, multipart
from asyncckpt.sinks.objstore.obstore_common import ObstoreSink
from asyncckpt.units import MiB

from .conftest import checkpoint_data, generated, payload

CHUNK = 1 * MiB
SIZE = 2 * CHUNK + 12345  # three parts, the last one short


@dataclass(frozen=True)
class LocalSettings:
    """A store's typed settings: the generic layer reads ``part_size`` and ``describe()``;
    obstore's sink reads the transport fields."""

    root: Path
    part_size: int | None = None
    endpoint_url: str | None = None
    ca_bundle: str | None = None
    connect_timeout: float = 5.0
    request_timeout: float = 10.0
    max_in_flight: int = 2
    max_attempts: int = 1

    def describe(self) -> dict[str, Any]:
        return {"store_root": str(self.root)}


class LocalObjects(ObjectStoreSink[LocalSettings]):
    """The store's hooks, as ``S3SinkBase`` is S3's: target, settings, limits, messages."""

    scheme = "objtest"
    container_word = "volume"
    store_name = "objtest"
    error_vocabulary = ErrorVocabulary(not_found=("NoSuchThing",))

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> None:
        if set(options) != {"root"}:
            raise ConfigError(f"objtest takes backend_options {{'root'}}, got {sorted(options)}")

    @classmethod
    def parse_target(cls, uri: str) -> tuple[str, str]:
        parts = urlsplit(uri)
        if parts.scheme != cls.scheme or not parts.netloc or not parts.path.strip("/"):
            raise ConfigError(f"not an objtest URI: {uri!r}")
        return parts.netloc, parts.path.lstrip("/")

    @classmethod
    def resolve_settings(cls, options: Mapping[str, Any]) -> LocalSettings:
        return LocalSettings(Path(options["root"]))

    def plan_layout(self, size: int) -> int:
        return -(-size // self.part_size)

    def location(self) -> str:
        return f"root {self.settings.root}"

    @property
    def volume(self) -> Path:
        return self.settings.root / self.bucket


class ObstoreLocalSink(LocalObjects, ObstoreSink[LocalSettings]):
    """obstore's sink on a non-S3 obstore store: only the store is built here."""

    backend = "objtest-obstore"
    needs_isolation = False  # the test registers it in this process only

    def build_store(self) -> LocalStore:
        return LocalStore(self.volume, mkdir=True)


class FileMultipartSink(LocalObjects, multipart.MultipartSink[LocalSettings]):
    """A multipart library over files: parts under ``.uploads/<id>/``, joined at complete."""

    backend = "objtest-multipart"

    def error_fields(self, exc: Exception) -> ErrorFields | None:
        """The library's own code for a missing object, read in the store's vocabulary."""
        if isinstance(exc, FileNotFoundError):
            return ErrorFields(code="NoSuchThing", message=f"NoSuchThing: {exc.filename}")
        return super().error_fields(exc)

    def _upload_dir(self, upload_id: str) -> Path:
        return self.volume / ".uploads" / upload_id

    async def _create(self) -> str:
        upload_id = uuid.uuid4().hex
        await asyncio.to_thread(self._upload_dir(upload_id).mkdir, parents=True)
        return upload_id

    async def _upload_part(self, upload_id: str, number: int, body: memoryview) -> str:
        path = self._upload_dir(upload_id) / f"{number:05d}"
        await asyncio.to_thread(path.write_bytes, body)  # returns once written: body is not kept
        return hashlib.md5(body).hexdigest()

    def _join(self, upload_id: str, parts: list[tuple[int, str]]) -> None:
        temp = self.volume / f".{uuid.uuid4().hex}"
        with temp.open("wb") as out:
            for number, etag in parts:
                data = (self._upload_dir(upload_id) / f"{number:05d}").read_bytes()
                assert hashlib.md5(data).hexdigest() == etag
                out.write(data)
        (self.volume / self.key).parent.mkdir(parents=True, exist_ok=True)  # an object store has no folders
        os.replace(temp, self.volume / self.key)
        shutil.rmtree(self._upload_dir(upload_id))

    async def _complete(self, upload_id: str, parts: list[tuple[int, str]]) -> str | None:
        await asyncio.to_thread(self._join, upload_id, parts)
        return None  # no ETag: the protocol learns one by a HEAD

    async def _abort(self, upload_id: str) -> None:
        await asyncio.to_thread(shutil.rmtree, self._upload_dir(upload_id))

    async def _put(self, data: bytes) -> str | None:
        await asyncio.to_thread((self.volume / self.key).write_bytes, data)
        return hashlib.md5(data).hexdigest()

    def _read(self, offset: int, buf: memoryview) -> int:
        with (self.volume / self.key).open("rb") as f:
            f.seek(offset)
            return f.readinto(buf)

    async def _get(self, offset: int, buf: memoryview) -> int:
        return await asyncio.to_thread(self._read, offset, buf)

    async def _head(self) -> tuple[int, str | None]:
        stat = await asyncio.to_thread((self.volume / self.key).stat)
        return stat.st_size, f"{stat.st_mtime_ns}-{stat.st_size}"

    async def _delete(self) -> None:
        await asyncio.to_thread((self.volume / self.key).unlink, missing_ok=True)

    async def _list(self, prefix: str) -> list[str]:
        files = await asyncio.to_thread(lambda: [p for p in self.volume.rglob("*") if p.is_file()])
        keys = [str(p.relative_to(self.volume)) for p in files]
        return [k for k in keys if k.startswith(prefix) and not k.startswith(".")]


SINKS = [pytest.param(ObstoreLocalSink, id="obstore-append"), pytest.param(FileMultipartSink, id="multipart")]


@pytest.fixture
def executor() -> Iterator[ThreadPoolExecutor]:
    pool = ThreadPoolExecutor(max_workers=4)
    yield pool
    pool.shutdown(wait=True)


@dataclass
class Store:
    cls: type[LocalObjects]
    root: Path
    executor: ThreadPoolExecutor

    def sink(self, key: str) -> LocalObjects:
        options = SinkOptions(chunk_size=CHUNK, extra={"root": str(self.root)})
        return self.cls(f"objtest://vol/{key}", executor=self.executor, options=options)

    def published(self, key: str) -> bytes | None:
        path = self.root / "vol" / key
        return path.read_bytes() if path.exists() else None

    def files(self) -> list[str]:
        """Every file in the volume, the upload's staging files included."""
        return sorted(
            str(p.relative_to(self.root / "vol")) for p in (self.root / "vol").rglob("*") if p.is_file()
        )


@pytest.fixture(params=SINKS)
def store(request: pytest.FixtureRequest, tmp_path: Path, executor: ThreadPoolExecutor) -> Store:
    (tmp_path / "vol").mkdir()
    return Store(request.param, tmp_path, executor)


async def test_parts_out_of_order_become_visible_only_at_complete(store: Store) -> None:
    data = await payload(SIZE)
    view = memoryview(data)
    sink = store.sink("dir/obj")
    await sink.open(SIZE)
    offsets = list(range(0, SIZE, CHUNK))[::-1]
    await asyncio.gather(*(sink.write_part(o, view[o : o + CHUNK]) for o in offsets))
    assert await asyncio.to_thread(store.published, "dir/obj") is None
    await sink.complete()
    facts = sink.describe()
    await sink.aclose()
    assert await asyncio.to_thread(store.published, "dir/obj") == bytes(data)
    assert await asyncio.to_thread(store.files) == ["dir/obj"]  # no upload left behind
    assert facts["parts"] == 3 and facts["single_put"] is False and facts["etag"]
    assert facts["store_root"] == str(store.root)  # the store's settings describe themselves

    reader = store.sink("dir/obj")
    assert await reader.size() == SIZE
    buf = bytearray(4096)
    assert await reader.read_into(CHUNK - 1000, memoryview(buf)) == 4096  # across a part boundary
    assert bytes(buf) == bytes(data[CHUNK - 1000 : CHUNK + 3096])
    assert await reader.read_into(SIZE, memoryview(buf)) == 0
    assert await store.sink("dir").list_names() == ["obj"]
    await reader.delete()
    await reader.aclose()
    assert await asyncio.to_thread(store.published, "dir/obj") is None


async def test_abort_leaves_nothing_and_a_small_object_is_one_put(store: Store) -> None:
    data = await payload(SIZE)
    sink = store.sink("aborted")
    await sink.open(SIZE)
    await sink.write_part(0, memoryview(data)[:CHUNK])
    await sink.abort()
    await sink.abort()  # idempotent
    await sink.aclose()
    assert await asyncio.to_thread(store.files) == []

    small = store.sink("small")
    await small.open(1000)
    await small.write_part(0, memoryview(data)[:1000])
    assert await asyncio.to_thread(store.published, "small") is None
    timings = await small.complete()
    await small.aclose()
    assert "put_s" in timings and small.describe()["single_put"] is True
    assert await asyncio.to_thread(store.published, "small") == bytes(data[:1000])


async def test_errors_are_mapped_and_named_in_the_stores_terms(store: Store) -> None:
    sink = store.sink("missing")
    with pytest.raises(TargetNotFoundError) as info:
        await sink.size()
    await sink.aclose()
    assert f"stat objtest://vol/missing ({store.cls.backend}, root {store.root})" in str(info.value)
    with pytest.raises(ConfigError, match=r"must name an objtest://volume/prefix, not a whole volume"):
        store.cls.check_root("objtest://vol")


def test_each_store_classifies_by_its_own_codes() -> None:
    azure_like = ErrorVocabulary(not_found=("BlobNotFound",), denied=("AuthorizationFailure",))
    what = "stat az://c/k"
    assert isinstance(classify(ErrorFields(code="BlobNotFound"), what, azure_like), TargetNotFoundError)
    denied = classify(ErrorFields(code="AuthorizationFailure"), what, azure_like)
    assert denied.errno == 13  # EACCES: StoragePermissionError
    # a store without codes classifies by status alone: no empty pattern that matches anything
    plain = classify(ErrorFields(code="Whatever", message="m"), what, ErrorVocabulary())
    assert type(plain) is StorageError
    assert isinstance(classify(ErrorFields(status=404), what, ErrorVocabulary()), TargetNotFoundError)
    unavailable = classify(ErrorFields(status=503), what, ErrorVocabulary())
    assert "503" in str(unavailable)


@pytest.fixture
def registered(store: Store) -> Iterator[Store]:
    saved_b, saved_s = dict(BACKENDS), dict(SCHEMES)
    register_backend(store.cls.backend, store.cls, scheme="objtest")
    yield store
    BACKENDS.clear(), BACKENDS.update(saved_b)
    SCHEMES.clear(), SCHEMES.update(saved_s)


async def test_a_checkpointer_saves_and_loads_through_a_non_s3_store(registered: Store) -> None:
    store = registered
    options = {"root": str(store.root)}
    routed = make_sink(
        "objtest://vol/x", backend=None, executor=store.executor, options=SinkOptions(extra=options)
    )
    assert isinstance(routed, store.cls)  # the scheme routes to the store's sink
    async with AsyncCheckpointer(
        chunk_size=CHUNK, num_buffers=2, seed=3, backend=store.cls.backend, backend_options=options
    ) as ckpt:
        saved = await ckpt.save("objtest://vol/ckpt/obj", SIZE)
        loaded = await ckpt.load("objtest://vol/ckpt/obj")
    assert saved.size_bytes == SIZE and loaded.size_bytes == SIZE
    raw = await asyncio.to_thread(store.published, "ckpt/obj")
    assert raw is not None and checkpoint_data(raw) == await generated(SIZE, CHUNK, 3)

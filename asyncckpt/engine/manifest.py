"""The manifest: what a load needs to prove a checkpoint, read FIRST by every load.

It holds size, chunk size, how the bytes were made (generator + seed, or caller data), one
CRC32C per chunk, the whole-object CRC32C and backend facts. A save with ``integrity="none"``
computes no checksum: its manifest says ``"integrity": "none"`` instead of listing CRCs, in
format version 2, so a reader from before that version refuses it by version rather than
taking a missing checksum for a corrupt object; checksummed saves still write version 1.
Saves seal it into the object's footer (:mod:`asyncckpt.engine.seal`), so one atomic commit
publishes both. Saves of asyncckpt < 0.2
wrote it as a sidecar ``<uri>.manifest.json`` with the object's identity (ETag, file
identity); loads still read those. An object with neither is an unfinished save or not
asyncckpt's, and a load says so instead of trusting it.
"""

from __future__ import annotations

import json
import posixpath
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any
from urllib.parse import urlsplit

from .. import modes
from ..checksum import ALGORITHM, combine_all
from ..errors import ManifestError, ManifestMissingError, TargetNotFoundError
from ..results.metrics import ChunkRecord
from ..sinks.base import Sink
from ..sinks.small import read_upto
from .manifest_schema import manifest_fields

FORMAT = "asyncckpt-manifest"
VERSION = 2  # the newest format this reader knows (it reads 1 too)
#: the format version a save writes: the lowest that can say what it did (readers before
#: version 2 keep reading checksummed saves; version 2 is needed to say "no checksums")
WRITTEN_VERSION: dict[str, int] = {"crc32c": 1, "none": 2}
SUFFIX = ".manifest.json"
MAX_MANIFEST_BYTES = 64 * 2**20  # 16 bytes per chunk: far beyond any real checkpoint
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"  # fixed width: a sealed footer is sized before the save ends
#: describe() keys that identify one published version of an object
IDENTITY_KEYS = ("identity", "etag")

SinkMaker = Callable[[str], Sink]


def manifest_uri(uri: str) -> str:
    """The sidecar's URI: the object's URI with ``.manifest.json`` appended."""
    return uri + SUFFIX


def object_name(uri: str) -> str:
    """Last path segment of a path or URI (names the object inside its manifest)."""
    path = urlsplit(uri).path if "://" in uri or uri.startswith("file:") else uri
    return posixpath.basename(path.rstrip("/"))


@dataclass(frozen=True, kw_only=True)
class Manifest:
    """What a save promises about its object."""

    object: str
    size: int
    chunk_size: int
    generator: str  # "dgen", "numpy" or "caller"
    seed: int | None
    chunk_crc32c: tuple[int, ...]  # empty when integrity is "none"
    object_crc32c: int | None  # None when integrity is "none"
    backend: dict[str, Any] = field(default_factory=dict)
    created: str = ""
    writer: str = "asyncckpt"
    integrity: modes.Integrity = "crc32c"
    version: int = 1

    @property
    def chunks(self) -> int:
        return -(-self.size // self.chunk_size)

    @property
    def checksummed(self) -> bool:
        """Whether the save recorded CRC32Cs (a checksum verification is possible)."""
        return self.integrity == "crc32c"

    def chunk_span(self, index: int) -> tuple[int, int]:
        """(offset, length) of manifest chunk ``index``."""
        offset = index * self.chunk_size
        return offset, min(self.chunk_size, self.size - offset)

    def identity(self) -> dict[str, Any]:
        return {k: self.backend[k] for k in IDENTITY_KEYS if k in self.backend}

    def to_json(self) -> bytes:
        data = asdict(self)
        data["format"] = FORMAT
        chunks, whole = data.pop("chunk_crc32c"), data.pop("object_crc32c")
        if self.version < 2:  # version 1 has no integrity field: it always carries checksums
            del data["integrity"]
        if self.checksummed:
            data["checksum"] = {
                "algorithm": ALGORITHM,
                "chunks": [f"{c:08x}" for c in chunks],
                "object": f"{whole:08x}",
            }
        return json.dumps(data, indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes, where: str) -> Manifest:
        """Parse and validate (strict schema: manifest_schema); every defect is a ManifestError
        naming ``where``, raised before anything is allocated for the manifest's values."""
        try:
            data = json.loads(raw)
            kwargs = manifest_fields(data, [f.name for f in fields(cls)], format_name=FORMAT, newest=VERSION)
        except (ValueError, RecursionError) as exc:  # incl. JSONDecodeError, UnicodeDecodeError
            raise ManifestError(f"manifest {where!r} is unreadable: {exc}") from None
        return cls(**kwargs)


def manifest_for(
    uri: str,
    *,
    size: int,
    chunk_size: int,
    source: dict[str, Any],
    backend: dict[str, Any],
    chunk_crc32c: tuple[int, ...],
    object_crc32c: int | None,
    created: str,
    integrity: modes.Integrity = "crc32c",
) -> Manifest:
    """The manifest of a save of ``size`` bytes to ``uri`` with the given checksums (none
    with ``integrity="none"``)."""
    return Manifest(
        object=object_name(uri),
        size=size,
        chunk_size=chunk_size,
        generator=str(source.get("generator", "caller")),
        seed=source.get("seed"),
        chunk_crc32c=chunk_crc32c,
        object_crc32c=object_crc32c,
        backend={k: v for k, v in backend.items() if isinstance(v, (str, int, float, bool, dict, list))},
        created=created,
        integrity=integrity,
        version=WRITTEN_VERSION[integrity],
    )


def build_manifest(
    uri: str,
    *,
    size: int,
    chunk_size: int,
    records: Sequence[ChunkRecord],
    source: dict[str, Any],
    backend: dict[str, Any],
    integrity: modes.Integrity = "crc32c",
) -> Manifest:
    """The manifest of a finished save, from the checksums its pipeline recorded (with
    ``integrity="none"`` it recorded none, and the manifest says so)."""
    ordered = sorted(records, key=lambda r: r.offset)
    if sum(r.nbytes for r in ordered) != size:
        raise RuntimeError(f"save records cover {sum(r.nbytes for r in ordered)} of {size} bytes")
    if integrity == "none":
        return manifest_for(
            uri, size=size, chunk_size=chunk_size, source=source, backend=backend, chunk_crc32c=(),
            object_crc32c=None, created=time.strftime(TIME_FORMAT, time.gmtime()), integrity="none",
        )  # fmt: skip
    missing = [r.index for r in ordered if r.checksum is None]
    if missing:
        raise RuntimeError(f"save records do not cover {size} bytes with checksums (missing {missing[:5]})")
    crcs = tuple(int(r.checksum or 0) for r in ordered)
    return manifest_for(
        uri,
        size=size,
        chunk_size=chunk_size,
        source=source,
        backend=backend,
        chunk_crc32c=crcs,
        object_crc32c=combine_all((c, r.nbytes) for c, r in zip(crcs, ordered, strict=True)),
        created=time.strftime(TIME_FORMAT, time.gmtime()),
    )


async def read_manifest(sink: Sink, object_uri: str) -> Manifest:
    """Read and validate the sidecar; a missing one means the save never finished."""
    where = sink.uri
    try:
        size = await sink.size()
    except TargetNotFoundError:
        raise ManifestMissingError(
            f"checkpoint {object_uri!r} has no manifest: the object does not end with one (it was "
            f"truncated, or not written by asyncckpt) and no sidecar {where!r} exists"
        ) from None
    if not 0 < size <= MAX_MANIFEST_BYTES:
        raise ManifestError(f"manifest {where!r} has an implausible size of {size} bytes")
    raw = await read_upto(sink, size)
    if len(raw) < size:
        raise ManifestError(f"manifest {where!r} ended after {len(raw)} of {size} bytes")
    return Manifest.from_json(raw, where)

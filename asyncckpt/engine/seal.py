"""The sealed object: a checkpoint that carries its own manifest, published in one atomic step.

Layout: the data, zeros up to the next 4 KiB boundary, the manifest's JSON padded with spaces,
and a 32-byte trailer at the very end (magic, manifest offset, manifest length). The region
after the data has a size fixed when the save opens (every varying manifest field has a fixed
width), so the object's size is known up front (fallocate, S3 part plan) and the footer goes
out with the last data chunk. The backend's commit (rename, CompleteMultipartUpload, closing
an append stream) then publishes data and manifest together: no instant exists at which one
is visible without the other, which a sidecar manifest could not promise.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .. import modes
from ..blocking import read_full
from ..errors import ManifestError
from ..results.metrics import ChunkRecord
from ..sinks.base import Sink
from .manifest import Manifest, build_manifest, manifest_for

ALIGN = 4096
MAGIC = b"asyncckpt-seal-1"
_TRAILER = struct.Struct("<16sQQ")
TRAILER_SIZE = _TRAILER.size  # 32
#: a footer read in one request when it fits (a manifest is 9 bytes per chunk plus ~400)
TAIL_READ = 1 << 20
PLACEHOLDER_TIME = "0000-00-00T00:00:00Z"  # as wide as every time build_manifest writes


def align_up(n: int, to: int = ALIGN) -> int:
    return -(-n // to) * to


@dataclass(frozen=True)
class Seal:
    """The footer geometry of one save: where it starts and how long it is."""

    data_size: int
    region: int  # bytes from the aligned end of the data to the end of the object

    @property
    def offset(self) -> int:
        """Where the manifest starts: the data's end, rounded up to a 4 KiB boundary."""
        return align_up(self.data_size)

    @property
    def object_size(self) -> int:
        return self.offset + self.region

    @classmethod
    def for_manifest(cls, template: Manifest) -> Seal:
        """Size the footer from a manifest whose checksums are placeholders (same width)."""
        return cls(template.size, align_up(len(template.to_json()) + TRAILER_SIZE))

    def footer(self, manifest: Manifest) -> bytes:
        """Exactly ``region`` bytes: the JSON, spaces, then the trailer."""
        raw = manifest.to_json()
        room = self.region - TRAILER_SIZE
        if len(raw) > room:
            raise RuntimeError(
                f"manifest of {len(raw)} B does not fit the {room} B sized when the save opened"
            )
        return raw + b" " * (room - len(raw)) + _TRAILER.pack(MAGIC, self.offset, len(raw))

    def tail(self, data: memoryview, footer: bytes) -> bytes:
        """The bytes from the last data chunk's start to the object's end (zeros pad the gap)."""
        return bytes(data) + bytes(align_up(len(data)) - len(data)) + footer


@dataclass(frozen=True)
class Sealer:
    """What the pipeline needs to seal one object: its geometry and the manifest builder."""

    seal: Seal
    build: Callable[[Sequence[ChunkRecord]], Manifest]

    def footer(self, records: Sequence[ChunkRecord]) -> bytes:
        return self.seal.footer(self.build(records))


def locate(tail: bytes, object_size: int, where: str) -> tuple[int, int] | None:
    """(offset, length) of the manifest from an object's last bytes, or None if unsealed."""
    if object_size < TRAILER_SIZE or len(tail) < TRAILER_SIZE:
        return None
    magic, offset, length = _TRAILER.unpack(tail[-TRAILER_SIZE:])
    if magic != MAGIC:
        return None
    if offset % ALIGN or not 0 < length <= object_size - TRAILER_SIZE - offset:
        raise ManifestError(
            f"the footer of {where!r} is inconsistent: manifest at {offset}, {length} B, "
            f"object {object_size} B"
        )
    return offset, length


def check_geometry(manifest: Manifest, offset: int, where: str) -> None:
    """The manifest must describe exactly the data in front of its footer."""
    if align_up(manifest.size) != offset:
        raise ManifestError(
            f"the manifest sealed into {where!r} describes {manifest.size} B of data, but its footer "
            f"starts at {offset}: the object was altered after the save"
        )


@dataclass(frozen=True)
class SealSpec:
    """What a save's manifest says of it, all known before its first byte is written."""

    uri: str
    size: int
    chunk_size: int
    source: dict[str, Any]
    backend: str
    integrity: modes.Integrity = "crc32c"


def template_for(spec: SealSpec) -> Manifest:
    """The manifest a save will seal, with placeholder checksums (none without integrity):
    sized before any byte is written."""
    summed = spec.integrity == "crc32c"
    return manifest_for(
        spec.uri,
        size=spec.size,
        chunk_size=spec.chunk_size,
        source=spec.source,
        backend={"backend": spec.backend},
        chunk_crc32c=(0,) * -(-spec.size // spec.chunk_size) if summed else (),
        object_crc32c=0 if summed else None,
        created=PLACEHOLDER_TIME,
        integrity=spec.integrity,
    )


def sealer_for(spec: SealSpec) -> Sealer:
    """The footer geometry and manifest builder of one save."""

    def build(records: Sequence[ChunkRecord]) -> Manifest:
        return build_manifest(
            spec.uri,
            size=spec.size,
            chunk_size=spec.chunk_size,
            records=records,
            source=spec.source,
            backend={"backend": spec.backend},
            integrity=spec.integrity,
        )

    return Sealer(Seal.for_manifest(template_for(spec)), build)


def tail_read_size(object_size: int, want: int = TAIL_READ) -> int:
    """Bytes a load reads to find the footer: ``want`` or more, from a page boundary on."""
    return object_size - (max(object_size - want, 0) // ALIGN * ALIGN)


async def read_tail(sink: Sink, object_size: int, want: int) -> bytes:
    """At least the last ``want`` bytes of the object (all of a smaller one), from a page
    boundary on (so a load that evicts what it read leaves no partial page cached)."""
    n = tail_read_size(object_size, want)
    raw = bytearray(n)
    got = await read_full(sink.read_into, object_size - n, memoryview(raw))
    return bytes(raw[:got])


async def read_sealed(sink: Sink, object_size: int, where: str) -> Manifest | None:
    """The manifest sealed into the object, or None if it carries none (a legacy save)."""
    tail = await read_tail(sink, object_size, TAIL_READ)
    found = locate(tail, object_size, where)
    if found is None:
        return None
    offset, length = found
    start = offset - (object_size - len(tail))
    if start >= 0:
        raw = tail[start : start + length]
    else:  # a manifest larger than the first read: fetch the rest
        raw = (await read_tail(sink, object_size, object_size - offset))[:length]
    manifest = Manifest.from_json(raw, f"{where} (sealed manifest)")
    check_geometry(manifest, offset, where)
    return manifest


def unseal(raw: bytes, where: str = "object") -> tuple[bytes, Manifest]:
    """(data, manifest) of a sealed object held in memory, e.g. fetched by another tool."""
    found = locate(raw, len(raw), where)
    if found is None:
        raise ManifestError(f"{where!r} does not end with an asyncckpt footer")
    offset, length = found
    manifest = Manifest.from_json(raw[offset : offset + length], where)
    check_geometry(manifest, offset, where)
    return raw[: manifest.size], manifest

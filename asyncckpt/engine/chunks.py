"""Per-chunk CRC32C of a state object, computed before the save so the header can go first.

The chunks are the object's own ``chunk_size`` chunks (object offsets ``k * chunk_size``,
the pipeline's write chunks), restricted to the data buffer: the header that stores these
CRCs cannot be covered by them (it has its own CRC). Chunk ``k`` of the object then has
the CRC ``combine(crc(header part), crc(data part))``, so a load rebuilds an ordinary
whole-object manifest from the header alone, and the save compares the pipeline's own
per-chunk CRCs with the same values: a caller that changed its arrays during a
``staging="none"`` save is caught before the object is published.

The header's chunks are *checksum blocks* of ``block_size(chunk_size)`` bytes (256 KiB, or
a divisor of an odd chunk size), not the pipeline's chunks: a partial load (some tensors, one
box of a shard) then reads and verifies the blocks it touches instead of whole 32 MiB chunks.
256 KiB: a box read on its own costs at most one block more at each end (4 MiB boxes: at most
1.125x the bytes), while the header grows by 9 bytes per block (360 KB for 10 GiB). The
pipeline's chunk CRCs are the blocks' combined (:func:`coarsen`). Objects saved
before this recorded ``chunk_size`` blocks, which read the same way.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..checksum import combine, combine_all, crc
from ..errors import StateFormatError
from .manifest import Manifest, object_name

#: the checksum granularity of new state objects: what a partial read rounds out to
CHECK_BLOCK = 256 << 10


def block_size(chunk: int) -> int:
    """The checksum block of a state saved with pipeline chunks of ``chunk`` bytes: it divides
    the chunk (so chunk CRCs combine from block CRCs) and is a multiple of 4096 (aligned reads)."""
    return math.gcd(chunk, CHECK_BLOCK)


def coarsen(crcs: Sequence[int], size: int, block: int, chunk: int) -> tuple[int, ...]:
    """Per-``chunk`` CRCs of an object from its per-``block`` CRCs (``block`` divides ``chunk``)."""
    per = chunk // block
    out = []
    for first in range(0, len(crcs), per):
        parts = [(crcs[i], min(block, size - i * block)) for i in range(first, min(first + per, len(crcs)))]
        out.append(combine_all(parts))
    return tuple(out)


def data_chunk_count(data_start: int, size: int, chunk: int) -> int:
    """How many object chunks hold at least one data byte."""
    if size <= data_start:
        return 0
    return -(-size // chunk) - data_start // chunk


def data_chunk_crcs(views: Sequence[memoryview], data_start: int, chunk: int) -> list[int]:
    """CRC32C of each object chunk's data part; ``views`` are the data buffer in order.

    Blocking (run it in a worker thread): the CRC releases the GIL, ≈ 16-20 GB/s per core.
    """
    out: list[int] = []
    running, pos, open_chunk = 0, data_start, False
    for view in views:
        off = 0
        while off < len(view):
            boundary = (pos // chunk + 1) * chunk
            take = min(len(view) - off, boundary - pos)
            running = crc(view[off : off + take], running)
            pos, off, open_chunk = pos + take, off + take, True
            if pos == boundary:
                out.append(running)
                running, open_chunk = 0, False
    if open_chunk:
        out.append(running)
    return out


def object_chunk_crcs(
    prefix: bytes | bytearray | memoryview, data_crcs: Sequence[int], size: int, chunk: int
) -> tuple[int, ...]:
    """The pipeline's per-chunk CRCs of the whole object, from the header bytes and data CRCs."""
    data_start = len(prefix)
    if len(data_crcs) != data_chunk_count(data_start, size, chunk):
        raise StateFormatError(
            f"{len(data_crcs)} data checksums for an object of {size} bytes in {chunk}-byte chunks "
            f"(data from offset {data_start}): expected {data_chunk_count(data_start, size, chunk)}"
        )
    out = []
    data = iter(data_crcs)
    for start in range(0, size, chunk):
        end = min(start + chunk, size)
        head = crc(memoryview(prefix)[start : min(end, data_start)]) if start < data_start else 0
        data_len = end - max(start, data_start)
        out.append(combine(head, next(data), data_len) if data_len > 0 else head)
    return tuple(out)


def encode(crcs: Sequence[int]) -> str:
    return ",".join(f"{c:08x}" for c in crcs)


def decode(text: str, where: str) -> list[int]:
    if not text:
        return []
    try:
        values = [int(part, 16) for part in text.split(",")]
    except ValueError:
        raise StateFormatError(f"{where}: asyncckpt.crc32c is not a list of hex CRCs") from None
    if any(not 0 <= v < 2**32 for v in values):
        raise StateFormatError(f"{where}: asyncckpt.crc32c holds a value that is not a CRC32C")
    return values


def manifest_of(uri: str, size: int, chunk: int, crcs: Sequence[int]) -> Manifest:
    """An in-memory manifest of the object, so the ordinary load verifier checks it."""
    return Manifest(
        object=object_name(uri),
        size=size,
        chunk_size=chunk,
        generator="caller",
        seed=None,
        chunk_crc32c=tuple(crcs),
        object_crc32c=combine_all((c, min(chunk, size - i * chunk)) for i, c in enumerate(crcs)),
    )

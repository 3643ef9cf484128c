"""CRC32C checksums: per chunk in the pipeline, combined into a whole-object value pass-free.

``crc32c`` (the package) is hardware accelerated (SSE4.2/ARMv8) and releases the GIL:
measured ≈ 20 GB/s on one core here, so checking never becomes the bottleneck of a
storage measurement. CRC32C is also the checksum S3 understands natively.

The whole-object CRC is *combined* from the chunk CRCs (zlib's ``crc32_combine`` algorithm
in GF(2)), so no second pass over the data is needed and chunks may be checked out of order.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from functools import lru_cache

import crc32c as _crc32c

ALGORITHM = "crc32c"
_POLY = 0x82F63B78  # CRC32C (Castagnoli), reflected


def crc(data: memoryview | bytes, value: int = 0) -> int:
    """CRC32C of ``data``, continuing from ``value`` (releases the GIL)."""
    return int(_crc32c.crc32c(data, value=value))


def timed_crc(data: memoryview) -> tuple[int, float, float]:
    """(CRC32C, seconds, CPU seconds of the thread) measured inside the calling (worker) thread."""
    cpu = time.thread_time()
    start = time.perf_counter()
    value = crc(data)
    seconds = time.perf_counter() - start
    return value, seconds, time.thread_time() - cpu


def _times(matrix: tuple[int, ...], vec: int) -> int:
    out = 0
    i = 0
    while vec:
        if vec & 1:
            out ^= matrix[i]
        vec >>= 1
        i += 1
    return out


def _square(matrix: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(_times(matrix, matrix[n]) for n in range(32))


@lru_cache(maxsize=64)
def _shift_operator(length: int) -> tuple[int, ...]:
    """The GF(2) matrix that appends ``length`` zero bytes to a CRC register."""
    odd = (_POLY, *(1 << n for n in range(31)))  # one zero bit
    even = _square(odd)  # two zero bits
    odd = _square(even)  # four zero bits
    result: tuple[int, ...] | None = None
    n = length
    while n:
        even = _square(odd)  # first pass: one zero byte
        if n & 1:
            result = even if result is None else tuple(_times(even, result[i]) for i in range(32))
        n >>= 1
        if not n:
            break
        odd = _square(even)
        if n & 1:
            result = odd if result is None else tuple(_times(odd, result[i]) for i in range(32))
        n >>= 1
    return result if result is not None else tuple(1 << n for n in range(32))


@lru_cache(maxsize=64)
def _byte_tables(length: int) -> tuple[tuple[int, ...], ...]:
    """The shift operator of ``length`` applied to every value of each byte of the register:
    four lookups instead of a 32-step product per combine (a state object combines one CRC
    per 256 KiB block: 40 000 for 10 GiB)."""
    m = _shift_operator(length)
    return tuple(tuple(_times(m, b << (8 * k)) for b in range(256)) for k in range(4))


def combine(crc1: int, crc2: int, len2: int) -> int:
    """CRC of A+B from CRC(A), CRC(B) and len(B). Cached per length: ~µs for equal chunks."""
    if len2 <= 0:
        return crc1
    t0, t1, t2, t3 = _byte_tables(len2)
    return t0[crc1 & 255] ^ t1[(crc1 >> 8) & 255] ^ t2[(crc1 >> 16) & 255] ^ t3[crc1 >> 24] ^ crc2


def combine_all(parts: Iterable[tuple[int, int]]) -> int:
    """Whole-object CRC from (crc, length) pairs in object order."""
    total = 0
    for value, length in parts:
        total = combine(total, value, length)
    return total

"""Checking loaded bytes against the manifest, chunk by chunk, in object order.

Two ways: ``checksum`` recomputes each manifest chunk's CRC32C (any data, ≈ 20 GB/s);
``regenerate`` rebuilds synthetic bytes from the manifest's generator, seed and chunk size
and compares every byte (names the exact first bad byte). Reads of any size are split at
manifest-chunk boundaries, so ``read_chunk_size`` need not equal the save's chunk size.
``check_sync`` runs in a worker thread (the CRC and memcmp release the GIL); calls arrive in
object order, one at a time.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import numpy as np

from ..checksum import combine_all, crc
from ..errors import ConfigError, ManifestError, UnverifiableError
from ..pool import buffer_address, close_mapping
from ..sources import make_source
from ..sources.base import ThreadedSource
from .manifest import Manifest

SYNTHETIC = ("dgen", "numpy")
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
_libc.memcmp.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
_libc.memcmp.restype = ctypes.c_int


class Mismatch(NamedTuple):
    """Where a check failed: manifest chunk, and the first bad byte when it is known."""

    chunk: int
    offset: int | None


def first_difference(a: memoryview, b: memoryview) -> int | None:
    """Index of the first differing byte (memcmp releases the GIL), or None if equal."""
    if not len(a) or _libc.memcmp(buffer_address(a), buffer_address(b), len(a)) == 0:
        return None
    diff = np.flatnonzero(np.frombuffer(a, np.uint8) != np.frombuffer(b, np.uint8))
    return int(diff[0])


def segments(manifest: Manifest, offset: int, length: int) -> Iterator[tuple[int, int, int, int]]:
    """Split [offset, offset+length) at manifest chunks: (chunk, offset within it, pos, take)."""
    pos = 0
    while pos < length:
        chunk = (offset + pos) // manifest.chunk_size
        start, size = manifest.chunk_span(chunk)
        within = offset + pos - start
        take = min(length - pos, size - within)
        yield chunk, within, pos, take
        pos += take


def runs(manifest: Manifest, offset: int, length: int) -> Iterator[tuple[int, int, int, int, int]]:
    """:func:`segments` with each stretch of whole chunks merged: (chunk, offset within it,
    pos, take, count); ``count`` whole chunks from ``chunk`` on, or 0 for a part of one."""
    run: list[int] | None = None  # chunk, pos, take, count of the stretch being merged
    for chunk, within, pos, take in segments(manifest, offset, length):
        if within == 0 and take == manifest.chunk_span(chunk)[1]:
            if run is None:
                run = [chunk, pos, take, 1]
            else:
                run[2] += take
                run[3] += 1
            continue
        if run is not None:
            yield run[0], 0, run[1], run[2], run[3]
            run = None
        yield chunk, within, pos, take, 0
    if run is not None:
        yield run[0], 0, run[1], run[2], run[3]


def first_bad(manifest: Manifest, view: memoryview, chunk: int, count: int) -> Mismatch | None:
    """The first of ``count`` whole chunks from ``chunk`` on, laid end to end in ``view``,
    whose CRC32C differs from the manifest's. One CRC over all of them, compared with the
    manifest's CRCs combined: each CRC call gives up the GIL and must win it back, which with
    other threads busy costs more than the CRC of a 256 KiB block itself. Only a mismatch
    is looked for chunk by chunk."""
    crcs = manifest.chunk_crc32c
    spans = [manifest.chunk_span(c)[1] for c in range(chunk, chunk + count)]
    if crc(view) == combine_all(zip(crcs[chunk : chunk + count], spans, strict=True)):
        return None
    pos = 0
    for c, length in zip(range(chunk, chunk + count), spans, strict=True):
        if crc(view[pos : pos + length]) != crcs[c]:
            return Mismatch(c, None)
        pos += length
    return Mismatch(chunk, None)  # the bytes changed while checked: not verified


class Verifier(ABC):
    mode = "none"

    def __init__(self, manifest: Manifest) -> None:
        self.manifest = manifest
        self.position = 0  # next byte expected (calls arrive in order)

    def check_sync(self, offset: int, view: memoryview) -> tuple[Mismatch | None, float]:
        """Check the bytes at ``offset``; return (first mismatch or None, pure seconds)."""
        if offset != self.position:
            raise RuntimeError(f"verifier got offset {offset}, expected {self.position}")
        start = time.perf_counter()
        bad = self._check(offset, view)
        self.position += len(view)
        return bad, time.perf_counter() - start

    def helper_cpu(self) -> float:
        """Cumulative CPU seconds of threads a library runs for this verifier (0: none)."""
        return 0.0

    def check_cpu_sync(self, offset: int, view: memoryview) -> tuple[Mismatch | None, float, float]:
        """:meth:`check_sync` and the CPU seconds it took (its thread and helper threads)."""
        cpu = time.thread_time() + self.helper_cpu()
        bad, seconds = self.check_sync(offset, view)
        return bad, seconds, time.thread_time() + self.helper_cpu() - cpu

    @abstractmethod
    def _check(self, offset: int, view: memoryview) -> Mismatch | None: ...

    def finish_sync(self) -> None:  # noqa: B027 - optional hook
        """Checks that need the whole object (after the last chunk)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release scratch memory."""


class ChecksumVerifier(Verifier):
    """Per-chunk CRC32C against the manifest, then the combined whole-object CRC."""

    mode = "checksum"

    def __init__(self, manifest: Manifest) -> None:
        super().__init__(manifest)
        self._running = 0
        self.crcs: list[int] = []

    def _check(self, offset: int, view: memoryview) -> Mismatch | None:
        m = self.manifest
        for chunk, within, pos, take, count in runs(m, offset, len(view)):
            if count:
                bad = first_bad(m, view[pos : pos + take], chunk, count)
                if bad is not None:
                    return bad
                self.crcs.extend(m.chunk_crc32c[chunk : chunk + count])
                continue
            self._running = crc(view[pos : pos + take], 0 if within == 0 else self._running)
            if within + take == m.chunk_span(chunk)[1]:
                self.crcs.append(self._running)
                if self._running != m.chunk_crc32c[chunk]:
                    return Mismatch(chunk, None)
        return None

    def finish_sync(self) -> None:
        m = self.manifest
        whole = combine_all((c, m.chunk_span(i)[1]) for i, c in enumerate(self.crcs))
        if len(self.crcs) != m.chunks or whole != m.object_crc32c:
            raise ManifestError(
                f"every chunk matched, but the whole-object CRC32C {whole:08x} is not the manifest's "
                f"{m.object_crc32c:08x}: the manifest is internally inconsistent"
            )


class BlockVerifier(Verifier):
    """Per-chunk CRC32C of chosen ranges of an object (a partial load): the reads start on
    manifest-chunk boundaries and arrive in order within each range, and every chunk they
    touch is read whole and checked; nothing is known of the chunks not read."""

    mode = "checksum"

    def __init__(self, manifest: Manifest) -> None:
        super().__init__(manifest)
        self._running = 0
        self._open: int | None = None  # the chunk read in part so far
        self.checked = 0

    def check_sync(self, offset: int, view: memoryview) -> tuple[Mismatch | None, float]:
        start = time.perf_counter()
        bad = self._check(offset, view)
        return bad, time.perf_counter() - start

    def _check(self, offset: int, view: memoryview) -> Mismatch | None:
        for chunk, within, pos, take, count in runs(self.manifest, offset, len(view)):
            if count:
                self._open, self.position = None, offset + pos + take
                self.checked += count
                bad = first_bad(self.manifest, view[pos : pos + take], chunk, count)
                if bad is not None:
                    return bad
                continue
            if within == 0:
                self._running = 0
            elif self._open != chunk or self.position != offset + pos:
                raise RuntimeError(f"partial read of chunk {chunk} does not start on its boundary")
            self._running = crc(view[pos : pos + take], self._running)
            self._open, self.position = chunk, offset + pos + take
            if within + take == self.manifest.chunk_span(chunk)[1]:
                self._open = None
                self.checked += 1
                if self._running != self.manifest.chunk_crc32c[chunk]:
                    return Mismatch(chunk, None)
        return None

    def finish_sync(self) -> None:
        if self._open is not None:
            raise RuntimeError(f"partial read ended inside chunk {self._open}: it was not verified")

    def whole_reads(self, spans: Sequence[tuple[int, int]], piece: int) -> bool:
        """Whether ``spans`` read in ``piece``-byte reads gives every read whole chunks only:
        then each read can be checked on its own as it lands (:meth:`check_whole_cpu_sync`)."""
        block, end_all = self.manifest.chunk_size, self.manifest.size
        if piece % block:
            return False
        return all(
            start % block == 0 and ((start + length) % block == 0 or start + length == end_all)
            for start, length in spans
        )

    def check_whole_cpu_sync(self, offset: int, view: memoryview) -> tuple[Mismatch | None, float, float]:
        """The CRC32C of each whole chunk in ``view``, with no state shared between calls (reads
        in flight are checked at once, in any order); (first mismatch, seconds, CPU seconds)."""
        cpu, start = time.thread_time(), time.perf_counter()
        bad = None
        for chunk, _, pos, take, count in runs(self.manifest, offset, len(view)):
            if not count:
                raise RuntimeError(f"read at offset {offset} does not hold chunk {chunk} whole")
            bad = first_bad(self.manifest, view[pos : pos + take], chunk, count)
        return bad, time.perf_counter() - start, time.thread_time() - cpu


class RegenerateVerifier(Verifier):
    """Regenerates the synthetic stream (same generator, seed, chunk size) and compares bytes."""

    mode = "regenerate"

    def __init__(self, manifest: Manifest, *, threads: int) -> None:
        super().__init__(manifest)
        if manifest.generator not in SYNTHETIC or manifest.seed is None:
            raise ConfigError(
                f"verify='regenerate' needs synthetic data (generator {' or '.join(SYNTHETIC)} with a "
                f"seed); this checkpoint was made by {manifest.generator!r}: use verify=True (checksums)"
            )
        source = make_source(manifest.generator, manifest.size, seed=manifest.seed, threads=threads)
        assert isinstance(source, ThreadedSource)
        self._source = source
        self._scratch = mmap.mmap(-1, min(manifest.chunk_size, manifest.size))  # never past the object
        self._expected = memoryview(self._scratch)
        self._have = -1
        self.regen_s = 0.0

    def helper_cpu(self) -> float:
        return self._source.helper_cpu()  # dgen-py regenerates on its own pool

    def _generate(self, chunk: int) -> None:
        while self._have < chunk:  # the stream depends on the fill sizes: one chunk per fill
            self._have += 1
            size = self.manifest.chunk_span(self._have)[1]
            start = time.perf_counter()
            if self._source.fill_sync(self._expected[:size]) != size:
                raise RuntimeError(f"regenerating chunk {self._have} produced too few bytes")
            self.regen_s += time.perf_counter() - start

    def _check(self, offset: int, view: memoryview) -> Mismatch | None:
        for chunk, within, pos, take in segments(self.manifest, offset, len(view)):
            if chunk < self._have:
                raise RuntimeError(f"chunk {chunk} requested after chunk {self._have}")
            self._generate(chunk)
            bad = first_difference(view[pos : pos + take], self._expected[within : within + take])
            if bad is not None:
                return Mismatch(chunk, offset + pos + bad)
        return None

    def close(self) -> None:
        self._source.close()
        self._expected.release()
        close_mapping(self._scratch)


def unverifiable(manifest: Manifest, where: str) -> UnverifiableError:
    """Why a checksum verification of an object saved without checksums is refused, and what
    does work instead (regeneration only when the manifest says how the bytes were made)."""
    ways = "load it with verify=False"
    if manifest.generator in SYNTHETIC and manifest.seed is not None:
        ways += (
            f", or verify='regenerate' (its {manifest.generator} data, seed {manifest.seed}, is rebuilt "
            "and compared byte for byte)"
        )
    return UnverifiableError(
        f"checkpoint {where!r} was saved with integrity='none': it carries no checksums, so it "
        f"cannot be verified by checksum (nothing is known to be wrong with it); {ways}"
    )


def make_verifier(mode: str, manifest: Manifest, *, threads: int, where: str = "object") -> Verifier | None:
    """The verifier of ``mode``; UnverifiableError when ``mode`` needs checksums the save did
    not compute (before any data is read: a load must not pass without having checked)."""
    if mode == "checksum":
        if not manifest.checksummed:
            raise unverifiable(manifest, where)
        return ChecksumVerifier(manifest)
    if mode == "regenerate":
        return RegenerateVerifier(manifest, threads=threads)
    return None

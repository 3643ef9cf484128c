"""Per-chunk records and what honestly follows from them. Plain data only; no formatting.

Every time here is measured where the work happens: ``fill_s`` inside the generator thread,
``write_s`` / ``read_s`` around the storage call. Time blocked on back-pressure (``wait_free_s``) or
starved of data (``wait_data_s``) is recorded separately and never counted as work, so the
gen/io ratio cannot drift towards 1.0 just because the two sides wait on each other.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from ..deprecated import Renamed

GENERATION = "Generation"
READ = "Read"  # a fill that reads another tier's object (a drain), not CPU work
IO = "I/O"
CHECKSUM = "Checksum"
CONSUMER = "Consumer"  # loads: verification and the caller


@dataclass(slots=True)
class ChunkRecord:
    """What happened to one saved chunk. Times are seconds; ``t_*`` are perf_counter stamps."""

    index: int
    offset: int
    nbytes: int
    fill_s: float = 0.0  # pure generation time (inside the worker thread)
    write_s: float = 0.0  # pure storage time for this chunk
    wait_free_s: float = 0.0  # producer blocked waiting for a free buffer
    wait_data_s: float = 0.0  # consumer blocked waiting for this chunk
    t_acquire: float = 0.0
    t_write_start: float = 0.0
    t_write_end: float = 0.0
    bottleneck: str = ""
    checksum: int | None = None  # CRC32C of the chunk (saves: computed before release)
    checksum_s: float = 0.0  # pure checksum time (inside the worker thread)
    checksum_cpu_s: float = 0.0  # CPU time of that worker thread during the checksum

    @property
    def latency_s(self) -> float:
        """Buffer acquired → write completed."""
        return self.t_write_end - self.t_acquire


@dataclass(slots=True)
class ReadRecord:
    """What happened to one loaded chunk: the read, then the consumer (verification + caller)."""

    index: int
    offset: int
    nbytes: int
    read_s: float = 0.0  # pure storage time for this chunk
    consume_s: float = 0.0  # verification + the caller's time with the view
    verify_s: float = 0.0  # pure verification time (part of consume_s)
    verify_cpu_s: float = 0.0  # CPU time of the verification (its thread, + dgen-py's pool when regenerating)
    wait_free_s: float = 0.0  # reads blocked waiting for a free buffer
    wait_data_s: float = 0.0  # consumer blocked waiting for this chunk's read
    t_acquire: float = 0.0
    t_read_start: float = 0.0
    t_read_end: float = 0.0
    bottleneck: str = ""

    # the names loads used before they had records of their own (one release)
    fill_s = Renamed[float]("consume_s")
    write_s = Renamed[float]("read_s")
    t_write_start = Renamed[float]("t_read_start")
    t_write_end = Renamed[float]("t_read_end")

    @property
    def latency_s(self) -> float:
        """Buffer acquired → read completed."""
        return self.t_read_end - self.t_acquire


class Timed(Protocol):
    """What saved and read chunks have alike (the fields both result kinds summarize)."""

    @property
    def wait_free_s(self) -> float: ...
    @property
    def wait_data_s(self) -> float: ...
    @property
    def latency_s(self) -> float: ...


class Percentiles(NamedTuple):
    p50: float
    p90: float
    p99: float
    max: float


def percentiles(values: Sequence[float]) -> Percentiles:
    """Nearest-rank percentiles (no interpolation: every value reported was observed)."""
    if not values:
        return Percentiles(0.0, 0.0, 0.0, 0.0)
    ordered = sorted(values)

    def rank(p: float) -> float:
        return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]

    return Percentiles(rank(50), rank(90), rank(99), ordered[-1])


def busy_time(intervals: Sequence[tuple[float, float]]) -> float:
    """Length of the union of intervals: wall time during which at least one was active."""
    total = 0.0
    end = -math.inf
    for start, stop in sorted(intervals):
        if start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total


def notify_progress(progress: Callable[[int], None], rec: ChunkRecord | ReadRecord) -> None:
    """Tell a progress callback a chunk is done: ``progress(nbytes)``, and, when it has a
    ``chunk`` method (the bench's progress bar), ``progress.chunk(rec)`` with its record."""
    progress(rec.nbytes)
    chunk = getattr(progress, "chunk", None)
    if chunk is not None:
        chunk(rec)


def label_chunks(
    records: Sequence[ChunkRecord], parallel_writes: int, tail_s: float = 0.0, *, fill: str = GENERATION
) -> dict[str, int]:
    """Label each chunk with the slowest stage; return the counts.

    With ``parallel_writes`` writes in flight the storage side serves one chunk every
    ``write_s / parallel_writes`` seconds, which is what generation must keep up with. The
    checksum runs beside each write; it is named only when it, not storage, held a chunk
    (storage faster than CRC32C's ~20 GB/s), and only then appears in the counts.

    ``tail_s``, the close's wait (a library that uploads behind its writes completing them,
    an fsync of buffered writes), is storage time the writes did not wait for: each chunk's
    share of it counts as its I/O. Without it a save to s3dlio, whose writes only hand parts
    over, was labelled generation-bound while its upload took 40 times the generation.

    ``fill`` names the filling stage: :data:`READ` where the source reads stored bytes (a
    drain's chunk held by its local read is not generation-bound).
    """
    counts = {IO: 0, fill: 0}
    tail = tail_s / len(records) if records else 0.0
    for rec in records:
        stages = {
            fill: rec.fill_s,
            IO: rec.write_s / parallel_writes + tail,
            CHECKSUM: rec.checksum_s / parallel_writes,
        }
        rec.bottleneck = max(stages, key=lambda k: stages[k])
        counts[rec.bottleneck] = counts.get(rec.bottleneck, 0) + 1
    return counts

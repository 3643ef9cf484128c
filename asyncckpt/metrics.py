"""Per-chunk records and what honestly follows from them. Plain data only; no formatting.

Every time here is measured where the work happens: ``fill_s`` inside the generator thread,
``write_s`` around the storage call. Time blocked on back-pressure (``wait_free_s``) or
starved of data (``wait_data_s``) is recorded separately and never counted as work, so the
gen/io ratio cannot drift towards 1.0 just because the two sides wait on each other.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, NamedTuple

from .schema import SCHEMA_VERSION

GENERATION = "Generation"
IO = "I/O"
CHECKSUM = "Checksum"
CONSUMER = "Consumer"  # loads: verification and the caller


@dataclass(slots=True)
class ChunkRecord:
    """What happened to one chunk. Times are seconds; ``t_*`` are perf_counter stamps."""

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
    verify_s: float = 0.0  # loads: pure verification time of this chunk

    @property
    def latency_s(self) -> float:
        """Buffer acquired → write completed."""
        return self.t_write_end - self.t_acquire


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


def label_chunks(records: Sequence[ChunkRecord], parallel_writes: int) -> dict[str, int]:
    """Label each chunk with the slowest stage; return the counts.

    With ``parallel_writes`` writes in flight the storage side serves one chunk every
    ``write_s / parallel_writes`` seconds, which is what generation must keep up with. The
    checksum runs beside each write; it is named only when it, not storage, held a chunk
    (storage faster than CRC32C's ~20 GB/s), and only then appears in the counts.
    """
    counts = {IO: 0, GENERATION: 0}
    for rec in records:
        stages = {
            GENERATION: rec.fill_s,
            IO: rec.write_s / parallel_writes,
            CHECKSUM: rec.checksum_s / parallel_writes,
        }
        rec.bottleneck = max(stages, key=lambda k: stages[k])
        counts[rec.bottleneck] = counts.get(rec.bottleneck, 0) + 1
    return counts


def summarize_records(records: Sequence[ChunkRecord]) -> dict[str, Any]:
    """The :class:`SaveResult` fields that follow from per-chunk records alone."""
    return {
        "write_s": busy_time([(r.t_write_start, r.t_write_end) for r in records]),
        "wait_free_s": sum(r.wait_free_s for r in records),
        "wait_data_s": sum(r.wait_data_s for r in records),
        "chunks": len(records),
        "chunk_latency_s": percentiles([r.latency_s for r in records]),
        "write_latency_s": percentiles([r.write_s for r in records]),
        "checksum_s": sum(r.checksum_s for r in records),
        "verify_s": sum(r.verify_s for r in records),
        "records": tuple(records),
    }


@dataclass(frozen=True, kw_only=True)
class RunMetadata:
    """How a result was produced, so two numbers can be compared honestly."""

    backend: str
    uri: str
    direct_io: bool
    direct_io_reason: str
    chunk_size: int
    num_buffers: int
    pool_bytes: int
    max_in_flight: int
    generator: str
    seed: int | None
    gen_threads: int | None
    gen_threads_requested: int | None
    usable_cpus: int
    local_ranks: int
    local_ranks_source: str
    fsync: bool
    event_loop: str
    hostname: str
    python: str
    versions: dict[str, str]
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class SaveResult:
    """One save (or, with ``operation="load"``, one load). Bytes, seconds, bytes/second.

    For a load the same fields keep their roles, seen from the storage side: ``write_s`` is
    the wall time with at least one *read* in flight, ``gen_s`` the consumer's time
    (verification + caller), ``verify_s`` the pure verification part of it.
    """

    operation: str
    method: str  # "streaming" or "preallocate"
    size_bytes: int
    wall_s: float
    open_s: float
    gen_s: float  # sum of pure fill times
    write_s: float  # wall time with at least one write in flight
    close_s: float  # complete: fsync + rename (files) / complete-multipart (S3)
    close_detail: dict[str, float]
    wait_free_s: float
    wait_data_s: float
    chunks: int
    bottleneck_counts: dict[str, int]
    chunk_latency_s: Percentiles
    write_latency_s: Percentiles
    loop_lag_s: Percentiles
    peak_rss_bytes: int
    baseline_rss_bytes: int
    metadata: RunMetadata
    records: tuple[ChunkRecord, ...] = ()
    checksum_s: float = 0.0  # saves: sum of pure CRC32C times (producer, before release)
    verify_s: float = 0.0  # loads: sum of pure verification times

    @property
    def throughput_bps(self) -> float:
        """End to end: bytes / wall time (open to published)."""
        return self.size_bytes / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def io_s(self) -> float:
        return self.write_s + self.close_s

    @property
    def gen_bps(self) -> float:
        return self.size_bytes / self.gen_s if self.gen_s > 0 else math.inf

    @property
    def io_bps(self) -> float:
        return self.size_bytes / self.io_s if self.io_s > 0 else math.inf

    @property
    def checksum_bps(self) -> float:
        return self.size_bytes / self.checksum_s if self.checksum_s > 0 else math.inf

    @property
    def verify_bps(self) -> float:
        return self.size_bytes / self.verify_s if self.verify_s > 0 else math.inf

    @property
    def gen_io_ratio(self) -> float:
        """How many times faster generation is than storage (> 1: storage is measured)."""
        return self.gen_bps / self.io_bps if self.io_bps not in (0, math.inf) else math.inf

    @property
    def overhead_pct(self) -> float:
        """Wall time not explained by the slower stage, as % of wall time."""
        busy = self.gen_s + self.io_s if self.method == "preallocate" else max(self.gen_s, self.io_s)
        pipeline = self.wall_s - self.open_s
        return max(0.0, (pipeline - busy) / pipeline * 100) if pipeline > 0 else 0.0

    @property
    def bottleneck(self) -> str:
        """The stage that limited most chunks."""
        return max(self.bottleneck_counts, key=lambda k: self.bottleneck_counts[k])

    def to_dict(self, *, include_records: bool = False) -> dict[str, Any]:
        """JSON-ready data: raw fields plus the derived rates."""
        data = {"schema_version": SCHEMA_VERSION, **asdict(self)}
        records = data.pop("records")
        for key in ("chunk_latency_s", "write_latency_s", "loop_lag_s"):
            data[key] = getattr(self, key)._asdict()
        data.update(
            throughput_bps=self.throughput_bps,
            gen_bps=_finite(self.gen_bps),
            io_bps=_finite(self.io_bps),
            io_s=self.io_s,
            gen_io_ratio=_finite(self.gen_io_ratio),
            checksum_bps=_finite(self.checksum_bps),
            verify_bps=_finite(self.verify_bps),
            overhead_pct=self.overhead_pct,
            bottleneck=self.bottleneck,
            pool_peak_over_baseline_bytes=self.peak_rss_bytes - self.baseline_rss_bytes,
        )
        if include_records:
            data["records"] = records
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SaveResult:
        """Rebuild a result from :meth:`to_dict` output (derived figures are recomputed)."""
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in data.items() if k in names}
        for key in ("chunk_latency_s", "write_latency_s", "loop_lag_s"):
            kw[key] = Percentiles(**data[key])
        kw["metadata"] = RunMetadata(**data["metadata"])
        kw["records"] = tuple(ChunkRecord(**r) for r in data.get("records") or ())
        return cls(**kw)

    def __str__(self) -> str:
        from .report import format_result  # formatting lives only in the report module

        return format_result(self)


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None

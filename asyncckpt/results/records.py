"""What a save and a load return: ``SaveResult`` and ``LoadResult``, one shape seen from each side.

Both carry the same run metadata and the same end-to-end figures (built by one builder,
:func:`asyncckpt.engine.runinfo.run_fields`); each names its own work: a save generates and writes,
a load reads and consumes (verification + the caller). Plain data, and its text form
(``str(result)``): the text is drawn from these classes, so it is written here, with the units
and tables of :mod:`asyncckpt.results.text` (which imports nothing of this module).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar, Self

from ..deprecated import Renamed
from .metrics import READ, ChunkRecord, Percentiles, ReadRecord, busy_time, percentiles
from .schema import SCHEMA_VERSION
from .text import RULE, format_endpoints, gbps, gib, mib, ms


@dataclass(frozen=True, kw_only=True)
class RunSetup:
    """How a run was set up: the part of its metadata a save and a load each decide."""

    backend: str
    uri: str
    chunk_size: int
    num_buffers: int
    pool_bytes: int
    max_in_flight: int
    generator: str
    seed: int | None
    gen_threads: int | None
    gen_threads_requested: int | None
    fsync: bool
    # the niceness and scheduling class of the threads doing CPU-only work (generation,
    # checksums: asyncckpt.priority); None in files older than 2.3, which did not record them
    cpu_nice: int | None = None
    cpu_idle: bool | None = None
    # whether they ran only beside the CPU the event loop was on (cpu_pin); None before 2.4
    cpu_pinned: bool | None = None


@dataclass(frozen=True, kw_only=True)
class RunMetadata(RunSetup):
    """How a result was produced, so two numbers can be compared honestly."""

    direct_io: bool
    direct_io_reason: str
    usable_cpus: int
    local_ranks: int
    local_ranks_source: str
    event_loop: str
    hostname: str
    python: str
    versions: dict[str, str]
    extra: dict[str, Any] = field(default_factory=dict)
    # what sized the generator's threads: "leave_loop_core" | "mlperf" | "override" (gen_threads
    # given), and the threads it gave; files older than 2.2 used the MLPerf rule
    thread_budget_rule: str = "mlperf"
    thread_budget_threads: int | None = None


@dataclass(frozen=True, kw_only=True)
class RunResult(ABC):
    """The fields and figures every result has. Bytes, seconds, bytes/second."""

    operation: ClassVar[str]
    _percentiles: ClassVar[tuple[str, ...]]
    _record: ClassVar[type[Any]]

    method: str  # "streaming" or "preallocate" (loads stream)
    size_bytes: int
    wall_s: float
    open_s: float
    close_s: float  # saves: fsync + rename / complete-multipart; loads: closing the reader
    close_detail: dict[str, float]
    wait_free_s: float  # summed over chunks: waiting for a free pool buffer
    wait_data_s: float  # summed over chunks: storage waiting for data (saves), consumer for reads (loads)
    chunks: int
    bottleneck_counts: dict[str, int]
    chunk_latency_s: Percentiles
    loop_lag_s: Percentiles
    peak_rss_bytes: int
    baseline_rss_bytes: int
    metadata: RunMetadata
    # CPU time over the timed phase (asyncckpt.cpu); None in files written before 2.2
    cpu_s: float | None = None  # this process, all threads (user + system)
    writer_cpu_s: float | None = None  # the writer process (isolation), None when there is none
    cpu_scope: str = ""  # what cpu_total_s covers: "process" or "process+writer"
    cpu_stages_s: dict[str, float] = field(default_factory=dict)  # thread CPU per measured stage
    # the call's time outside the timed window (handle, writer process start, pool mapping,
    # waiting for its result; lock waits excluded): wall_s + setup_s is the caller's clock.
    # None in files written before 2.6
    setup_s: float | None = None

    @property
    def caller_s(self) -> float:
        """The caller's clock: the timed window plus the setup around it."""
        return self.wall_s + (self.setup_s or 0.0)

    @property
    @abstractmethod
    def storage_s(self) -> float:
        """Wall time with at least one storage call in flight."""

    @property
    @abstractmethod
    def work_s(self) -> float:
        """The other side of the pipeline: generation (saves) or the consumer (loads)."""

    @property
    def throughput_bps(self) -> float:
        """End to end: bytes / wall time (open to published, or open to last byte consumed)."""
        return self.size_bytes / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def io_s(self) -> float:
        return self.storage_s + self.close_s

    @property
    def io_bps(self) -> float:
        return _rate(self.size_bytes, self.io_s)

    @property
    def overhead_pct(self) -> float:
        """Wall time not explained by the slower stage, as % of wall time."""
        busy = self.work_s + self.io_s if self.method == "preallocate" else max(self.work_s, self.io_s)
        pipeline = self.wall_s - self.open_s
        return max(0.0, (pipeline - busy) / pipeline * 100) if pipeline > 0 else 0.0

    @property
    def cpu_total_s(self) -> float | None:
        """CPU seconds of this process plus the writer process's (see ``cpu_scope``)."""
        if self.cpu_s is None:
            return None
        return self.cpu_s + (self.writer_cpu_s or 0.0)

    @property
    def cpu_s_per_gb(self) -> float | None:
        """CPU seconds per GB (10⁹ bytes) moved: the cost per byte, whatever the wall time."""
        total = self.cpu_total_s
        return total / (self.size_bytes / 1e9) if total is not None and self.size_bytes else None

    @property
    def cpu_stages_s_per_gb(self) -> dict[str, float]:
        gb = self.size_bytes / 1e9
        return {k: v / gb for k, v in self.cpu_stages_s.items()} if gb else {}

    @property
    def bottleneck(self) -> str:
        """The stage that limited most chunks."""
        return max(self.bottleneck_counts, key=lambda k: self.bottleneck_counts[k])

    def derived(self) -> dict[str, Any]:
        """Figures computed from the fields (written to JSON, recomputed when read back)."""
        return {
            "throughput_bps": self.throughput_bps,
            "io_bps": _finite(self.io_bps),
            "io_s": self.io_s,
            "overhead_pct": self.overhead_pct,
            "bottleneck": self.bottleneck,
            "pool_peak_over_baseline_bytes": self.peak_rss_bytes - self.baseline_rss_bytes,
            "cpu_total_s": self.cpu_total_s,
            "cpu_s_per_gb": self.cpu_s_per_gb,
            "cpu_stages_s_per_gb": self.cpu_stages_s_per_gb,
            "caller_s": self.caller_s,
        }

    def to_dict(self, *, include_records: bool = False) -> dict[str, Any]:
        """JSON-ready data: raw fields plus the derived rates."""
        data = {"schema_version": SCHEMA_VERSION, "operation": self.operation, **asdict(self)}
        records = data.pop("records")
        for key in self._percentiles:
            data[key] = getattr(self, key)._asdict()
        data.update(self.derived())
        if include_records:
            data["records"] = records
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        """Rebuild a result from :meth:`to_dict` output (derived figures are recomputed)."""
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in data.items() if k in names}
        for key in cls._percentiles:
            kw[key] = Percentiles(**data[key])
        kw["metadata"] = RunMetadata(**data["metadata"])
        kw["records"] = tuple(cls._record(**r) for r in data.get("records") or ())
        return cls(**kw)

    @abstractmethod
    def __str__(self) -> str:
        """The results block a person reads (GiB sizes, GB/s rates, every figure with its unit)."""


@dataclass(frozen=True, kw_only=True)
class SaveResult(RunResult):
    """One save: generation on one side of the pool, writes on the other."""

    operation: ClassVar[str] = "save"
    _percentiles = ("chunk_latency_s", "write_latency_s", "loop_lag_s")
    _record = ChunkRecord

    gen_s: float  # sum of pure fill times
    write_s: float  # wall time with at least one write in flight
    write_latency_s: Percentiles
    checksum_s: float = 0.0  # sum of pure CRC32C times (producer, before release)
    # "crc32c": a CRC32C per chunk, sealed into the manifest; "none": no checksum was computed
    # (CheckpointConfig.integrity), so the object can be verified only by regeneration
    integrity: str = "crc32c"
    records: tuple[ChunkRecord, ...] = ()

    @classmethod
    def from_records(
        cls, records: Sequence[ChunkRecord], *, gen_s: float, integrity: str = "crc32c", **run: Any
    ) -> SaveResult:
        """``run``: the shared fields from :func:`asyncckpt.engine.runinfo.run_fields`."""
        return cls(
            gen_s=gen_s,
            integrity=integrity,
            write_s=busy_time([(r.t_write_start, r.t_write_end) for r in records]),
            write_latency_s=percentiles([r.write_s for r in records]),
            checksum_s=sum(r.checksum_s for r in records),
            records=tuple(records),
            **run,
        )

    @property
    def storage_s(self) -> float:
        return self.write_s

    @property
    def work_s(self) -> float:
        return self.gen_s

    @property
    def gen_bps(self) -> float:
        return _rate(self.size_bytes, self.gen_s)

    @property
    def checksum_bps(self) -> float:
        return _rate(self.size_bytes, self.checksum_s)

    @property
    def gen_io_ratio(self) -> float:
        """How many times faster generation is than storage (> 1: storage is measured)."""
        return _ratio(self.gen_bps, self.io_bps)

    def __str__(self) -> str:
        return _save_text(self)

    def derived(self) -> dict[str, Any]:
        return {
            **super().derived(),
            "gen_bps": _finite(self.gen_bps),
            "gen_io_ratio": _finite(self.gen_io_ratio),
            "checksum_bps": _finite(self.checksum_bps),
        }


@dataclass(frozen=True, kw_only=True)
class LoadResult(RunResult):
    """One load: reads on one side of the pool, the consumer (verification + caller) on the other."""

    operation: ClassVar[str] = "load"
    _percentiles = ("chunk_latency_s", "read_latency_s", "loop_lag_s")
    _record = ReadRecord

    method: str = "streaming"
    consume_s: float  # sum of per-chunk consumer times (verification + caller)
    read_s: float  # wall time with at least one read in flight
    read_latency_s: Percentiles
    verify_s: float = 0.0  # sum of pure verification times (part of consume_s)
    records: tuple[ReadRecord, ...] = ()

    # the save-side names loads answered to before this release (one release)
    gen_s = Renamed[float]("consume_s")
    write_s = Renamed[float]("read_s")
    write_latency_s = Renamed[Percentiles]("read_latency_s")
    gen_bps = Renamed[float]("consume_bps")
    gen_io_ratio = Renamed[float]("consume_io_ratio")

    @classmethod
    def from_records(cls, records: Sequence[ReadRecord], **run: Any) -> LoadResult:
        """``run``: the shared fields from :func:`asyncckpt.engine.runinfo.run_fields`."""
        return cls(
            consume_s=sum(r.consume_s for r in records),
            read_s=busy_time([(r.t_read_start, r.t_read_end) for r in records]),
            read_latency_s=percentiles([r.read_s for r in records]),
            verify_s=sum(r.verify_s for r in records),
            records=tuple(records),
            **run,
        )

    @property
    def storage_s(self) -> float:
        return self.read_s

    @property
    def work_s(self) -> float:
        return self.consume_s

    @property
    def read_bps(self) -> float:
        """Bytes / time with a read in flight: the storage's read rate."""
        return _rate(self.size_bytes, self.read_s)

    @property
    def consume_bps(self) -> float:
        return _rate(self.size_bytes, self.consume_s)

    @property
    def verify_bps(self) -> float:
        return _rate(self.size_bytes, self.verify_s)

    @property
    def consume_io_ratio(self) -> float:
        """How many times faster the consumer is than storage (> 1: storage is measured)."""
        return _ratio(self.consume_bps, self.io_bps)

    def __str__(self) -> str:
        return _load_text(self)

    def derived(self) -> dict[str, Any]:
        return {
            **super().derived(),
            "read_bps": _finite(self.read_bps),
            "consume_bps": _finite(self.consume_bps),
            "consume_io_ratio": _finite(self.consume_io_ratio),
            "verify_bps": _finite(self.verify_bps),
        }


Result = SaveResult | LoadResult


def result_from_dict(data: dict[str, Any]) -> Result:
    """A result of either kind from its JSON form (current schema; see ``schema.upgrade``)."""
    return LoadResult.from_dict(data) if data["operation"] == "load" else SaveResult.from_dict(data)


def _rate(nbytes: int, seconds: float) -> float:
    return nbytes / seconds if seconds > 0 else math.inf


def _ratio(a: float, b: float) -> float:
    return a / b if b not in (0, math.inf) else math.inf


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _cpu_text(r: RunResult) -> str:
    """CPU-s per GB in total (and what it covers), then per measured stage."""
    total = r.cpu_s_per_gb
    if total is None:
        return "not measured (result written before schema 2.2)"
    scope = "this process + writer process" if r.writer_cpu_s is not None else "this process"
    stages = ", ".join(f"{k} {v:.3f}" for k, v in r.cpu_stages_s_per_gb.items())
    return f"{total:.3f} CPU-s/GB ({scope}){'; stages: ' + stages if stages else ''}"


def _cpu_priority(m: RunMetadata) -> str:
    if m.cpu_nice is None:  # a file older than 2.3
        return ""
    beside = ", beside the loop's CPU" if m.cpu_pinned else ""
    return f"; CPU work at nice {m.cpu_nice}{', SCHED_IDLE' if m.cpu_idle else ''}{beside}"


def _checksum_line(r: SaveResult, d: Mapping[str, Any]) -> str:
    if r.integrity == "none":
        return "Checksum:          no checksums (integrity none: a load can verify only by regeneration)"
    return f"Checksum:          {r.checksum_s:.3f} s @ {gbps(d['checksum_bps'])}  (CRC32C, beside each write)"


def _fill_line(r: SaveResult, d: dict[str, Any]) -> str:
    """The fill's time: generation, or (a drain's source) the read of the object copied, as
    the chunks' labels say (one decision, made where they were labelled)."""
    if READ in r.bottleneck_counts:
        return f"Source read:       {r.gen_s:.3f} s @ {gbps(d['gen_bps'])}  (the object copied)"
    return f"Generation:        {r.gen_s:.3f} s @ {gbps(d['gen_bps'])}  (pure fill time)"


def _save_text(r: SaveResult) -> str:
    """The results block of one save: generation, checksums and writes kept apart."""
    m = r.metadata
    d = r.to_dict()
    counts = " / ".join(f"{k} {v:,}" for k, v in r.bottleneck_counts.items())
    close = ", ".join(f"{k.removesuffix('_s')} {v:.3f} s" for k, v in r.close_detail.items())
    lat, wlat, lag = r.chunk_latency_s, r.write_latency_s, r.loop_lag_s
    direct = "on" if m.direct_io else "OFF"
    gen = (
        f"{m.generator} (seed {m.seed}, threads {m.gen_threads} of {m.gen_threads_requested} requested; "
        f"budget {m.thread_budget_threads} by the {m.thread_budget_rule} rule{_cpu_priority(m)})"
    )
    lines = [
        RULE,
        f"{r.operation.upper()} {r.method}: {gib(r.size_bytes)} → {m.uri} [{m.backend}]",
        RULE,
        _throughput_line(r),
        _setup_line(r),
        _fill_line(r, d),
        _checksum_line(r, d),
        f"I/O:               {r.io_s:.3f} s @ {gbps(d['io_bps'])}",
        f"  - write:         {r.write_s:.3f} s",
        f"  - close:         {r.close_s:.3f} s ({close or 'no detail'})",
        f"Open:              {r.open_s:.3f} s",
        f"Throughput ratio:  {_times(d['gen_io_ratio'])} (gen/io)",
        f"Pipeline overhead: {r.overhead_pct:.1f}%",
        f"Bottleneck:        {r.bottleneck}  (chunks: {counts})",
        f"Waits:             producer for buffers {r.wait_free_s:.3f} s, "
        f"writers for data {r.wait_data_s:.3f} s",
        f"Chunks:            {r.chunks:,} × {mib(m.chunk_size)}; latency p50 {ms(lat.p50)} p90 {ms(lat.p90)} "
        f"p99 {ms(lat.p99)} max {ms(lat.max)}",
        f"Write latency:     p50 {ms(wlat.p50)} p99 {ms(wlat.p99)} max {ms(wlat.max)}",
        f"Event-loop lag:    p50 {ms(lag.p50)} p99 {ms(lag.p99)} max {ms(lag.max)} ({m.event_loop})",
        f"CPU:               {_cpu_text(r)}",
        f"Memory:            peak RSS {mib(r.peak_rss_bytes)} "
        f"(+{mib(r.peak_rss_bytes - r.baseline_rss_bytes)} during the run); pool {mib(m.pool_bytes)}",
        f"Direct I/O:        {direct} — {m.direct_io_reason}; fsync {'on' if m.fsync else 'off'}",
        f"Writer:            {_writer(m.extra)}",
        f"Generator:         {gen}",
        f"Ranks on node:     {m.local_ranks} (from {m.local_ranks_source}); usable CPUs {m.usable_cpus}",
        f"Host:              {m.hostname}, Python {m.python}",
        RULE,
    ]
    return "\n".join(lines + format_endpoints(m.extra))


def _throughput_line(r: RunResult) -> str:
    """The timed window's rate: from opening the object to its publication or last byte."""
    window = f"{gib(r.size_bytes)} in {r.wall_s:.3f} s, open to end"
    return f"Throughput:        {gbps(r.throughput_bps)}  ({window})"


def _setup_line(r: RunResult) -> str:
    """The caller's clock beside the timed window: a first save's setup is not hidden."""
    if r.setup_s is None:
        return "Setup:             not recorded (a file older than 2.6)"
    return f"Setup:             {r.setup_s:.3f} s outside that window; caller's clock {r.caller_s:.3f} s"


def _load_text(r: LoadResult) -> str:
    """The results block of one load: reads, verification and the caller kept apart."""
    m, d, x = r.metadata, r.to_dict(), r.metadata.extra
    counts = " / ".join(f"{k} {v:,}" for k, v in r.bottleneck_counts.items())
    rl, lag = r.read_latency_s, r.loop_lag_s
    verify = x.get("verify", "?")
    regen = f", of which regeneration {x.get('regenerate_s', 0.0):.3f} s" if verify == "regenerate" else ""
    lines = [
        RULE,
        f"LOAD: {gib(r.size_bytes)} ← {m.uri} [{m.backend}]",
        RULE,
        _throughput_line(r),
        _setup_line(r),
        f"Read (I/O):        {r.read_s:.3f} s @ {gbps(d['read_bps'])}"
        f"  ({m.max_in_flight} reader(s) × {mib(m.chunk_size)})",
        f"Verify:            {verify}: {r.verify_s:.3f} s @ {gbps(d['verify_bps'])}{regen}",
        f"Consumer:          {r.consume_s:.3f} s  (verification + caller, per chunk, summed)",
        f"Open:              {r.open_s:.3f} s (stat + manifest + open)",
        f"Bottleneck:        {r.bottleneck}  (chunks: {counts})",
        f"Waits:             for free buffers {r.wait_free_s:.3f} s, "
        f"consumer for reads {r.wait_data_s:.3f} s",
        f"Read latency:      p50 {ms(rl.p50)} p90 {ms(rl.p90)} p99 {ms(rl.p99)} max {ms(rl.max)} "
        f"({r.chunks:,} reads)",
        f"Event-loop lag:    p50 {ms(lag.p50)} p99 {ms(lag.p99)} max {ms(lag.max)} ({m.event_loop})",
        f"CPU:               {_cpu_text(r)}",
        f"Memory:            peak RSS {mib(r.peak_rss_bytes)} "
        f"(+{mib(r.peak_rss_bytes - r.baseline_rss_bytes)} during the run); pool {mib(m.pool_bytes)}",
        f"Cache defeat:      {'O_DIRECT' if m.direct_io else 'no O_DIRECT'} — {m.direct_io_reason}",
        f"Manifest:          {m.generator} (seed {m.seed}), chunk {mib(x.get('manifest_chunk_size', 0))}"
        + ("; no checksums (saved with integrity none)" if x.get("manifest_integrity") == "none" else ""),
        RULE,
    ]
    if "identity_note" in x:
        lines.insert(-1, f"Note:              {x['identity_note']}")
    return "\n".join(lines + format_endpoints(x))


def _writer(extra: Mapping[str, object]) -> str:
    """Where the sink ran: in-process, or which writer process and why."""
    if extra.get("isolation") != "process":
        return "in-process"
    return (
        f"process pid {extra.get('writer_pid')}, {extra.get('mp_start_method')} "
        f"(from {extra.get('mp_start_method_source')}); {extra.get('isolation_reason')}"
    )


def _times(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"

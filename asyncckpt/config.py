"""Configuration: frozen, keyword-only, validated on construction (before any I/O)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from . import env, modes
from .errors import ConfigError
from .priority import BACKGROUND_NICE, MAX_NICE
from .secrets import protect_options
from .sinks.base import SinkOptions
from .sinks.isolation.policy import requested_start_method, resolve_policy
from .sinks.registry import check_backend, check_backend_options
from .sinks.router import Routing
from .units import GiB, MiB

DATA_GEN_ENV = env.DATA_GEN
GENERATORS = modes.choices(modes.Generator)
DEFAULT_SEED = 0x5EED
ALIGN = 4096
#: one buffer, one write, one verification scratch: a bound a manifest read back is held to too
MAX_CHUNK_SIZE = 1 * GiB
MAX_SEED = 2**64 - 1  # dgen-py seeds are unsigned 64-bit
MAX_BUFFERS = 4096
MAX_THREADS = 4096
MAX_TIMEOUT_S = 7 * 24 * 3600.0


def _positive_int(name: str, value: object, minimum: int = 1, maximum: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {value!r}")
    if maximum is not None and value > maximum:
        raise ConfigError(f"{name} must be <= {maximum}, got {value!r}")


def _seconds(name: str, value: object, maximum: float) -> None:
    """A finite number of seconds in (0, maximum]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{name} must be a number of seconds, got {value!r}")
    if not 0 < value <= maximum:  # also false for NaN
        raise ConfigError(f"{name} must be in (0, {maximum:g}] s, got {value!r}")


def default_generator() -> modes.Generator:
    """``ASYNCCKPT_DATA_GEN`` when set (validated), else dgen-py."""
    return env.data_generator()


@dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    """How checkpoints are produced and written.

    ``chunk_size`` × ``num_buffers`` bounds memory; 32 MiB × 8 = 256 MiB keeps a fast
    device busy while generation runs ahead. ``direct_io=None`` uses O_DIRECT when the file
    system accepts it and records why not otherwise; ``True`` makes a refusal an error.
    """

    chunk_size: int = 32 * MiB
    num_buffers: int = 8
    generator: modes.Generator = field(default_factory=default_generator)
    seed: int = DEFAULT_SEED
    gen_threads: int | None = None  # None: sized by ``thread_budget``
    # "leave_loop_core": (usable CPUs // ranks on this node) - 1, at least 1, so the event loop
    # keeps a core; "mlperf": usable CPUs // ranks on this node (the bench CLI's rule)
    thread_budget: modes.ThreadBudgetRule = "leave_loop_core"
    # niceness of generation and checksum threads (asyncckpt.priority); None: 10 under
    # "leave_loop_core" (the loop wakes on time), 0 under "mlperf" (the bench CLI)
    cpu_nice: int | None = None
    # those threads in the kernel's SCHED_IDLE class too (asyncckpt.priority), opt-in: a waking
    # loop preempts them at once (p99 lag into a file 2.06 -> 1.08 ms), but one of them holding
    # the GIL while starved stalls the loop (seen beside CPU burners); None: off (a tiered
    # drain's checkpointer sets it unless drain_priority="lane": asyncckpt.drain)
    cpu_idle: bool | None = None
    # those threads only on the CPUs other than the one the event loop is on when a save starts
    # (asyncckpt.priority): a waking loop then finds its core free (p99 lag into a file 2.08 ->
    # 1.2 ms, same GB/s); None: on under "leave_loop_core", off under "mlperf"
    cpu_pin: bool | None = None
    direct_io: bool | None = None
    fsync: bool = True
    reserve_space: bool = True  # fallocate files up front: ENOSPC before, not during, a save
    max_in_flight: int | None = None  # None: the backend's default
    backend: str | None = None  # None: chosen from the URI scheme
    monitor_interval: float = 0.005
    backend_options: dict[str, Any] = field(default_factory=dict)
    # writer-process isolation: "auto" isolates s3dlio only; see asyncckpt.sinks.isolation.policy
    isolation: modes.Isolation = "auto"
    # None: ASYNCCKPT_MP_START_METHOD, else MLPS_CHECKPOINT_MP_START_METHOD, else "auto"
    mp_start_method: modes.StartMethod | None = None
    writer_timeout: float = 300.0  # longest a writer process may take to answer one request
    # no storage call finishing for this long fails the save/load with StallError (watchdog.py)
    stall_timeout: float = 20.0
    # "crc32c": every chunk's CRC32C is computed beside its write and sealed into the manifest
    # (what load(verify=True) checks); "none": no checksum anywhere on the save path, for pure
    # storage benchmarks: the manifest says so and a checksum-verifying load refuses the object
    integrity: modes.Integrity = "crc32c"

    @classmethod
    def from_options(cls, **options: Any) -> CheckpointConfig:
        """Keyword options as a user passes them: an unknown name is a ConfigError, not a TypeError."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ConfigError(f"unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return cls(**options)

    def __post_init__(self) -> None:
        _positive_int("chunk_size", self.chunk_size, ALIGN, MAX_CHUNK_SIZE)
        if self.chunk_size % ALIGN:
            raise ConfigError(
                f"chunk_size must be a multiple of {ALIGN} (page-aligned buffers, O_DIRECT); "
                f"got {self.chunk_size}"
            )
        _positive_int("num_buffers", self.num_buffers, 1, MAX_BUFFERS)
        modes.parse("generator", self.generator, modes.Generator, fold=False)
        _positive_int("seed", self.seed, 0, MAX_SEED)
        if self.gen_threads is not None:
            _positive_int("gen_threads", self.gen_threads, 1, MAX_THREADS)
        modes.parse("thread_budget", self.thread_budget, modes.ThreadBudgetRule, fold=False)
        if self.cpu_nice is not None:
            _positive_int("cpu_nice", self.cpu_nice, 0, MAX_NICE)
        for name in ("cpu_idle", "cpu_pin", "direct_io"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be True, False or None, got {getattr(self, name)!r}")
        for name in ("fsync", "reserve_space"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.backend is not None and not isinstance(self.backend, str):
            raise ConfigError(f"backend must be a backend name or None, got {self.backend!r}")
        if self.backend is not None:  # registered backends only: a typo fails here, not mid-run
            check_backend(self.backend)
        if not isinstance(self.backend_options, dict) or not all(
            isinstance(k, str) for k in self.backend_options
        ):
            raise ConfigError(f"backend_options must be a dict with str keys, got {self.backend_options!r}")
        # secrets wrapped (repr shows Secret('**********')), endpoint URLs without user:password@
        object.__setattr__(self, "backend_options", protect_options(self.backend_options))
        # each backend checks its own options: refused now, not mid-run
        check_backend_options(self.backend, self.backend_options)
        if self.max_in_flight is not None:
            _positive_int("max_in_flight", self.max_in_flight)
            if self.max_in_flight > self.num_buffers:
                raise ConfigError(
                    f"max_in_flight={self.max_in_flight} exceeds num_buffers={self.num_buffers}; "
                    "writes in flight each hold a buffer"
                )
        _seconds("monitor_interval", self.monitor_interval, 1.0)
        modes.parse("isolation", self.isolation, modes.Isolation)
        if self.mp_start_method is not None:
            modes.parse("mp_start_method", self.mp_start_method, modes.StartMethod)
        requested_start_method(self.mp_start_method)  # a bad env value fails here, not mid-run
        _seconds("writer_timeout", self.writer_timeout, MAX_TIMEOUT_S)
        _seconds("stall_timeout", self.stall_timeout, MAX_TIMEOUT_S)
        modes.parse("integrity", self.integrity, modes.Integrity, fold=False)
        if self.backend is not None:  # e.g. fork for an object store: refused before any I/O
            resolve_policy(self.backend, isolation=self.isolation, mp_start_method=self.mp_start_method)

    @property
    def checksums(self) -> bool:
        """Whether saves compute a CRC32C per chunk (``integrity="crc32c"``)."""
        return self.integrity == "crc32c"

    @property
    def pool_bytes(self) -> int:
        return self.chunk_size * self.num_buffers

    @property
    def resolved_cpu_nice(self) -> int:
        """``cpu_nice``, or the thread budget rule's default for it."""
        if self.cpu_nice is not None:
            return self.cpu_nice
        return BACKGROUND_NICE if self.thread_budget == "leave_loop_core" else 0

    @property
    def resolved_cpu_idle(self) -> bool:
        """``cpu_idle``; None is off (SCHED_IDLE is opt-in: asyncckpt.priority)."""
        return bool(self.cpu_idle)  # opt-in under either rule: see asyncckpt.priority

    @property
    def resolved_cpu_pin(self) -> bool:
        """``cpu_pin``, or the thread budget rule's default for it."""
        if self.cpu_pin is not None:
            return self.cpu_pin
        return self.thread_budget == "leave_loop_core"

    def sink_options(self) -> SinkOptions:
        """The options every sink of this configuration gets."""
        return SinkOptions(
            direct_io=self.direct_io,
            fsync=self.fsync,
            reserve_space=self.reserve_space,
            chunk_size=self.chunk_size,
            extra=dict(self.backend_options),
        )

    def routing(self) -> Routing:
        """What the storage router needs: backend, isolation, timeouts, sink options."""
        return Routing(
            backend=self.backend,
            isolation=self.isolation,
            mp_start_method=self.mp_start_method,
            stall_timeout=self.stall_timeout,
            writer_timeout=self.writer_timeout,
            options=self.sink_options(),
            child_threads=self.num_buffers + 2,
            nice=self.resolved_cpu_nice,
        )


def validate_size(size: object) -> int:
    """A checkpoint size: a positive integer byte count."""
    if isinstance(size, bool) or not isinstance(size, int):
        raise ConfigError(f"size must be an integer number of bytes, got {size!r}")
    if size <= 0:
        raise ConfigError(f"size must be > 0 bytes, got {size}")
    return size

"""Configuration: frozen, keyword-only, validated on construction (before any I/O)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError
from .isolation.policy import (
    ISOLATIONS,
    START_METHODS,
    requested_start_method,
    resolve_policy,
    validate_choice,
)
from .units import MiB

DATA_GEN_ENV = "ASYNCCKPT_DATA_GEN"
GENERATORS = ("dgen", "numpy")
DEFAULT_SEED = 0x5EED
ALIGN = 4096


def _positive_int(name: str, value: object, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {value!r}")


def _seconds(name: str, value: object) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not value > 0
        or value == float("inf")
    ):
        raise ConfigError(f"{name} must be a finite number of seconds > 0, got {value!r}")


def default_generator() -> str:
    """``ASYNCCKPT_DATA_GEN`` when set (validated), else dgen-py."""
    value = os.environ.get(DATA_GEN_ENV, "dgen").strip().lower() or "dgen"
    if value not in GENERATORS:
        raise ConfigError(f"{DATA_GEN_ENV}={value!r} is not one of {', '.join(GENERATORS)}")
    return value


@dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    """How checkpoints are produced and written.

    ``chunk_size`` × ``num_buffers`` bounds memory; 32 MiB × 8 = 256 MiB keeps a fast
    device busy while generation runs ahead. ``direct_io=None`` uses O_DIRECT when the file
    system accepts it and records why not otherwise; ``True`` makes a refusal an error.
    """

    chunk_size: int = 32 * MiB
    num_buffers: int = 8
    generator: str = field(default_factory=default_generator)
    seed: int = DEFAULT_SEED
    gen_threads: int | None = None  # None: usable CPUs // ranks on this node
    direct_io: bool | None = None
    fsync: bool = True
    reserve_space: bool = True  # fallocate files up front: ENOSPC before, not during, a save
    max_in_flight: int | None = None  # None: the backend's default
    backend: str | None = None  # None: chosen from the URI scheme
    monitor_interval: float = 0.005
    backend_options: dict[str, Any] = field(default_factory=dict)
    # writer-process isolation: "auto" isolates s3dlio only; see asyncckpt.isolation.policy
    isolation: str = "auto"
    # None: ASYNCCKPT_MP_START_METHOD, else MLPS_CHECKPOINT_MP_START_METHOD, else "auto"
    mp_start_method: str | None = None
    writer_timeout: float = 300.0  # longest a writer process may take to answer one request
    # no storage call finishing for this long fails the save/load with StallError (watchdog.py)
    stall_timeout: float = 20.0

    def __post_init__(self) -> None:
        _positive_int("chunk_size", self.chunk_size, ALIGN)
        if self.chunk_size % ALIGN:
            raise ConfigError(
                f"chunk_size must be a multiple of {ALIGN} (page-aligned buffers, O_DIRECT); "
                f"got {self.chunk_size}"
            )
        _positive_int("num_buffers", self.num_buffers)
        if self.generator not in GENERATORS:
            raise ConfigError(f"generator must be one of {', '.join(GENERATORS)}, got {self.generator!r}")
        _positive_int("seed", self.seed, 0)
        if self.gen_threads is not None:
            _positive_int("gen_threads", self.gen_threads)
        if self.direct_io not in (None, True, False):
            raise ConfigError(f"direct_io must be True, False or None, got {self.direct_io!r}")
        if self.max_in_flight is not None:
            _positive_int("max_in_flight", self.max_in_flight)
            if self.max_in_flight > self.num_buffers:
                raise ConfigError(
                    f"max_in_flight={self.max_in_flight} exceeds num_buffers={self.num_buffers}; "
                    "writes in flight each hold a buffer"
                )
        if not (0 < self.monitor_interval <= 1):
            raise ConfigError(f"monitor_interval must be in (0, 1] s, got {self.monitor_interval!r}")
        validate_choice("isolation", self.isolation, ISOLATIONS)
        if self.mp_start_method is not None:
            validate_choice("mp_start_method", self.mp_start_method, START_METHODS)
        requested_start_method(self.mp_start_method)  # a bad env value fails here, not mid-run
        if isinstance(self.writer_timeout, bool) or not isinstance(self.writer_timeout, (int, float)):
            raise ConfigError(f"writer_timeout must be a number of seconds, got {self.writer_timeout!r}")
        if not self.writer_timeout > 0:
            raise ConfigError(f"writer_timeout must be > 0 s, got {self.writer_timeout!r}")
        _seconds("stall_timeout", self.stall_timeout)
        if self.backend is not None:  # e.g. fork for an object store: refused before any I/O
            resolve_policy(self.backend, isolation=self.isolation, mp_start_method=self.mp_start_method)

    @property
    def pool_bytes(self) -> int:
        return self.chunk_size * self.num_buffers


def validate_size(size: object) -> int:
    """A checkpoint size: a positive integer byte count."""
    if isinstance(size, bool) or not isinstance(size, int):
        raise ConfigError(f"size must be an integer number of bytes, got {size!r}")
    if size <= 0:
        raise ConfigError(f"size must be > 0 bytes, got {size}")
    return size

"""Every mode string of the configuration, as a ``Literal`` defined once.

The frozen config types annotate their fields with these aliases, and the bench CLI derives
its ``choices=`` from them (:func:`choices`), so a new mode is added in one place and mypy,
argparse and validation all learn it. :func:`parse` turns untrusted text into the alias's
type or raises a :class:`~asyncckpt.errors.ConfigError` naming the bad value, before any I/O.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar, cast, get_args

from .errors import ConfigError

#: synthetic data generators (``CheckpointConfig.generator``, ``ASYNCCKPT_DATA_GEN``)
Generator = Literal["dgen", "numpy"]
#: how the generator's thread budget is sized (``CheckpointConfig.thread_budget``): each rank's
#: share of the node's CPUs ("mlperf": usable CPUs ÷ ranks on the node, the bench CLI's rule)
#: or that share less one core for the rank's event loop ("leave_loop_core", the library default)
ThreadBudgetRule = Literal["leave_loop_core", "mlperf"]
#: writer-process isolation (``CheckpointConfig.isolation``; see asyncckpt.sinks.isolation.policy)
Isolation = Literal["auto", "process", "none"]
#: how a writer process is started (``CheckpointConfig.mp_start_method``)
StartMethod = Literal["auto", "fork", "forkserver", "spawn"]
#: shared-memory arena behind an isolated writer's pool (``ASYNCCKPT_SHARED_MEMORY``)
SharedMemoryKind = Literal["auto", "memfd", "file"]
#: how S3 parts are spread over several endpoints (``S3_LOAD_BALANCE_STRATEGY``)
LoadBalanceStrategy = Literal["round_robin", "least_connections", "rank"]
#: when S3 requests carry checksums (backend option ``checksums``)
ChecksumMode = Literal["when_required", "when_supported"]
#: ``save_state(staging=...)``: copy arrays to host memory first and return early, or not
StagingMode = Literal["none", "host"]
#: what CheckpointManager.maybe_save does while an earlier save is still being written
WhenBusy = Literal["wait", "skip"]
#: what CheckpointManager does once a preemption save committed: raise PreemptedError, exit
#: the process (SystemExit 128 + signal number, after closing the manager), or return and let
#: the loop read ``mgr.preempted``
OnPreempt = Literal["raise", "exit", "continue"]
#: what a tiered CheckpointManager does when a step's drain to the remote tier is still running
#: as the next save starts: wait for it, skip the new step's drain, or queue a bounded number
DrainWhenBusy = Literal["wait", "skip", "queue"]
#: the CPU priority of a tiered drain's checksums: "idle" (``SCHED_IDLE``: only the CPU other
#: threads leave, so a training on every core loses least) or "lane" (the checkpointer's own
#: CPU lane: niceness ``cpu_nice``, a share even where other threads keep every CPU busy)
DrainPriority = Literal["idle", "lane"]
#: CheckpointManager best_n: keep the lowest ("min") or highest ("max") values of the metric
BestMode = Literal["min", "max"]
#: ``CheckpointManager.steps(tier=)``: the steps of one tier of a manager with ``local=``
Tier = Literal["local", "remote"]
#: what a save computes so a load can check it (``CheckpointConfig.integrity``, bench
#: ``--integrity``): a CRC32C per chunk sealed into the manifest, or nothing (pure storage
#: benchmarks: the object then cannot be verified by checksum, only by regeneration)
Integrity = Literal["crc32c", "none"]
#: what a load checks (``load(verify=...)``; True is "checksum", False is "none")
VerifyMode = Literal["checksum", "regenerate", "none"]
#: how a save gets its buffers: the reused pool, or one buffer of the whole checkpoint
SaveMethod = Literal["streaming", "preallocate"]
#: the bench CLI's spellings of an optional bool (``direct_io``, ``cpu_idle``): None / True / False
Switch = Literal["auto", "on", "off"]
#: each Switch spelling → the option's value
SWITCH: dict[str, bool | None] = {"auto": None, "on": True, "off": False}
#: bench ``--method``: one save method or both, one after the other
BenchMethod = Literal["streaming", "preallocate", "both"]
#: bench ``--mode``: which phases run
BenchMode = Literal["save", "load", "both"]
#: bench ``--loop``: the event loop implementation
LoopKind = Literal["auto", "asyncio", "uvloop"]
#: bench ``--embedded-s3``: which local S3 server to start
EmbeddedServer = Literal["swift", "moto"]
#: bench ``--embedded-store``: which local Azure Blob / GCS emulator to start
EmbeddedStore = Literal["azure", "gcs"]

M = TypeVar("M", bound=str)


def choices(alias: Any) -> tuple[str, ...]:
    """The allowed values of a mode alias, in declaration order (for argparse ``choices=``)."""
    return cast(tuple[str, ...], get_args(alias))


def parse(name: str, value: object, alias: Any, *, fold: bool = True, variable: bool = False) -> Any:
    """``value`` if it is one of ``alias``'s values (case and spaces folded), else ConfigError.

    ``variable``: ``name`` is an environment variable, and the message says ``NAME='value'``.
    Returns ``Any`` so the caller's annotation (the alias) types the result; mypy cannot spell
    "the Literal given as an argument" as a return type.
    """
    allowed = ", ".join(choices(alias))
    text = value.strip().lower() if fold and isinstance(value, str) else value
    if not isinstance(text, str) or text not in choices(alias):
        if variable:
            raise ConfigError(f"{name}={text!r} is not one of {allowed}")
        raise ConfigError(f"{name} must be one of {allowed}, got {value!r}")
    return text

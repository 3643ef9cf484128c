"""Facts about the running environment recorded with every result, and the one builder of the
fields a save's and a load's result share."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.metadata
import platform
import socket
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from functools import cache
from typing import Any, TypeVar

from ..cpu import SCOPE_PROCESS, SCOPE_WITH_WRITER
from ..node.topology import ThreadBudget
from ..results.metrics import Timed, percentiles
from ..results.records import RunMetadata, RunResult, RunSetup
from .monitor import LoopMonitor

_PACKAGES = (
    "asyncckpt",
    "dgen-py",
    "numpy",
    "uvloop",
    "aiobotocore",
    "s3dlio",
    "minio",
    "s3torchconnectorclient",
    "mpi4py",
)


def package_versions() -> dict[str, str]:
    """Installed versions of the packages that can shape a result (a fresh dict each call)."""
    return dict(_package_versions())


@cache
def _package_versions() -> dict[str, str]:
    """Looked up once per process: reading the installed distributions' metadata took ≈ 5 ms
    of CPU, and every save and load builds its result on the event loop's thread."""
    versions: dict[str, str] = {}
    for name in _PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def event_loop_name() -> str:
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return "none"
    module = type(loop).__module__.split(".")[0]
    return "uvloop" if module == "uvloop" else "asyncio"


@dataclass(frozen=True)
class Span:
    """An operation's method, size and clock, as :func:`run_fields` reports them."""

    method: str
    size: int
    open_s: float
    close_s: float
    wall_s: float
    close_detail: dict[str, float] = field(default_factory=dict)


def run_fields(
    setup: RunSetup,
    budget: ThreadBudget,
    sink_facts: dict[str, Any],
    monitor: LoopMonitor,
    records: Sequence[Timed],
    bottleneck_counts: dict[str, int],
    span: Span,
    cpu_stages: dict[str, float],
) -> dict[str, Any]:
    """The fields of :class:`~asyncckpt.results.RunResult`, measured alike for saves and loads:
    the ``from_records`` of ``SaveResult`` and ``LoadResult`` add what each side did.

    The sink's direct-I/O facts move out of ``sink_facts`` into their own metadata fields and
    the rest becomes ``extra``. ``cpu_stages``: the stages' thread CPU seconds the caller
    summed (generation, checksum / verify); the monitor adds the storage calls' where the sink
    measured them (in this process or in the writer process).
    """
    facts = dict(sink_facts)
    metadata = RunMetadata(
        **asdict(setup),
        direct_io=bool(facts.pop("direct_io", False)),
        direct_io_reason=str(facts.pop("direct_io_reason", "")),
        usable_cpus=budget.usable_cpus,
        local_ranks=budget.local_ranks,
        local_ranks_source=budget.local_ranks_source,
        thread_budget_rule=budget.rule_used,
        thread_budget_threads=budget.threads,
        extra=facts,
        **environment_facts(),
    )
    return {
        "method": span.method,
        "size_bytes": span.size,
        "wall_s": span.wall_s,
        "open_s": span.open_s,
        "close_s": span.close_s,
        "close_detail": span.close_detail,
        "wait_free_s": sum(r.wait_free_s for r in records),
        "wait_data_s": sum(r.wait_data_s for r in records),
        "chunks": len(records),
        "bottleneck_counts": bottleneck_counts,
        "chunk_latency_s": percentiles([r.latency_s for r in records]),
        "loop_lag_s": monitor.lag(),
        "peak_rss_bytes": monitor.peak_rss,
        "baseline_rss_bytes": monitor.baseline_rss,
        "metadata": metadata,
        **cpu_fields(monitor, cpu_stages),
    }


def cpu_fields(monitor: LoopMonitor, stages: dict[str, float]) -> dict[str, Any]:
    """``cpu_s``, ``writer_cpu_s``, ``cpu_scope`` and ``cpu_stages_s`` from the monitor's meter."""
    meter = monitor.cpu
    stages = dict(stages)
    if meter.storage_s is not None:
        stages["storage"] = meter.storage_s
    return {
        "cpu_s": meter.process_s,
        "writer_cpu_s": meter.writer_s,
        "cpu_scope": SCOPE_PROCESS if meter.writer_s is None else SCOPE_WITH_WRITER,
        "cpu_stages_s": stages,
    }


def environment_facts() -> dict[str, Any]:
    return {
        "event_loop": event_loop_name(),
        "hostname": socket.gethostname(),
        "python": platform.python_version(),
        "versions": package_versions(),
    }


R = TypeVar("R", bound=RunResult)


def with_setup(result: R, caller_s: float) -> R:
    """``result`` with its ``setup_s``: what the caller's ``caller_s`` spent outside the timed
    window (a fresh checkpointer's first save pays its handle and writer process there)."""
    return dataclasses.replace(result, setup_s=max(0.0, caller_s - result.wall_s))

"""Facts about the running environment recorded with every result."""

from __future__ import annotations

import asyncio
import importlib.metadata
import platform
import socket
from typing import Any

from .topology import ThreadBudget

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
    """Installed versions of the packages that can shape a result."""
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


def run_facts(budget: ThreadBudget, sink_facts: dict[str, Any]) -> dict[str, Any]:
    """The RunMetadata fields saves and loads share; the sink's direct-I/O facts move out of
    ``sink_facts`` into their own fields and the rest becomes ``extra``."""
    return {
        "direct_io": bool(sink_facts.pop("direct_io", False)),
        "direct_io_reason": str(sink_facts.pop("direct_io_reason", "")),
        "usable_cpus": budget.usable_cpus,
        "local_ranks": budget.local_ranks,
        "local_ranks_source": budget.local_ranks_source,
        "extra": sink_facts,
        **environment_facts(),
    }


def environment_facts() -> dict[str, Any]:
    return {
        "event_loop": event_loop_name(),
        "hostname": socket.gethostname(),
        "python": platform.python_version(),
        "versions": package_versions(),
    }

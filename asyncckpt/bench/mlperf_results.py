"""``--results-dir``: an MLPerf Storage-style ``summary.json`` and metadata file.

MLPerf Storage's tooling reads DLIO's ``summary.json`` (times, hosts, and per checkpoint
``metric.checkpoint_write_throughput_GB_per_second`` / ``..._read_...`` lists, in DLIO's
"GB" = 1024**3 bytes) and mlpstorage's ``checkpointing_<run_datetime>_metadata.json``. The
same fields are written here from a workload run, so a result can sit beside a DLIO one;
asyncckpt's own JSON (``--json``) keeps its 10**9-byte GB and says so. The mapping of every
field is documented in docs/scaleout.md.
"""

from __future__ import annotations

import json
import os
import socket
from datetime import datetime
from pathlib import Path
from typing import Any

from .dlio_layout import DLIO_GB
from .scaleout import ScaleoutInfo

TIME_FORMAT = "%Y-%m-%dT%H:%M:%S.%f"  # DLIO's utcnow() format
RUN_DATETIME_FORMAT = "%Y%m%d_%H%M%S"  # mlpstorage's run id


def host_facts() -> dict[str, Any]:
    """This rank's host: name, memory (bytes) and CPU count (gathered on rank 0)."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        memory = 0
    return {"hostname": socket.gethostname(), "memory_bytes": memory, "cpu_count": os.cpu_count() or 0}


def summary_json(report: dict[str, Any], start: datetime, end: datetime) -> dict[str, Any]:
    hosts: dict[str, dict[str, Any]] = {}
    for h in report["hosts"]:
        hosts.setdefault(h["hostname"], h)
    phases = report["phases"]

    def rates(name: str) -> list[float]:
        return [c["throughput_bps"] / DLIO_GB for c in phases.get(name, {}).get("checkpoints", [])]

    return {
        "start": start.strftime(TIME_FORMAT),
        "end": end.strftime(TIME_FORMAT),
        "num_accelerators": report["world_size"],
        "num_hosts": len(hosts),
        "hostname": socket.gethostname(),
        "host_memory_GB": [h["memory_bytes"] / DLIO_GB for h in hosts.values()],
        "host_cpu_count": [h["cpu_count"] for h in hosts.values()],
        "workload": report["workload"],
        "metric": {
            "checkpoint_write_throughput_GB_per_second": rates("save"),
            "checkpoint_read_throughput_GB_per_second": rates("load"),
            "checkpoint_write_duration_seconds": [
                c["duration_s"] for c in phases.get("save", {}).get("checkpoints", [])
            ],
            "checkpoint_read_duration_seconds": [
                c["duration_s"] for c in phases.get("load", {}).get("checkpoints", [])
            ],
            # the size the throughputs divide: what one checkpoint wrote (after --scale)
            "checkpoint_size_GB": report["checkpoint_bytes"] / DLIO_GB,
            "unscaled_checkpoint_size_GB": report["plan"]["total_bytes"] / DLIO_GB,
        },
        "subset": report["subset"],
    }


def metadata_json(report: dict[str, Any], info: ScaleoutInfo, start: datetime) -> dict[str, Any]:
    wl = info.workload
    return {
        "benchmark_type": "checkpointing",
        "model": info.preset["model"] if info.preset else report["workload"],
        "command": "python -m asyncckpt.bench " + " ".join(info.command),
        "run_datetime": start.strftime(RUN_DATETIME_FORMAT),
        "num_processes": report["world_size"],
        "parameters": wl.document if wl is not None else {},
        "override_parameters": {o.split("=", 1)[0].lstrip("+"): o.split("=", 1)[1] for o in info.overrides},
    }


def write_results_dir(
    directory: Path, report: dict[str, Any], info: ScaleoutInfo, start: datetime, end: datetime
) -> list[Path]:
    """Write both files into ``directory`` (created); nothing existing is overwritten."""
    directory.mkdir(parents=True, exist_ok=True)
    meta = metadata_json(report, info, start)
    out = [
        (directory / "summary.json", summary_json(report, start, end)),
        (directory / f"checkpointing_{meta['run_datetime']}_metadata.json", meta),
    ]
    written = []
    for path, doc in out:
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(doc, indent=2, default=str) + "\n")
        try:
            os.link(tmp, path)  # fails if the file exists: an earlier run's result is kept
        except FileExistsError:
            tmp.unlink()
            raise FileExistsError(f"{path} exists; use an empty --results-dir per run") from None
        tmp.unlink()
        written.append(path)
    return written

"""``python -m asyncckpt.bench ls ROOT [--json]``: the steps under a manager's root, for people.

Reads only: each step's commit record (world size, time, sizes, and the metadata the manager
recorded: metrics, asyncckpt version). A step without a record is listed as uncommitted; one
whose record cannot be read as unreadable, its reason on stderr, and the exit status is 1.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Mapping
from typing import Any

from ..checkpointer import AsyncCheckpointer
from ..errors import IntegrityError, TargetNotFoundError
from ..results.text import format_table
from ..sinks import local_path
from ..steps import StepCommit, check_root, step_records
from .parsing import Parser

LS = (
    "List the steps under a CheckpointManager root: committed or not, when, by how many ranks, their "
    "size, and the metrics and asyncckpt version recorded with each (s3:// credentials and endpoint "
    "from AWS_* variables, az:// from AZURE_STORAGE_* variables)."
)


def ls_parser() -> Parser:
    p = Parser.subcommand("ls", LS)
    p.add_argument(
        "root",
        help="the manager's root: a directory (a path, file:// or direct://), s3://bucket/prefix "
        "or az://container/prefix",
    )
    p.add_argument("--json", action="store_true", help="print the listing as JSON instead of a table")
    return p


def ls_main(argv: list[str]) -> int:
    args = ls_parser().parse_args(argv)
    return asyncio.run(_run(args.root, args.json))


def _entry(step: int, record: StepCommit | IntegrityError | None) -> dict[str, Any]:
    if isinstance(record, IntegrityError):  # listed, not the end of the listing
        return {"step": step, "committed": False, "unreadable": str(record)}
    if record is None:
        return {"step": step, "committed": False}
    meta = record.metadata or {}
    return {
        "step": step,
        "committed": True,
        "committed_at": record.committed_at,
        "world_size": record.world_size,
        "size_bytes": sum(record.sizes),
        "metrics": meta.get("metrics", {}),
        "asyncckpt_version": meta.get("asyncckpt_version"),
    }


def _row(entry: dict[str, Any]) -> tuple[object, ...]:
    if "unreadable" in entry:
        return (entry["step"], "unreadable", "", "", "", "", "")
    if not entry["committed"]:
        return (entry["step"], "uncommitted", "", "", "", "", "")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(entry["committed_at"]))
    metrics = _metrics_text(entry["metrics"])
    version = entry["asyncckpt_version"] or "?"
    return (entry["step"], "committed", when, entry["world_size"], entry["size_bytes"], version, metrics)


def _metrics_text(metrics: object) -> str:
    """``loss=0.31 acc=0.9``; what is not a number (a record written by something else) as it
    was recorded, never a crash of the whole listing."""
    if not isinstance(metrics, Mapping):
        return repr(metrics)
    return " ".join(f"{k}={_metric(v)}" for k, v in sorted(metrics.items(), key=lambda kv: str(kv[0])))


def _metric(value: object) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value:g}"
    return repr(value)


async def _run(root: str, as_json: bool) -> int:
    async with AsyncCheckpointer() as ckpt:
        base = check_root(root, ckpt.storage)
        where = local_path(base)
        if where is not None and not where.is_dir():  # a mistyped root says so (a prefix cannot)
            raise TargetNotFoundError(f"no directory {base!r}")
        entries = [_entry(s, record) for s, record in await step_records(ckpt, base)]
    unreadable = [e for e in entries if "unreadable" in e]
    rc = 1 if unreadable else 0  # a step nobody can load: a script must not read "all is well"
    if as_json:
        print(json.dumps({"root": base, "steps": entries}, indent=2))
        return rc
    headers = ["step", "state", "committed (UTC)", "ranks", "bytes", "asyncckpt", "metrics"]
    if entries:
        print(format_table(headers, [_row(e) for e in entries]))
    committed = sum(e["committed"] for e in entries)
    damaged = f", {len(unreadable)} unreadable" if unreadable else ""
    print(f"{len(entries)} step(s) under {base}, {committed} committed{damaged}")
    for e in unreadable:
        print(f"asyncckpt.bench ls: step {e['step']}: {e['unreadable']}", file=sys.stderr)
    return rc

"""The versioned format of result files: version constant, the shipped JSON Schema, checks.

``schema_version`` is ``MAJOR.MINOR``: adding a field bumps MINOR (old readers still
understand the file), removing or changing one bumps MAJOR. Readers accept their own MAJOR
and the previous one (:func:`upgrade` turns it into the current shape as it is read), and
refuse a newer one with a clear error rather than misreading it.

2.0: loads have their own read-named fields and records (1.x loads reused the save's
write-named ones); saves no longer carry the load-only ``verify_s``/``verify_bps``.
2.1: multi-rank results name the collectives' ``engine`` (``mpi`` or ``torch``).
2.2: run metadata names the thread-budget rule (``thread_budget_rule``: ``leave_loop_core``,
``mlperf`` or ``override``) and the threads it gave (``thread_budget_threads``).
2.2 also: every save and load carries its CPU time (``cpu_s``, ``writer_cpu_s``, ``cpu_scope``,
``cpu_stages_s``; derived ``cpu_total_s``, ``cpu_s_per_gb``, ``cpu_stages_s_per_gb``) and its
records the stages' CPU (``checksum_cpu_s``, ``verify_cpu_s``); 2.1 files read with these empty.
2.3: run metadata names the niceness and scheduling class of the CPU-only threads (``cpu_nice``,
``cpu_idle``); older files read with both null (not recorded).
2.4: and whether they ran only beside the event loop's CPU (``cpu_pinned``); null before.
2.5: saves name their ``integrity`` (``crc32c``, or ``none``: no checksum was computed);
older files read as ``crc32c``, the only mode they had.
2.6: every result carries ``setup_s``, its time outside the timed window (derived
``caller_s`` = ``wall_s`` + ``setup_s``); older files read it as null (not recorded).
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

from ..errors import ConfigError

SCHEMA_VERSION = "2.6"
#: the majors this release reads: its own and the previous one
READABLE_MAJORS = ("1", "2")
SCHEMA_RESOURCE = "schemas/result.schema.json"


@cache
def load_schema() -> dict[str, Any]:
    """The JSON Schema shipped in the package (package data, no network)."""
    text = resources.files("asyncckpt").joinpath(SCHEMA_RESOURCE).read_text(encoding="utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


def check_version(doc: dict[str, Any], source: str = "result") -> str:
    """The document's schema version; ConfigError for a missing or newer-major one."""
    version = doc.get("schema_version")
    if not isinstance(version, str):
        raise ConfigError(
            f"{source}: no schema_version; not an asyncckpt result file (or one written before "
            f"versioning: re-run it with this release)"
        )
    major = version.split(".", 1)[0]
    if major not in READABLE_MAJORS:
        raise ConfigError(
            f"{source}: schema_version {version} is not readable by this release "
            f"(reads {' and '.join(m + '.x' for m in READABLE_MAJORS)})"
        )
    return version


#: 1.x load fields → their 2.0 names (results, then per-chunk records)
_LOAD_RENAMED = {
    "gen_s": "consume_s",
    "write_s": "read_s",
    "write_latency_s": "read_latency_s",
    "gen_bps": "consume_bps",
    "gen_io_ratio": "consume_io_ratio",
}
_READ_RECORD_RENAMED = {
    "fill_s": "consume_s",
    "write_s": "read_s",
    "t_write_start": "t_read_start",
    "t_write_end": "t_read_end",
}


def upgrade(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` (a version :func:`check_version` accepted) in the current shape; a 1.x file is
    rewritten in a copy, so ``report`` and ``compare`` only ever see one format."""
    if doc["schema_version"].split(".", 1)[0] != "1":
        return doc
    out = {**doc, "schema_version": SCHEMA_VERSION}
    if "results" in doc:
        out["results"] = [_upgrade_result(r) for r in doc["results"]]
    return out


def _upgrade_result(r: dict[str, Any]) -> dict[str, Any]:
    out = {**r, "schema_version": SCHEMA_VERSION}
    if r["operation"] != "load":  # a save: only the load-only fields go
        for key in ("verify_s", "verify_bps"):
            out.pop(key, None)
        if "records" in r:
            out["records"] = [{k: v for k, v in rec.items() if k != "verify_s"} for rec in r["records"]]
        return out
    out = {_LOAD_RENAMED.get(k, k): v for k, v in out.items() if k not in ("checksum_s", "checksum_bps")}
    out["read_bps"] = r["size_bytes"] / r["write_s"] if r["write_s"] > 0 else None
    if "records" in r:
        out["records"] = [
            {_READ_RECORD_RENAMED.get(k, k): v for k, v in rec.items() if k not in ("checksum", "checksum_s")}
            for rec in r["records"]
        ]
    return out

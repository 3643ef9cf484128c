"""Result files: read a saved JSON (version checked), write JSON and CSV without ever leaving
a half-written file behind (temporary name in the same directory, then rename)."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import secrets
import sys
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..errors import ConfigError, TargetNotFoundError
from ..results.schema import check_version, upgrade

#: columns of ``--csv``: one row per chunk; times in seconds, ``t_*`` relative to the
#: first chunk of that result (perf_counter stamps mean nothing across processes); a save's
#: row leaves the read columns empty and a load's the write columns
CSV_COLUMNS = (
    "result",
    "operation",
    "method",
    "backend",
    "index",
    "offset",
    "nbytes",
    "wait_free_s",
    "fill_s",
    "consume_s",
    "wait_data_s",
    "write_s",
    "read_s",
    "checksum_s",
    "verify_s",
    "checksum_cpu_s",
    "verify_cpu_s",
    "latency_s",
    "t_acquire",
    "t_write_start",
    "t_write_end",
    "t_read_start",
    "t_read_end",
    "bottleneck",
    "checksum",
)


#: result documents the bench writes that ``report`` and ``compare`` do not read, and why
_OTHER_RUNS = {
    "dlio": (
        "a DLIO workload run's result; report and compare read plain and MPI runs (modes single "
        "and mpi). A workload's figures for MLPerf are in its --results-dir (summary.json)"
    ),
    "tiered": (
        "a tiered run's result (--local); report and compare read plain and MPI runs (modes "
        "single and mpi). Its figures are in the file as written"
    ),
}


def load_result(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A result document from disk, in the current schema (an older readable version is upgraded);
    ConfigError names the file and what is wrong with it."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TargetNotFoundError(2, f"no result file {str(p)!r}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {str(p)!r}: {exc.strerror or exc}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{str(p)!r} is not JSON: {exc.msg} at line {exc.lineno}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{str(p)!r} is not an asyncckpt result (top level is not an object)")
    if doc.get("mode") in _OTHER_RUNS:  # the bench's own, of a kind these commands do not read
        raise ConfigError(f"{str(p)!r} is {_OTHER_RUNS[doc['mode']]}")
    check_version(doc, repr(str(p)))
    if doc.get("mode") not in ("single", "mpi"):
        raise ConfigError(f"{str(p)!r}: unknown result mode {doc.get('mode')!r}")
    return upgrade(doc)


def stamp(doc: dict[str, Any], argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Add when the file was written and the command that wrote it."""
    doc["created"] = datetime.now(UTC).isoformat(timespec="seconds")
    doc["command"] = ["python", "-m", "asyncckpt.bench", *(sys.argv[1:] if argv is None else argv)]
    return doc


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path``; renamed over it only if the block succeeds."""
    tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.part"
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))  # umask applies, as for open()
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_text(path: Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: Path, doc: Mapping[str, Any]) -> None:
    write_text(path, json.dumps(doc, indent=2) + "\n")


def csv_rows(doc: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    for i, r in enumerate(doc.get("results", ())):
        recs = r.get("records") or []
        t0 = min((rec["t_acquire"] for rec in recs), default=0.0)
        io = "read" if r["operation"] == "load" else "write"
        for rec in recs:
            row = {k: rec.get(k) for k in CSV_COLUMNS if k in rec}
            row.update(
                result=i + 1,
                operation=r["operation"],
                method=r["method"],
                backend=r["metadata"]["backend"],
                latency_s=rec[f"t_{io}_end"] - rec["t_acquire"],
                t_acquire=rec["t_acquire"] - t0,
            )
            for stamp in (f"t_{io}_start", f"t_{io}_end"):
                row[stamp] = rec[stamp] - t0
            yield row


def check_csv_source(doc: Mapping[str, Any]) -> None:
    """``--csv`` needs per-chunk records in ``doc``: said before anything is printed."""
    if doc.get("mode") == "mpi":
        raise ConfigError("--csv: an MPI result holds no per-chunk records (run one rank without mpirun)")
    if not any(r.get("records") for r in doc.get("results", ())):
        raise ConfigError("--csv: this result has no per-chunk records (save it with --records)")


def to_csv(doc: Mapping[str, Any]) -> str:
    """Per-chunk records of every result as CSV (spreadsheets); needs records in ``doc``."""
    check_csv_source(doc)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(csv_rows(doc))
    return out.getvalue()


def check_output_path(path: Path | None, option: str) -> None:
    """Bad output paths are bad input: said before any I/O."""
    if path is not None and not (path.parent if str(path.parent) else Path(".")).is_dir():
        raise ConfigError(f"{option} {str(path)!r}: directory {str(path.parent)!r} does not exist")


def written_by_the_bench(path: Path, option: str) -> bool:
    """Whether the existing file ``path`` is an output of this bench of ``option``'s kind: a
    results file holds the command that wrote it, a CSV file starts with the bench's header,
    an HTML report has the bench's title. Tells one it wrote from a file it must not replace."""
    try:
        with path.open("rb") as f:
            data = f.read() if option == "--json" else f.read(4096)
    except OSError:
        return False
    if option == "--json":
        return b'"asyncckpt.bench"' in data
    if option == "--csv":
        return data.split(b"\n", 1)[0] == ",".join(CSV_COLUMNS).encode()
    return option == "--report" and b"<title>asyncckpt " in data


def check_output_file(path: Path | None, option: str, *, overwrite: bool = False) -> None:
    """A file the run writes at its end is checked now: a typo must not cost the whole run,
    and a file the bench did not write is not replaced unless ``overwrite`` (``--overwrite``)."""
    if path is None:
        return
    parent = path.parent
    if path.is_dir():
        raise ConfigError(f"{option} {str(path)!r} is a directory; give a file path")
    if not parent.is_dir():
        raise ConfigError(f"{option} {str(path)!r}: directory {str(parent)!r} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ConfigError(f"{option} {str(path)!r} is not writable")
    if path.exists() and not overwrite and not written_by_the_bench(path, option):
        raise ConfigError(
            f"{option} {str(path)!r} exists and is not an output of this bench; give another "
            "path, remove it, or pass --overwrite to replace it"
        )

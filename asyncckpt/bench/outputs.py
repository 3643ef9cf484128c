"""Everything a run (or ``report``) writes besides stdout: JSON, CSV, PNG plots, HTML.

Live runs and ``report run.json`` go through the same functions with the same document, so
a re-rendered report is exactly what the run would have written.
"""

from __future__ import annotations

import argparse
import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import ConfigError, MissingDependencyError
from ..node.topology import world
from ..results.records import result_from_dict
from . import plots
from .folders import check_can_write
from .htmlreport import render_html
from .report import (
    format_backend_comparison,
    format_comparison,
    format_distributed,
    format_phases,
    format_summary,
)
from .resultfiles import check_output_file, check_output_path, to_csv, write_json, write_text


def add_output_arguments(p: argparse.ArgumentParser, *, json_option: bool = True) -> None:
    if json_option:
        p.add_argument("--json", type=Path, default=None, help="also write results as JSON to FILE")
        p.add_argument("--records", action="store_true", help="include per-chunk records in the JSON")
    p.add_argument("--csv", type=Path, default=None, metavar="FILE", help="per-chunk records as CSV")
    p.add_argument(
        "--plots", type=Path, default=None, metavar="DIR", help="PNG plots into DIR ([plots] extra)"
    )
    p.add_argument(
        "--report",
        type=Path,
        default=None,
        metavar="FILE",
        help="one self-contained HTML report ([plots] extra)",
    )


def needs_records(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "records", False) or args.csv or args.plots or args.report)


def check_outputs(args: argparse.Namespace, *, mpi: bool = False) -> None:
    """Before any I/O: every file the run writes at its end can be written there (a read-only
    folder, a directory given for a file), as for ``--json``, and matplotlib is there if plots
    are asked for: a bad path must not cost the whole run. Under mpirun only rank 0 writes, so
    only rank 0 checks that it may write."""
    writer = world()[0] == 0
    for option in ("json", "csv", "report"):
        path = getattr(args, option, None)
        if writer:
            check_output_file(path, f"--{option}", overwrite=bool(getattr(args, "overwrite", False)))
        else:
            check_output_path(path, f"--{option}")
    if args.plots is not None and args.plots.exists() and not args.plots.is_dir():
        raise ConfigError(f"--plots {str(args.plots)!r} is not a directory")
    if args.plots is not None:
        check_output_path(args.plots, "--plots")
        if writer:
            check_can_write(args.plots, f"--plots {str(args.plots)!r}")
    if (args.plots or args.report) and importlib.util.find_spec("matplotlib") is None:
        raise MissingDependencyError("matplotlib", "plots", "--plots / --report")
    if mpi and args.csv:
        raise ConfigError("--csv: an MPI run does not gather per-chunk records; run one rank without mpirun")


def render_text(doc: Mapping[str, Any], *, quiet: bool = False) -> str:
    """The text report of a result document (what the run printed)."""
    if doc.get("mode") == "mpi":
        return format_distributed(doc)
    results = [result_from_dict(r) for r in doc["results"]]
    blocks = [] if quiet else [str(r) for r in results]
    if len({r.metadata.backend for r in results}) > 1:
        blocks.append(format_backend_comparison(results))
    else:
        blocks.append(format_comparison(results))
    summary = doc.get("summary") or {}
    if "load" in summary:
        blocks.append(format_phases(summary))
    elif len(results) > 1:
        blocks.append(format_summary(summary))
    return "\n\n".join(blocks)


def _without_records(doc: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(doc)
    if "results" in out:
        out["results"] = [{k: v for k, v in r.items() if k != "records"} for r in out["results"]]
    return out


def write_outputs(doc: Mapping[str, Any], text: str, args: argparse.Namespace) -> list[str]:
    """Write what ``args`` asks for; returns one line per file written (for stderr)."""
    written = []
    json_path = getattr(args, "json", None)
    if json_path is not None:
        write_json(json_path, doc if getattr(args, "records", False) else _without_records(doc))
    if args.csv is not None:
        write_text(args.csv, to_csv(doc))
        written.append(f"per-chunk CSV: {args.csv}")
    if args.plots is not None or args.report is not None:
        pngs = plots.render(doc)
        if args.plots is not None:
            paths = plots.write_pngs(pngs, args.plots)
            written.append(f"{len(paths)} plot(s) in {args.plots}")
        if args.report is not None:
            write_text(args.report, render_html(doc, text, pngs, plots.not_plotted(doc)))
            written.append(f"HTML report: {args.report}")
    return written

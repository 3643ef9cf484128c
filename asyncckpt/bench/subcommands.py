"""``report`` and ``compare``: work on saved result files, never on storage."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError, IntegrityError, MissingDependencyError, TargetNotFoundError
from ..results.text import format_table
from .cleanup import cleanup_main
from .compare import ALPHA, compare_docs
from .grammar import Command, NotYet, Override, not_yet
from .outputs import add_output_arguments, check_outputs, render_text, write_outputs
from .parsing import Parser
from .pipes import stdout_reader_gone
from .resultfiles import check_csv_source, load_result
from .steplist import ls_main


def report_parser() -> Parser:
    p = Parser.subcommand(
        "report", "Re-render the table, plots and HTML report of a saved result (--json FILE)."
    )
    p.add_argument("result", type=Path, help="a JSON result written with --json")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the summary table")
    add_output_arguments(p, json_option=False)
    return p


def report_main(argv: list[str]) -> int:
    args = report_parser().parse_args(argv)
    check_outputs(args)
    doc = load_result(args.result)
    if args.csv is not None:
        check_csv_source(doc)  # before the report is printed, not after it
    text = render_text(doc, quiet=args.quiet)
    print(text)
    for line in write_outputs(doc, text, args):
        print(f"[asyncckpt] {line}", file=sys.stderr)
    return 0


def compare_parser() -> Parser:
    p = Parser.subcommand(
        "compare",
        "Compare saved results metric by metric against the first (the baseline). Repeated checkpoints "
        "(--repeat N) are the samples; the verdict is a Mann-Whitney rank test, the interval a "
        "bootstrap of the ratio of means.",
    )
    p.add_argument(
        "results",
        nargs="+",
        help="JSON results; the first is the baseline. A,B,C pools several files into one side",
    )
    p.add_argument("--alpha", type=float, default=ALPHA, help="significance level (0.05)")
    p.add_argument("--fail-on-regression", action="store_true", help="exit 1 when any metric got worse")
    return p


def compare_main(argv: list[str]) -> int:
    args = compare_parser().parse_args(argv)
    if len(args.results) < 2:
        raise ConfigError("compare needs at least two results: BASELINE CANDIDATE [...]")
    if not 0 < args.alpha < 1:
        raise ConfigError(f"--alpha must be between 0 and 1, got {args.alpha}")
    sides = [[load_result(f) for f in spec.split(",") if f] for spec in args.results]
    docs = [pool(side, spec) for side, spec in zip(sides, args.results, strict=True)]
    try:
        rows = compare_docs(docs, args.alpha)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    names = [Path(spec.split(",")[0]).name + ("+" if "," in spec else "") for spec in args.results]
    headers = ["phase", "metric", f"{names[0]} (baseline)"]
    for name in names[1:]:
        headers += [name, "change [95% CI]", "verdict"]
    print(format_table(headers, [(r.group, r.metric.label, *r.cells) for r in rows]))
    worse = [r for r in rows if any(v is not None and v.regression for v in r.verdicts)]
    print(
        f"\nmean ± stdev over repeated checkpoints; verdict: Mann-Whitney rank test, Holm-adjusted "
        f"over the metrics, alpha={args.alpha:g}; {len(worse)} metric(s) worse"
    )
    return 1 if worse and args.fail_on_regression else 0


def pool(docs: list[dict[str, Any]], spec: str) -> dict[str, Any]:
    """Several result files as one side: their runs become one sample."""
    if not docs:
        raise ConfigError(f"no result file in {spec!r}")
    if len(docs) == 1:
        return docs[0]
    if len({d.get("mode") for d in docs}) > 1:
        raise ConfigError(f"{spec!r}: cannot pool MPI and single-process results")
    first = dict(docs[0])
    if first.get("mode") == "mpi":
        phases: dict[tuple[str, str], dict[str, Any]] = {}
        for d in docs:
            for ph in d["phases"]:
                key = (ph["phase"], ph["method"])
                acc = phases.setdefault(key, {**ph, "checkpoints": []})
                acc["checkpoints"] += ph["checkpoints"]
        first["phases"] = list(phases.values())
    else:
        first["results"] = [r for d in docs for r in d["results"]]
    return first


def _check_no_overrides(name: str, overrides: Sequence[Override]) -> None:
    if overrides:
        raise ConfigError(f"{name} takes no overrides: {' '.join(o.token for o in overrides)}")


SUBCOMMANDS: dict[str, Callable[[list[str]], int]] = {
    "report": report_main,
    "compare": compare_main,
    "cleanup": cleanup_main,
    "ls": ls_main,
    "plan": not_yet("plan"),
}


__all__ = ["SUBCOMMANDS", "NotYet", "run_subcommand"]


def run_subcommand(cmd: Command) -> int:
    """Run ``cmd``; bad input is one line and exit 2, a failure exit 1, never a traceback."""
    assert cmd.name is not None
    try:
        _check_no_overrides(cmd.name, cmd.overrides)
        return SUBCOMMANDS[cmd.name](cmd.argv)
    except (ConfigError, MissingDependencyError, TargetNotFoundError) as exc:
        print(f"asyncckpt.bench {cmd.name}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        if stdout_reader_gone():  # | head: main exits quietly
            raise
        print(f"asyncckpt.bench {cmd.name}: failed: broken pipe", file=sys.stderr)
        return 1
    except (OSError, IntegrityError) as exc:  # an unreadable record (ls): one line, not a traceback
        print(f"asyncckpt.bench {cmd.name}: failed: {exc}", file=sys.stderr)
        return 1

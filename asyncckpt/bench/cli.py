"""Command line of the benchmark: parse, validate before any I/O, run, report."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import sys
import tempfile
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

from ..config import CheckpointConfig
from ..errors import AsyncCkptError, ConfigError, MissingDependencyError, TargetNotFoundError
from ..units import parse_size
from .runner import BenchPlan, run_plan

DEFAULT_SIZE = "1GiB"


def _size(name: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            return parse_size(text, name=name)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m asyncckpt.bench",
        description="Measure checkpoint save throughput with honest per-chunk profiling.",
    )
    p.add_argument("target", nargs="?", help="file path or URI (default: a temporary directory)")
    p.add_argument("--size", type=_size("--size"), default=DEFAULT_SIZE, help="checkpoint size (1GiB)")
    p.add_argument("--chunk-size", type=_size("--chunk-size"), default="32MiB", help="buffer size (32MiB)")
    p.add_argument("--num-buffers", type=int, default=8, help="buffers in the pool (8)")
    p.add_argument("--generator", choices=("dgen", "numpy"), default=None, help="data generator")
    p.add_argument("--gen-threads", type=int, default=None, help="override generator threads")
    p.add_argument("--seed", type=int, default=None, help="generator seed")
    p.add_argument("--method", choices=("streaming", "preallocate", "both"), default="streaming")
    p.add_argument("--direct-io", choices=("auto", "on", "off"), default="auto")
    p.add_argument("--no-fsync", action="store_true", help="skip fsync at close")
    p.add_argument("--max-in-flight", type=int, default=None, help="writes in flight")
    p.add_argument("--backend", default=None, help="storage backend (default: from the URI)")
    p.add_argument("--repeat", type=int, default=1, help="checkpoints to write (1)")
    p.add_argument("--keep", action="store_true", help="keep the written checkpoint")
    p.add_argument("--loop", choices=("auto", "asyncio", "uvloop"), default="auto")
    p.add_argument("--json", type=Path, default=None, help="also write results as JSON to FILE")
    p.add_argument("--records", action="store_true", help="include per-chunk records in the JSON")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the summary table")
    p.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    p.add_argument(
        "--embedded-s3",
        choices=("swift", "moto"),
        default=None,
        help="start a local S3 server for this run (default target s3://asyncckpt-bench/checkpoint.bin)",
    )
    return p


def plan_from_args(args: argparse.Namespace) -> BenchPlan:
    """Turn arguments into a validated plan (raises ConfigError before any I/O)."""
    if args.repeat < 1:
        raise ConfigError(f"--repeat must be >= 1, got {args.repeat}")
    if args.size <= 0:
        raise ConfigError(f"--size must be > 0, got {args.size}")
    options: dict[str, Any] = {
        "chunk_size": args.chunk_size,
        "num_buffers": args.num_buffers,
        "gen_threads": args.gen_threads,
        "direct_io": {"auto": None, "on": True, "off": False}[args.direct_io],
        "fsync": not args.no_fsync,
        "max_in_flight": args.max_in_flight,
        "backend": args.backend,
    }
    if args.generator is not None:
        options["generator"] = args.generator
    if args.seed is not None:
        options["seed"] = args.seed
    config = CheckpointConfig(**options)
    methods = ("streaming", "preallocate") if args.method == "both" else (args.method,)
    return BenchPlan(
        target=args.target,
        size=args.size,
        config=config,
        methods=methods,
        repeat=args.repeat,
        keep=args.keep,
        progress=not args.quiet,
        verbose=not args.quiet,
    )


def run_with_loop(kind: str, factory: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    """Run on uvloop when asked (or, with ``auto``, when installed), else on asyncio."""
    if kind in ("auto", "uvloop"):
        try:
            import uvloop
        except ImportError:
            if kind == "uvloop":
                raise MissingDependencyError("uvloop", "uvloop", "--loop uvloop") from None
        else:
            return uvloop.run(factory())
    return asyncio.run(factory())


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="[asyncckpt] %(message)s",
        stream=sys.stderr,
    )
    try:
        plan = plan_from_args(args)
        with contextlib.ExitStack() as stack:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="asyncckpt-bench-"))
            if args.embedded_s3 is not None:
                from .embedded import start_for_bench

                default_target = start_for_bench(stack, args.embedded_s3)
                plan = plan if plan.target is not None else plan.with_target(default_target)
            if plan.target is None:
                plan = plan.with_target(str(Path(tmp) / "checkpoint.bin"))
            report = run_with_loop(args.loop, lambda: run_plan(plan))
    except (ConfigError, MissingDependencyError, TargetNotFoundError) as exc:
        print(f"asyncckpt.bench: error: {exc}", file=sys.stderr)
        return 2
    except AsyncCkptError as exc:
        print(f"asyncckpt.bench: failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("asyncckpt.bench: interrupted", file=sys.stderr)
        return 130
    print(report.text)
    if args.json is not None:
        args.json.write_text(json.dumps(report.to_json(records=args.records), indent=2) + "\n")
    return 0

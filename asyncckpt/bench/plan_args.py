"""From parsed arguments to a validated plan, and the event loop a run goes on.

Shared by every way the CLI runs (one process, ``mpirun``/``torchrun`` ranks, a DLIO
workload), so those runners import it instead of being handed it by ``cli``.
"""

from __future__ import annotations

import argparse
import asyncio
import re
from collections.abc import Callable, Coroutine
from typing import Any

from .. import modes
from ..config import CheckpointConfig
from ..errors import ConfigError, MissingDependencyError
from ..node.topology import world
from .load_args import load_plan_from_args
from .resultfiles import check_output_file
from .runner import BenchPlan

#: the library's name of each setting an option sets: its errors name the option, as typed
FLAGS = {
    **{
        name: "--" + name.replace("_", "-")
        for name in (
            "chunk_size",
            "num_buffers",
            "gen_threads",
            "thread_budget",
            "cpu_nice",
            "max_in_flight",
            "backend",
            "integrity",
            "generator",
            "seed",
            "writer_timeout",
            "stall_timeout",
        )
    },
    "part_size": "--part-size",
    "endpoint_url": "--endpoint",
    "endpoints": "--endpoints",
    "lb_strategy": "--lb-strategy",
}


def cli_config(options: dict[str, Any]) -> CheckpointConfig:
    """The configuration, its errors naming the command-line option, not the library's field:
    ``--chunk-size 1000`` is reported as ``--chunk-size must be >= 4096``, not ``chunk_size``."""
    try:
        return CheckpointConfig(**options)
    except ConfigError as exc:
        given = {**options, **options.get("backend_options", {})}
        names = [name for name in FLAGS if given.get(name) is not None]
        if not names:
            raise
        pattern = re.compile(r"(?<![\w-])(" + "|".join(names) + r")\b")
        raise type(exc)(pattern.sub(lambda m: FLAGS[m.group(1)], str(exc))) from exc


def plan_from_args(args: argparse.Namespace) -> BenchPlan:
    """Turn arguments into a validated plan (raises ConfigError before any I/O)."""
    if world()[0] == 0:  # under mpirun only rank 0 writes the report
        check_output_file(args.json, "--json", overwrite=bool(getattr(args, "overwrite", False)))
    if args.repeat < 1:
        raise ConfigError(f"--num-checkpoints-write (--repeat) must be >= 1, got {args.repeat}")
    if args.size <= 0:
        raise ConfigError(f"--size must be > 0, got {args.size}")
    options: dict[str, Any] = {
        "chunk_size": args.chunk_size,
        "num_buffers": args.num_buffers,
        "gen_threads": args.gen_threads,
        "thread_budget": args.thread_budget,
        "cpu_nice": args.cpu_nice,
        "cpu_idle": modes.SWITCH[args.cpu_idle],
        "direct_io": modes.SWITCH[args.direct_io],
        "fsync": not args.no_fsync,
        "max_in_flight": args.max_in_flight,
        "backend": args.backend,
        "integrity": args.integrity,
    }
    s3_options = {
        "part_size": args.part_size,
        "endpoint_url": args.endpoint,
        "endpoints": args.endpoints,
        "lb_strategy": args.lb_strategy,
    }
    if any(v is not None for v in s3_options.values()):
        options["backend_options"] = {k: v for k, v in s3_options.items() if v is not None}
    if args.generator is not None:
        options["generator"] = args.generator
    if args.seed is not None:
        options["seed"] = args.seed
    options["isolation"] = args.isolation
    options["mp_start_method"] = args.mp_start_method
    if args.writer_timeout is not None:
        options["writer_timeout"] = args.writer_timeout
    if args.stall_timeout is not None:
        options["stall_timeout"] = args.stall_timeout
    config = cli_config(options)
    methods = ("streaming", "preallocate") if args.method == "both" else (args.method,)
    load = load_plan_from_args(args, config)
    return BenchPlan(
        target=args.target,
        size=args.size,
        config=config,
        methods=methods,
        repeat=args.repeat,
        keep=args.keep,
        overwrite=args.overwrite,
        progress=not args.quiet,
        verbose=not args.quiet,
        **load,
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

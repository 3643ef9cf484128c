"""Command line of the benchmark: parse, validate before any I/O, run, report."""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from .. import modes
from ..errors import (
    AsyncCkptError,
    ConfigError,
    MissingDependencyError,
    TargetNotFoundError,
    UnsupportedSchemeError,
)
from ..modes import choices
from ..node.collectives import job_comm
from ..node.topology import world
from ..servers.embedded import start_for_bench
from ..servers.embedded_stores import BENCH_CONTAINER, start_store_for_bench
from ..servers.emulator_process import EmulatorUnavailableError
from ..sinks import capabilities, local_path, serves
from ..sinks.s3 import installed_backends
from ..units import parse_size
from .dlio_run import main_workload
from .folders import check_can_write
from .grammar import RESERVED, check_target, split_command
from .load_args import add_load_arguments
from .mpi_runner import run_distributed
from .outputs import add_output_arguments, check_outputs, needs_records, write_outputs
from .parsing import Parser
from .pipes import stdout_closed, stdout_reader_gone
from .plan_args import plan_from_args, run_with_loop
from .report import format_backend_comparison
from .resultfiles import stamp, write_json
from .runner import BenchPlan, BenchReport, run_plan
from .scaleout import add_scaleout_arguments, parse_with_presets
from .signals import sigterm_as_sigint, temporary_directory
from .subcommands import run_subcommand
from .tiered import TieredPlan, run_tiered
from .unused import check_unused, given

DEFAULT_SIZE = "1GiB"


def _size(name: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            return parse_size(text, name=name)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc).removeprefix(f"{name}: ")) from None

    return parse


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="python -m asyncckpt.bench",
        description="Measure checkpoint save and load throughput with honest per-chunk profiling. "
        f"Subcommands (first argument): {', '.join(RESERVED)}; a target named like one is "
        "written ./NAME. Overrides: +key=value, ++key=value.",
    )
    p.add_argument("target", nargs="?", help="file path or URI (default: a temporary directory)")
    p.add_argument("--size", type=_size("--size"), default=DEFAULT_SIZE, help="checkpoint size (1GiB)")
    p.add_argument("--chunk-size", type=_size("--chunk-size"), default="32MiB", help="buffer size (32MiB)")
    p.add_argument("--num-buffers", type=int, default=8, help="buffers in the pool (8)")
    p.add_argument("--generator", choices=choices(modes.Generator), default=None, help="data generator")
    p.add_argument("--gen-threads", type=int, default=None, help="override generator threads")
    p.add_argument(
        "--thread-budget",
        choices=choices(modes.ThreadBudgetRule),
        default="mlperf",
        help="how generator threads are sized: mlperf = usable CPUs / ranks on this node (the "
        "MLPerf rule, this benchmark's default); leave_loop_core = one core less, the library "
        "default, which keeps event-loop lag low",
    )
    p.add_argument(
        "--cpu-nice",
        type=int,
        default=None,
        help="niceness (0-19) of the generation and checksum threads; default: 10 under "
        "leave_loop_core, 0 under mlperf",
    )
    p.add_argument(
        "--cpu-idle",
        choices=choices(modes.Switch),
        default="auto",
        help="run the generation and checksum threads in the kernel's SCHED_IDLE class (auto: "
        "off; opt-in, see docs/architecture.md)",
    )
    p.add_argument(
        "--integrity",
        choices=choices(modes.Integrity),
        default="crc32c",
        help="what saves compute for verification: crc32c = a CRC32C per chunk (the default, also "
        "under the MLPerf rule and --model presets); none = no checksum, for pure storage "
        "benchmarks (loads then default to --verify none; checksum verification is refused)",
    )
    p.add_argument("--seed", type=int, default=None, help="generator seed")
    p.add_argument("--method", choices=choices(modes.BenchMethod), default="streaming")
    p.add_argument("--direct-io", choices=choices(modes.Switch), default="auto")
    p.add_argument("--no-fsync", action="store_true", help="skip fsync at close")
    p.add_argument(
        "--max-in-flight", type=int, default=None, help="writes in flight (default: the backend's; files 4)"
    )
    p.add_argument("--backend", default=None, help="storage backend (default: from the URI)")
    p.add_argument("--part-size", type=_size("--part-size"), default=None, help="S3 part size (chunk size)")
    p.add_argument("--endpoint", default=None, help="S3 endpoint URL (default: AWS_ENDPOINT_URL)")
    p.add_argument(
        "--endpoints",
        default=None,
        help="several S3 endpoints of one store, comma separated (default: S3_ENDPOINT_URIS, "
        "S3_ENDPOINT_TEMPLATE, S3_ENDPOINT_FILE)",
    )
    p.add_argument(
        "--lb-strategy",
        default=None,
        choices=choices(modes.LoadBalanceStrategy),
        help="how parts are spread over --endpoints (default: S3_LOAD_BALANCE_STRATEGY, else round_robin)",
    )
    p.add_argument(
        "--compare-backends",
        action="store_true",
        help="run every installed S3 backend on s3:// TARGET; one table",
    )
    p.add_argument(
        "--num-checkpoints-write",
        "--repeat",
        dest="repeat",
        type=int,
        default=1,
        help="checkpoints to write (1)",
    )
    p.add_argument(
        "--keep", action="store_true", help="keep the checkpoints this run wrote (default: remove them)"
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a target that exists and is not an asyncckpt checkpoint (refused otherwise)",
    )
    add_load_arguments(p)
    p.add_argument("--loop", choices=choices(modes.LoopKind), default="auto")
    p.add_argument("--isolation", choices=choices(modes.Isolation), default="auto", help="writer process")
    p.add_argument(
        "--mp-start-method",
        choices=choices(modes.StartMethod),
        default=None,
        help="writer start method (default: ASYNCCKPT_MP_START_METHOD, else auto)",
    )
    p.add_argument("--writer-timeout", type=float, default=None, help="seconds a writer may take per request")
    p.add_argument(
        "--stall-timeout",
        type=float,
        default=None,
        help="fail when storage makes no progress this long (20 s)",
    )
    add_output_arguments(p)
    p.add_argument("-q", "--quiet", action="store_true", help="print only the summary table")
    p.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    p.add_argument(
        "--embedded-s3",
        choices=choices(modes.EmbeddedServer),
        default=None,
        help="start a local S3 server for this run (default target s3://asyncckpt-bench/checkpoint.bin)",
    )
    p.add_argument(
        "--embedded-store",
        choices=choices(modes.EmbeddedStore),
        default=None,
        help="start a local Azure Blob (Azurite) or GCS (fake-gcs-server) emulator for this run "
        "(default target az:// or gs://asyncckpt-bench/checkpoint.bin)",
    )
    p.add_argument(
        "--local",
        default=None,
        metavar="DIR",
        help="tiered: commit each step in this local directory, then drain it to TARGET (a directory "
        "or s3://bucket/prefix); reports time to local durable, time to remote durable and drain GB/s",
    )
    add_scaleout_arguments(p)
    return p


def check_local_run(args: argparse.Namespace, *, workload: bool, ranks: int) -> None:
    """``--local`` is a one-process run of a synthetic checkpoint: with a workload (its own
    layout of objects) or several ranks it was silently left out."""
    if args.local is None:
        return
    if workload:
        raise ConfigError(
            "--local (a tiered run) does not take --model/--config: a DLIO workload writes its own objects"
        )
    if ranks > 1:
        raise ConfigError(f"--local (a tiered run) runs in one process; this job has {ranks} ranks")


def tiered_plan(args: argparse.Namespace, plan: BenchPlan) -> TieredPlan:
    """``--local DIR``: the options a tiered run takes, checked before any I/O."""
    if plan.target is None:
        raise ConfigError("--local needs a TARGET: the remote root (a directory or s3://bucket/prefix)")
    refused = [
        name
        for name, given in (
            ("--mode load", plan.mode == "load"),
            ("--method", args.method != "streaming"),
            ("--compare-backends", args.compare_backends),
            ("--csv/--plots/--report", args.csv or args.plots or args.report),
            ("--records", getattr(args, "records", False)),
        )
        if given
    ]
    if refused:
        raise ConfigError(f"--local (a tiered run) does not take {', '.join(refused)}")
    local = local_path(args.local)
    if local is None or not local.is_dir():
        raise ConfigError(f"--local {args.local!r} must be an existing local directory")
    if plan.config.integrity != "crc32c":
        raise ConfigError("--local drains verified against CRC32Cs: --integrity must be crc32c")
    return TieredPlan(plan.target, args.local, plan.size, plan.config, steps=plan.repeat, keep=plan.keep)


def run_tiered_cli(args: argparse.Namespace, plan: BenchPlan, argv: Sequence[str] | None) -> int:
    tiered = tiered_plan(args, plan)
    check_local_target(plan)
    report = run_with_loop(args.loop, lambda: run_tiered(tiered))
    print(report.text)
    if args.json is not None:
        write_json(args.json, stamp(report.to_json(), argv))
        print(f"[asyncckpt] results: {args.json}", file=sys.stderr)
    return 0


def check_local_target(plan: BenchPlan) -> None:
    """A save into a folder it cannot write is bad input, said before the first byte."""
    target = plan.target
    if plan.mode != "load" and target is not None and (path := local_path(target)) is not None:
        check_can_write(path.parent, f"cannot save to {target!r}")


def check_client_library(target: str, backend: str | None) -> None:
    """The S3 client library the run will use is installed (MissingDependencyError otherwise):
    checked before an embedded server takes seconds to start."""
    capabilities(target, backend)


def start_embedded_store(stack: contextlib.ExitStack, args: argparse.Namespace, plan: BenchPlan) -> BenchPlan:
    """``--embedded-store``: start the emulator, then refuse a target no backend serves (``az://``
    has obstore-azure, ``gs://`` gcs; a ``--target`` of another scheme may have none): the
    emulator is never pretended to be run."""
    default_target = start_store_for_bench(stack, args.embedded_store)
    plan = plan if plan.target is not None else plan.with_target(default_target)
    assert plan.target is not None
    try:
        capabilities(plan.target, plan.config.backend)
    except UnsupportedSchemeError as exc:
        raise ConfigError(
            f"--embedded-store {args.embedded_store}: the emulator ran and {BENCH_CONTAINER} was created, "
            f"but nothing was run: {exc}"
        ) from None
    return plan


def check_backend_serves(plan: BenchPlan, comparing: bool) -> None:
    """``--backend`` naming a library of another kind of store than the target's: the run would
    measure the target's own library under the name the user gave (a file target with
    ``--backend aiobotocore``): bad input, before any I/O."""
    backend, target = plan.config.backend, plan.target
    if backend is None or target is None or comparing or serves(backend, target):
        return
    raise ConfigError(
        f"--backend {backend} does not serve {target!r}; the run would measure the target's own "
        f"library, {capabilities(target).backend!r}: drop --backend or give a target of its kind"
    )


def compare_backends(plan: BenchPlan, loop: str) -> BenchReport:
    """Every installed S3 backend on the same target, size and settings; one table."""
    if plan.target is None or not plan.target.startswith("s3://"):
        raise ConfigError(f"--compare-backends needs an s3://bucket/key target, got {plan.target!r}")
    results = []
    for name in installed_backends():
        one = replace(plan, config=replace(plan.config, backend=name), verbose=False)
        report: BenchReport = run_with_loop(loop, functools.partial(run_plan, one))
        results += report.results
    return BenchReport(plan, results, format_backend_comparison(results))


def _rank() -> int:
    try:
        return world()[0]
    except ConfigError:
        return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m asyncckpt.bench [TARGET] [options] [+key=value ...]`` or ``SUBCOMMAND ...``.

    SIGINT or SIGTERM: what the run wrote is removed on the way out, then one line and
    rc 130 / 143 (schedulers send SIGTERM). stdout's reader gone (``| head``): quiet rc 141."""
    with sigterm_as_sigint() as interrupt:
        try:
            code = _main(argv)
            sys.stdout.flush()  # a closed pipe shows here, not as a traceback at exit
            return code
        except BrokenPipeError:
            if not stdout_reader_gone():
                raise
            return stdout_closed()
        except KeyboardInterrupt:
            if _rank() == 0:  # under mpirun only rank 0 speaks
                print(f"asyncckpt.bench: {interrupt.message}", file=sys.stderr)
            return interrupt.exit_code


def _main(argv: Sequence[str] | None) -> int:
    try:
        cmd = split_command(sys.argv[1:] if argv is None else argv)
    except ConfigError as exc:
        print(f"asyncckpt.bench: error: {exc}", file=sys.stderr)
        return 2
    if cmd.name is not None:
        return run_subcommand(cmd)
    parser = build_parser()
    try:  # --config / --model supply defaults; under mpirun/torchrun every rank parses the same argv
        comm = job_comm()
        # the grammar recognised the +/++ tokens; the workload loader applies them
        tokens = [*cmd.argv, *(o.token for o in cmd.overrides)]
        args, info = parse_with_presets(parser, tokens, comm.size)
        check_target(args.target)
        args.overrides = cmd.overrides
        check_outputs(args, mpi=comm.engine != "single" or comm.size > 1)
        check_local_run(args, workload=info.workload is not None, ranks=comm.size)
        distributed = comm.engine != "single" or comm.size > 1
        if args.local is None:  # a tiered run refuses what it does not take itself
            check_unused(given(parser, tokens), args.mode, shards_named=distributed and info.workload is None)
    except (ConfigError, MissingDependencyError) as exc:
        if _rank() == 0:  # under mpirun only rank 0 speaks
            print(f"asyncckpt.bench: error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="[asyncckpt] %(message)s",
        stream=sys.stderr,
    )
    if info.workload is not None:  # a DLIO model layout: --plan, or every rank writes its objects
        return main_workload(args, info, comm)
    if comm.engine != "single" or comm.size > 1:  # mpirun or torchrun: one shard per rank
        try:
            return run_distributed(args, comm, info)
        finally:
            comm.shutdown()
    for note in info.notes:
        print(f"[asyncckpt] {note}", file=sys.stderr)
    try:
        plan = plan_from_args(args)
        if args.embedded_s3 is not None and args.embedded_store is not None:
            raise ConfigError("--embedded-s3 and --embedded-store start one server each; give one of them")
        with contextlib.ExitStack() as stack:
            tmp = temporary_directory(stack, "asyncckpt-bench-")
            if args.embedded_s3 is not None:
                check_client_library(plan.target or "s3://", plan.config.backend)

                default_target = start_for_bench(stack, args.embedded_s3)
                plan = plan if plan.target is not None else plan.with_target(default_target)
            if args.embedded_store is not None:
                plan = start_embedded_store(stack, args, plan)
            if plan.target is None:
                if plan.mode == "load":
                    raise ConfigError("--mode load needs a TARGET saved earlier (e.g. by --mode save --keep)")
                plan = plan.with_target(str(Path(tmp) / "checkpoint.bin"))
            check_backend_serves(plan, args.compare_backends)
            if args.local is not None:
                return run_tiered_cli(args, plan, argv)
            check_local_target(plan)
            if args.compare_backends:
                report = compare_backends(plan, args.loop)
            else:
                report = run_with_loop(args.loop, lambda: run_plan(plan))
    except (ConfigError, MissingDependencyError, TargetNotFoundError, EmulatorUnavailableError) as exc:
        print(f"asyncckpt.bench: error: {exc}", file=sys.stderr)
        return 2
    except AsyncCkptError as exc:
        print(f"asyncckpt.bench: failed: {exc}", file=sys.stderr)
        return 1
    print(report.text)
    doc = stamp(report.to_json(records=needs_records(args)), argv)
    try:
        for line in write_outputs(doc, report.text, args):
            print(f"[asyncckpt] {line}", file=sys.stderr)
    except (ConfigError, MissingDependencyError) as exc:
        print(f"asyncckpt.bench: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"asyncckpt.bench: failed writing results: {exc}", file=sys.stderr)
        return 1
    return 0

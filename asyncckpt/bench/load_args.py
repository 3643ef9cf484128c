"""The load-side options of the benchmark CLI (kept apart so other option groups merge cleanly)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from ..config import CheckpointConfig
from ..errors import ConfigError, StoragePermissionError
from ..modes import BenchMode, VerifyMode, choices
from ..sinks import capabilities
from ..units import parse_size

DROP_CACHES = "/proc/sys/vm/drop_caches"
#: --verify spelling → load(verify=...); the keys are exactly modes.VerifyMode
VERIFY_CHOICES: dict[str, str | bool] = {"checksum": "checksum", "regenerate": "regenerate", "none": False}


def _size(text: str) -> int:
    try:
        return parse_size(text, name="--read-chunk-size")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_load_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "load", "reading checkpoints back (MLPerf Storage: 10 writes, clear caches, 10 reads)"
    )
    g.add_argument("--mode", choices=choices(BenchMode), default="both", help="phases to run (both)")
    g.add_argument("--num-checkpoints-read", type=int, default=1, help="checkpoints to read back (1)")
    g.add_argument(
        "--verify",
        choices=choices(VerifyMode),
        default=None,
        help="check loads (default: checksum; none after --integrity none, whose saves have no checksums)",
    )
    g.add_argument("--num-readers", type=int, default=None, help="reads in flight (backend default)")
    g.add_argument("--read-chunk-size", type=_size, default=None, help="bytes per read (--chunk-size)")
    g.add_argument(
        "--drop-caches", action="store_true", help=f"root: sync and write 3 to {DROP_CACHES} before reading"
    )
    g.add_argument(
        "--allow-cache", action="store_true", help="let loads hit the page cache (no O_DIRECT or eviction)"
    )


def load_plan_from_args(args: argparse.Namespace, config: CheckpointConfig) -> dict[str, Any]:
    """BenchPlan fields for the load phase, validated before any I/O."""
    if args.num_checkpoints_read < 1:
        raise ConfigError(f"--num-checkpoints-read must be >= 1, got {args.num_checkpoints_read}")
    if args.num_readers is not None and not 1 <= args.num_readers <= config.num_buffers:
        raise ConfigError(
            f"--num-readers must be in 1..--num-buffers ({config.num_buffers}), got {args.num_readers}"
        )
    if args.read_chunk_size is not None and (
        args.read_chunk_size % 4096 or args.read_chunk_size > config.chunk_size
    ):
        raise ConfigError(
            f"--read-chunk-size must be a multiple of 4096 and <= --chunk-size, got {args.read_chunk_size}"
        )
    check_readable(args.target, args.mode, config)
    if args.drop_caches and args.mode != "save" and not os.access(DROP_CACHES, os.W_OK):
        raise ConfigError(f"--drop-caches needs permission to write {DROP_CACHES} (run as root)")
    return {
        "mode": args.mode,
        "reads": args.num_checkpoints_read,
        "verify": VERIFY_CHOICES[verify_choice(args.verify, args.mode, config)],
        "num_readers": args.num_readers,
        "read_chunk_size": args.read_chunk_size,
        "drop_caches": args.drop_caches,
        "defeat_cache": not args.allow_cache,
    }


def check_readable(target: str | None, mode: str, config: CheckpointConfig) -> None:
    """A target that keeps nothing (``null://``) has nothing to load: said before the saves ran,
    not as a failed load after them. Storage is asked by capability, not by scheme."""
    if mode != "save" and target is not None and not capabilities(target, config.backend).keeps_data:
        raise ConfigError(
            f"--mode {mode}: {target!r} keeps nothing it is sent, so there is nothing to load; "
            "use --mode save"
        )


def verify_choice(verify: str | None, mode: str, config: CheckpointConfig) -> str:
    """``--verify`` as given, else its default: ``checksum``, or ``none`` when this run's saves
    compute no checksums. Asking checksums of those saves is bad input, said before any I/O."""
    if verify is None:
        return "checksum" if config.checksums else "none"
    if verify == "checksum" and not config.checksums and mode == "both":
        raise ConfigError(
            "--verify checksum cannot check this run's saves: --integrity none computes no checksums; "
            "use --verify regenerate (rebuilds the synthetic data) or --verify none"
        )
    return verify


def drop_caches() -> None:
    """Flush dirty pages, then drop the page cache, dentries and inodes (blocking; root)."""
    os.sync()
    try:
        with open(DROP_CACHES, "w") as f:
            f.write("3\n")
    except OSError as exc:
        raise StoragePermissionError(
            exc.errno, f"--drop-caches: cannot write {DROP_CACHES}: {exc.strerror} (needs root)"
        ) from None

"""Do the library defaults reach the device? asyncckpt's default save and load against fio's best.

fio (Debian's package) is the baseline: sequential O_DIRECT writes and reads of the same size
in blocks of asyncckpt's default chunk size, in the same directory. First a sweep over engines
(libaio, io_uring) and queue depths (1-8) finds fio's best configuration for writing and for
reading; then at least 5 alternating pairs run that best fio job and asyncckpt with *no tuning*
(``AsyncCheckpointer()``: the library's defaults; ``save(path, size)``, ``load(path)``), the
order flipped every round, and each pair gives one ratio asyncckpt / fio. The verdict comes
from ``_common.ratio_verdict`` (target 0.95: "met" only when the whole 95 % bootstrap interval
of the median ratio clears it).

Fair to fio, hence strict for asyncckpt: fio's write job ``fallocate``s outside its timing and
its figure is fio's own bandwidth (``bw_bytes``: the job's I/O phase including ``end_fsync``,
without process start or file layout); asyncckpt's figure is end to end (open with fallocate,
generation with dgen-py, CRC32C per chunk, writes, the sealed manifest, fsync, rename,
directory fsync; a load reads the footer, then the data, verifying CRC32C, its default). Each
side writes a fresh file (deleted outside the timing). fio reads the file asyncckpt saved (its
first ``size`` bytes), so both read the same extents. O_DIRECT keeps the page cache out of
both; ``--drop-caches`` also writes 3 to /proc/sys/vm/drop_caches before every read (root
only; it affects everything else on the machine, so it is off by default).

    python benchmarks/bench_fio.py --size 2GiB --pairs 7 --dir /var/tmp
    python benchmarks/bench_fio.py --size 256MiB --pairs 5 --depths 1,4   # a quick look
    python benchmarks/bench_fio.py --size 2GiB --max-in-flight 1   # how the old default compares

Prints a table, then one JSON document. Exit status 2 when fio is not installed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

from _common import emit, ratio_verdict

from asyncckpt import AsyncCheckpointer
from asyncckpt.config import CheckpointConfig
from asyncckpt.errors import ConfigError
from asyncckpt.modes import ThreadBudgetRule
from asyncckpt.results.records import RunResult
from asyncckpt.sinks import backend_class
from asyncckpt.units import parse_size

INSTALL_HINT = (
    "fio is not installed. Install Debian's package as root:\n"
    "    apt-get update && apt-get install -y fio\n"
    "then run this benchmark again."
)
TARGET = 0.95
DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def fio_binary() -> str | None:
    return shutil.which("fio")


def drop_caches() -> None:
    os.sync()
    DROP_CACHES.write_text("3\n")


def unlink(path: Path) -> None:
    path.unlink(missing_ok=True)


@dataclass(frozen=True)
class Fio:
    """fio jobs of one size and block size: sequential, O_DIRECT, one job."""

    binary: str
    size: int
    block: int
    drop: bool  # drop the page cache before each read

    async def job(self, rw: str, path: Path, engine: str, depth: int) -> float:
        """One fio job; its bandwidth in bytes/s (RuntimeError if fio failed)."""
        args = [
            self.binary,
            "--name=asyncckpt-fio",
            f"--filename={path}",
            f"--rw={rw}",
            f"--bs={self.block}",
            f"--size={self.size}",
            "--direct=1",
            f"--ioengine={engine}",
            f"--iodepth={depth}",
            "--numjobs=1",
            "--output-format=json",
        ]
        args += ["--fallocate=native", "--end_fsync=1"] if rw == "write" else ["--readonly"]
        proc = await asyncio.create_subprocess_exec(
            *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        out, err = await proc.communicate()
        what = f"fio {rw} {engine} depth {depth}"
        if proc.returncode != 0:
            raise RuntimeError(f"{what} failed: {err.decode(errors='replace').strip()}")
        text = out.decode(errors="replace")
        job = json.loads(text[text.index("{") :])["jobs"][0]  # fio may print notes before the JSON
        if job.get("error"):
            raise RuntimeError(f"{what}: error {job['error']}")
        if job[rw]["io_bytes"] != self.size:
            raise RuntimeError(f"{what} moved {job[rw]['io_bytes']} bytes, not {self.size}")
        return float(job[rw]["bw_bytes"])

    async def write(self, path: Path, engine: str, depth: int) -> float:
        unlink(path)  # a fresh file, as a save writes one
        try:
            return await self.job("write", path, engine, depth)
        finally:
            unlink(path)

    async def read(self, path: Path, engine: str, depth: int) -> float:
        if self.drop:
            drop_caches()
        return await self.job("read", path, engine, depth)


async def sweep(
    fio: Fio, args: argparse.Namespace, directory: Path, read_file: Path, rows: list[dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """fio over every engine and depth, for writes and reads; the best (median GB/s) of each."""
    best: dict[str, dict[str, Any]] = {}
    for rw in ("write", "read"):
        for engine in args.engines:
            for depth in args.depths:
                row: dict[str, Any] = {"phase": "sweep", "op": rw, "config": f"{engine} depth {depth}"}
                rows.append(row)
                rates: list[float] = []
                try:
                    for _ in range(args.sweep_reps):
                        if rw == "write":
                            rates.append(await fio.write(directory / "fio.bin", engine, depth))
                        else:
                            rates.append(await fio.read(read_file, engine, depth))
                except RuntimeError as exc:  # e.g. io_uring disabled by the kernel or a sandbox
                    print(f"skipped: {exc}", file=sys.stderr)
                    row["note"] = "failed"
                    continue
                row["fio_GBps"] = gbps = statistics.median(rates) / 1e9
                if rw not in best or gbps > best[rw]["GBps"]:
                    best[rw] = {"engine": engine, "depth": depth, "GBps": gbps}
    return best


def pair_row(
    i: int, op: str, fio_cfg: dict[str, Any], fio_first: bool, fio_bps: float, ours: RunResult
) -> dict[str, Any]:
    order = "first" if fio_first else "second"
    rate = ours.throughput_bps
    return {
        "phase": f"pair {i + 1}",
        "op": op,
        "config": f"fio {fio_cfg['engine']} depth {fio_cfg['depth']} {order}",
        "fio_GBps": fio_bps / 1e9,
        "asyncckpt_GBps": rate / 1e9,
        "ratio": rate / fio_bps,
        # what held asyncckpt back, from its own per-chunk records (Generation means the CPU)
        "note": f"bottleneck {ours.bottleneck}, I/O {ours.io_bps / 1e9:.2f} GB/s",
    }


async def run(args: argparse.Namespace, binary: str, directory: Path) -> dict[str, Any]:
    # the defaults under test (what AsyncCheckpointer() uses), or one override to compare with
    tuning: dict[str, Any] = {} if args.max_in_flight is None else {"max_in_flight": args.max_in_flight}
    if args.thread_budget is not None:
        tuning["thread_budget"] = args.thread_budget
    config = CheckpointConfig(**tuning)
    fio = Fio(binary, args.size, config.chunk_size, args.drop_caches)
    file_sink = backend_class("file")
    ckpt_path = directory / "asyncckpt.ckpt"
    rows: list[dict[str, Any]] = []
    saves: list[RunResult] = []
    loads: list[RunResult] = []
    fio_w: list[float] = []
    fio_r: list[float] = []
    facts: dict[str, Any] = {}
    async with AsyncCheckpointer(**tuning) as ckpt:  # without --max-in-flight: no tuning at all
        # warm-up (not timed): faults the pool in, and leaves a file for the read sweep
        first = await ckpt.save(ckpt_path, args.size)
        facts["writes_in_flight"] = first.metadata.max_in_flight
        facts["direct_io"] = first.metadata.direct_io_reason
        best = await sweep(fio, args, directory, ckpt_path, rows)
        if "write" not in best or "read" not in best:
            raise RuntimeError("no fio configuration ran; see the messages above")
        bw, br = best["write"], best["read"]

        async def fio_save() -> None:
            fio_w.append(await fio.write(directory / "fio.bin", bw["engine"], bw["depth"]))

        async def ckpt_save() -> None:
            unlink(ckpt_path)
            saves.append(await ckpt.save(ckpt_path, args.size))

        async def fio_load() -> None:
            fio_r.append(await fio.read(ckpt_path, br["engine"], br["depth"]))

        async def ckpt_load() -> None:
            if args.drop_caches:
                drop_caches()
            result = await ckpt.load(ckpt_path)  # default verification (CRC32C), default readers
            loads.append(result)
            facts["reads_in_flight"] = result.metadata.max_in_flight
            facts["read_direct_io"] = result.metadata.direct_io_reason

        for i in range(args.pairs):
            fio_first = i % 2 == 0  # the order flips every round: drift favours neither side
            for step in (fio_save, ckpt_save) if fio_first else (ckpt_save, fio_save):
                await step()
            for step in (fio_load, ckpt_load) if fio_first else (ckpt_load, fio_load):
                await step()
            rows.append(pair_row(i, "save", bw, fio_first, fio_w[-1], saves[-1]))
            rows.append(pair_row(i, "load", br, fio_first, fio_r[-1], loads[-1]))
    unlink(ckpt_path)
    save_verdict = ratio_verdict([a.throughput_bps / f for a, f in zip(saves, fio_w, strict=True)], TARGET)
    load_verdict = ratio_verdict([a.throughput_bps / f for a, f in zip(loads, fio_r, strict=True)], TARGET)
    for op, verdict in (("save", save_verdict), ("load", load_verdict)):
        low, high = verdict["ci95"]
        note = f"{verdict['verdict']} (target {verdict['target']})"
        rows.append(
            {
                "phase": "verdict",
                "op": op,
                "config": f"median of {verdict['pairs']}, 95 % CI {low:.3f}-{high:.3f}",
                "ratio": verdict["median_ratio"],
                "note": note + (f", TUNED {tuning}, not the defaults" if tuning else ""),
            }
        )
    return {
        "rows": rows,
        "extra": {
            "directory": str(directory),
            "size_bytes": args.size,
            "block_bytes": config.chunk_size,
            "asyncckpt": {
                "tuning": tuning or "none: library defaults",
                "chunk_size": config.chunk_size,
                "num_buffers": config.num_buffers,
                "pool_bytes": config.pool_bytes,
                "file_default_in_flight": file_sink.default_in_flight,
                **facts,
            },
            "fio_best": best,
            "fio_bandwidth": "fio's bw_bytes: its I/O phase incl. end_fsync, no start-up or layout",
            "asyncckpt_throughput": "size / wall, open (fallocate) to published (fsync, rename, dir fsync)",
            "drop_caches": bool(args.drop_caches),
            "save": save_verdict,
            "load": load_verdict,
        },
    }


def _ints(text: str) -> list[int]:
    out = sorted({int(x) for x in text.split(",") if x.strip()})
    if not out or out[0] < 1:
        raise argparse.ArgumentTypeError(f"depths must be positive integers, got {text!r}")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=lambda s: parse_size(s, name="--size"), default="2GiB")
    p.add_argument("--dir", default=None, help="directory on the file system to measure (default: $TMPDIR)")
    p.add_argument("--pairs", type=int, default=7, help="alternating pairs (at least 5)")
    p.add_argument(
        "--thread-budget",
        choices=get_args(ThreadBudgetRule),
        default=None,
        help="asyncckpt's thread-budget rule instead of the library default (a tuned comparison)",
    )
    p.add_argument("--engines", type=lambda s: [e for e in s.split(",") if e], default="libaio,io_uring")
    p.add_argument("--depths", type=_ints, default="1,2,3,4,5,6,7,8", help="queue depths to sweep")
    p.add_argument("--sweep-reps", type=int, default=3, help="fio runs per sweep configuration (median)")
    p.add_argument(
        "--max-in-flight",
        type=int,
        default=None,
        help="run asyncckpt with this many writes/reads in flight instead of its defaults (to compare)",
    )
    p.add_argument(
        "--drop-caches",
        action="store_true",
        help="also write 3 to /proc/sys/vm/drop_caches before each read (root; machine-wide)",
    )
    args = p.parse_args()
    fio = fio_binary()
    if fio is None:
        print(INSTALL_HINT, file=sys.stderr)
        return 2
    if args.pairs < 5:
        p.error("--pairs must be at least 5 (a verdict needs 5 alternating pairs)")
    if args.sweep_reps < 1:
        p.error("--sweep-reps must be at least 1")
    if args.max_in_flight is not None:
        try:
            CheckpointConfig(max_in_flight=args.max_in_flight)
        except ConfigError as exc:
            p.error(f"--max-in-flight: {exc}")
    if args.drop_caches and not os.access(DROP_CACHES, os.W_OK):
        p.error(f"--drop-caches: {DROP_CACHES} is not writable (root only)")
    with tempfile.TemporaryDirectory(prefix="asyncckpt-fio-", dir=args.dir) as tmp:
        out = asyncio.run(run(args, fio, Path(tmp)))
    emit(
        "fio",
        out["rows"],
        ["phase", "op", "config", "fio_GBps", "asyncckpt_GBps", "ratio", "note"],
        out["extra"],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

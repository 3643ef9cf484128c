"""What read size and reads in flight cost a load: one file loaded with several of each.

A resharded load reads each destination box on its own (4 MiB reads for 16 MiB tensors split
four ways), where a same-world load reads 32 MiB at a time; both keep four reads in flight by
default. This bench prices that shape alone, on a whole object: one ``--size`` file, saved
once, loaded (verified, the default) by one checkpointer per arm, arms rotating round by round;
each arm's GB/s and its ratio to the library's default (32 MiB × 4) in the same round. Every
arm's reads pass through the same pipeline (a thread hop to verify each read, in order), so a
difference is the reads' size and number in flight, the device's and the pipeline's share
together. The device's block-queue limits are printed with the figures.

Each arm gets ``in flight`` + 8 buffers of its read size (so the executor, sized by the
buffers, has a thread for every read in flight).

    python benchmarks/bench_read_shape.py [--size 2GiB] [--pairs 5] [--dir /var/tmp]
                                          [--arms 32MiB:4,4MiB:4,4MiB:16,4MiB:32]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import directory, emit, positive_int, rate_stats, rotation

from asyncckpt import AsyncCheckpointer, parse_size


def device_queue(path: str) -> dict[str, str]:
    """The block queue limits of the device under ``path`` (empty when not found)."""
    dev = os.stat(path).st_dev
    block = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    queue = block / "queue" if (block / "queue").exists() else block.resolve().parent / "queue"
    out = {}
    for name in ("max_sectors_kb", "max_segments", "nr_requests"):
        try:
            out[name] = (queue / name).read_text().strip()
        except OSError:
            continue
    return out


def parse_arms(text: str) -> list[tuple[int, int]]:
    arms = []
    for item in text.split(","):
        size, _, depth = item.partition(":")
        try:
            arms.append((parse_size(size, name="--arms"), positive_int(depth)))
        except (ValueError, argparse.ArgumentTypeError) as exc:
            raise argparse.ArgumentTypeError(f"--arms item {item!r}: SIZE:IN_FLIGHT ({exc})") from None
    if arms[0] != (32 << 20, 4):
        raise argparse.ArgumentTypeError("--arms must start with the default, 32MiB:4 (the ratios' base)")
    return arms


async def run(args: argparse.Namespace) -> tuple[dict[str, list[float]], dict[str, str]]:
    """Each arm's GB/s per round, and the device's queue limits."""
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = str(Path(tmp) / "read-shape.bin")
        async with AsyncCheckpointer() as ckpt:
            await ckpt.save(path, args.size)
        names = [f"{size >> 20} MiB × {depth}" for size, depth in args.arms]
        ckpts = [
            AsyncCheckpointer(chunk_size=size, num_buffers=depth + 8, max_in_flight=depth)
            for size, depth in args.arms
        ]
        rates: dict[str, list[float]] = {name: [] for name in names}
        try:
            for c in ckpts:
                await c.__aenter__()
            for i in range(args.pairs):
                for k in rotation(len(names), i):
                    t0 = time.perf_counter()
                    await ckpts[k].load(path)
                    rates[names[k]].append(args.size / (time.perf_counter() - t0) / 1e9)
        finally:
            for c in ckpts:
                await c.__aexit__(None, None, None)
        return rates, device_queue(tmp)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=lambda s: parse_size(s, name="--size"), default=parse_size("2GiB"))
    p.add_argument("--pairs", type=int, default=5, help="rounds; each loads once per arm")
    p.add_argument("--dir", type=directory, default=tempfile.gettempdir())
    p.add_argument("--arms", type=parse_arms, default=parse_arms("32MiB:4,4MiB:4,4MiB:16,4MiB:32"))
    args = p.parse_args()
    rates, queue = asyncio.run(run(args))
    base = next(iter(rates.values()))
    ratio = "÷ 32 MiB × 4 (per round, median)"
    rows: list[dict[str, Any]] = [{"reads": name, **rate_stats(r, base, ratio)} for name, r in rates.items()]
    emit(
        "read_shape",
        rows,
        ["reads", "GB/s median", "GB/s min", "GB/s max", ratio],
        {"size": args.size, "device_queue": queue, "rates": rates},
    )


if __name__ == "__main__":
    main()

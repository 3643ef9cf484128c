"""What the load's default CRC32C check costs: one object loaded verified and unverified.

fio reads without checking anything; asyncckpt's load checks each chunk's CRC32C by default.
One file of ``--size`` bytes, loaded ``--pairs`` times each way by one checkpointer with its
defaults, the order alternating pair by pair; throughput per load, medians, and per pair
unverified ÷ verified.

    python benchmarks/bench_verify_cost.py [--size 2GiB] [--pairs 6] [--dir /var/tmp]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import emit, median

from asyncckpt import AsyncCheckpointer, parse_size


async def run(args: argparse.Namespace) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = str(Path(tmp) / "verify-cost.bin")
        rates: dict[str, list[float]] = {"verified": [], "unverified": []}
        async with AsyncCheckpointer() as ckpt:
            await ckpt.save(path, args.size)
            for i in range(args.pairs):
                order = ("verified", "unverified") if i % 2 == 0 else ("unverified", "verified")
                for arm in order:
                    t0 = time.perf_counter()
                    await ckpt.load(path, verify=arm == "verified")
                    rates[arm].append(args.size / (time.perf_counter() - t0) / 1e9)
        return rates


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=parse_size, default=parse_size("2GiB"))
    p.add_argument("--pairs", type=int, default=6)
    p.add_argument("--dir", default=tempfile.gettempdir())
    args = p.parse_args()
    rates = asyncio.run(run(args))
    ratios = [u / v for u, v in zip(rates["unverified"], rates["verified"], strict=True)]
    rows: list[dict[str, Any]] = [
        {"load": arm, "GB/s median": median(r), "GB/s min": min(r), "GB/s max": max(r)}
        for arm, r in rates.items()
    ]
    emit(
        "verify_cost",
        rows,
        ["load", "GB/s median", "GB/s min", "GB/s max"],
        {
            "size": args.size,
            "rates": rates,
            "unverified_over_verified": ratios,
            "median_ratio": median(ratios),
        },
    )


if __name__ == "__main__":
    main()

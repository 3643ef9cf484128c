"""Event-loop lag during a full-speed save vs the same loop idle, on asyncio and uvloop.

A training loop sharing the event loop feels this lag. Target: p99 <= 2 ms during a save.

    python benchmarks/bench_loop_lag.py --size 4GiB [--dir /path] [--target file|null]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from _common import emit

from asyncckpt import AsyncCheckpointer, parse_size
from asyncckpt.monitor import LoopMonitor


async def measure(uri: str, size: int, chunk: int, idle_s: float, threads: int | None) -> dict[str, Any]:
    async with LoopMonitor(0.001) as idle:
        await asyncio.sleep(idle_s)
    async with AsyncCheckpointer(
        chunk_size=chunk, num_buffers=8, monitor_interval=0.001, gen_threads=threads
    ) as ckpt:
        await ckpt.save(uri, chunk)  # warm-up
        result = await ckpt.save(uri, size)
        await ckpt.delete(uri)
    i, s = idle.lag(), result.loop_lag_s
    return {
        "idle_p50_ms": i.p50 * 1e3,
        "idle_p99_ms": i.p99 * 1e3,
        "idle_max_ms": i.max * 1e3,
        "save_p50_ms": s.p50 * 1e3,
        "save_p99_ms": s.p99 * 1e3,
        "save_max_ms": s.max * 1e3,
        "GBps": result.throughput_bps / 1e9,
    }


def run(loop: str, factory: Callable[[], Coroutine[Any, Any, dict[str, Any]]]) -> dict[str, Any]:
    if loop == "uvloop":
        import uvloop

        return uvloop.run(factory())
    return asyncio.run(factory())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="4GiB")
    p.add_argument("--chunk-size", default="32MiB")
    p.add_argument("--target", choices=("file", "null"), default="file")
    p.add_argument("--dir", default=None)
    p.add_argument("--gen-threads", type=int, default=None, help="override the generator's threads")
    args = p.parse_args()
    size, chunk = parse_size(args.size), parse_size(args.chunk_size)
    rows = []
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="asyncckpt-lag-") as tmp:
        uri = str(Path(tmp) / "ckpt.bin") if args.target == "file" else "null://lag"
        for loop in ("asyncio", "uvloop"):
            row = run(loop, lambda: measure(uri, size, chunk, 1.0, args.gen_threads))
            rows.append({"loop": loop, **row, "target_p99_le_2ms": row["save_p99_ms"] <= 2.0})
    emit(
        "loop_lag",
        rows,
        ("loop", "idle_p99_ms", "save_p50_ms", "save_p99_ms", "save_max_ms", "GBps", "target_p99_le_2ms"),
        {"size_bytes": size, "target": args.target},
    )


if __name__ == "__main__":
    main()

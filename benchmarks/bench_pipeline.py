"""Pipeline efficiency: streaming save vs the I/O-only ceiling, measured in the same run.

The ceiling writes the same bytes through the same sink from buffers filled before timing
(no generation, no queue). efficiency = streaming throughput / ceiling throughput; the
target is >= 0.97. Runs alternate (ceiling, streaming, ...) so drift hits both alike.

    python benchmarks/bench_pipeline.py --size 4GiB --reps 5 [--dir /path/on/device]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from _common import directory, emit, median

from asyncckpt import AsyncCheckpointer, parse_size
from asyncckpt.sinks import SinkOptions, make_sink


async def io_ceiling(ckpt: AsyncCheckpointer, uri: str, size: int) -> float:
    """Write ``size`` bytes from pre-filled pool buffers straight through the sink, with as
    many writes in flight as the streaming save uses (the backend's default unless set)."""
    pool = await ckpt.runtime.pool()
    executor = ckpt.runtime.executor()
    cfg = ckpt.config
    sink = make_sink(uri, backend=None, executor=executor, options=SinkOptions(direct_io=cfg.direct_io))
    in_flight = cfg.max_in_flight or min(sink.default_in_flight, cfg.num_buffers)
    buffers = pool.buffers
    parts = iter(enumerate(range(0, size, cfg.chunk_size)))

    async def writer() -> None:
        for i, offset in parts:
            n = min(cfg.chunk_size, size - offset)
            await sink.write_part(offset, buffers[i % len(buffers)].view[:n])

    t0 = time.perf_counter()
    await sink.open(size)
    await asyncio.gather(*(writer() for _ in range(in_flight)))
    await sink.complete()
    elapsed = time.perf_counter() - t0
    await sink.aclose()
    return size / elapsed


async def main(args: argparse.Namespace) -> None:
    size = parse_size(args.size)
    rows = []
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="asyncckpt-bench-") as tmp:
        uri = str(Path(tmp) / "ckpt.bin")
        async with AsyncCheckpointer(
            chunk_size=parse_size(args.chunk_size), num_buffers=args.num_buffers
        ) as c:
            await c.save(uri, c.config.chunk_size)  # warm-up: pool, generator pool, file system
            ceilings, streams = [], []
            for rep in range(args.reps):
                ceilings.append(await io_ceiling(c, uri, size))
                result = await c.save(uri, size)
                streams.append(result.throughput_bps)
                rows.append(
                    {
                        "rep": rep + 1,
                        "ceiling_GBps": ceilings[-1] / 1e9,
                        "streaming_GBps": streams[-1] / 1e9,
                        "efficiency": streams[-1] / ceilings[-1],
                        "gen_GBps": result.gen_bps / 1e9,
                        "bottleneck": result.bottleneck,
                        "direct_io": result.metadata.direct_io,
                        "gen_threads": result.metadata.gen_threads,
                    }
                )
    summary = {
        "rep": "median",
        "ceiling_GBps": median(ceilings) / 1e9,
        "streaming_GBps": median(streams) / 1e9,
        "efficiency": median(streams) / median(ceilings),
    }
    rows.append(summary)
    emit(
        "pipeline_efficiency",
        rows,
        (
            "rep",
            "ceiling_GBps",
            "streaming_GBps",
            "efficiency",
            "gen_GBps",
            "bottleneck",
            "direct_io",
            "gen_threads",
        ),
        {"size_bytes": size, "target": ">= 0.97", "efficiency_median": summary["efficiency"]},
    )


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="4GiB")
    p.add_argument("--chunk-size", default="32MiB")
    p.add_argument("--num-buffers", type=int, default=8)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--dir", type=directory, default=None, help="directory on the device under test")
    asyncio.run(main(p.parse_args()))

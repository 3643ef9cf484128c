"""Generation speed: dgen-py vs NumPy vs the memcpy ceiling, into one reused, pre-touched buffer.

python benchmarks/bench_generation.py --size 8GiB --chunk-size 32MiB
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import time

from _common import emit

from asyncckpt import parse_size
from asyncckpt.node.topology import thread_budget
from asyncckpt.pool import buffer_address
from asyncckpt.sources import DgenSource, NumpySource, pool_threads


def rate(size: int, chunk: int, fill: object) -> float:
    buf = mmap.mmap(-1, chunk)
    view = memoryview(buf)
    ctypes.memset(buffer_address(view), 1, chunk)  # pre-touch: page faults are not generation
    t0 = time.perf_counter()
    for offset in range(0, size, chunk):
        fill(view[: min(chunk, size - offset)])  # type: ignore[operator]
    elapsed = time.perf_counter() - t0
    view.release()
    buf.close()
    return size / elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="8GiB")
    p.add_argument("--numpy-size", default="1GiB", help="NumPy is slow; a smaller size is enough")
    p.add_argument("--chunk-size", default="32MiB")
    args = p.parse_args()
    size, chunk, nsize = parse_size(args.size), parse_size(args.chunk_size), parse_size(args.numpy_size)
    budget = thread_budget()
    dgen = DgenSource(size, seed=1, threads=budget.threads)
    npy = NumpySource(nsize, seed=1)
    src = mmap.mmap(-1, chunk)
    src_view = memoryview(src)
    ctypes.memset(buffer_address(src_view), 7, chunk)

    def memcpy(view: memoryview) -> None:
        ctypes.memmove(buffer_address(view), buffer_address(src_view), len(view))

    rows = [
        {"generator": "memcpy (ceiling)", "GBps": rate(size, chunk, memcpy) / 1e9, "threads": 1},
        {
            "generator": "dgen-py",
            "GBps": rate(size, chunk, dgen.fill_sync) / 1e9,
            "threads": pool_threads()[0],
        },
        {"generator": "numpy default_rng", "GBps": rate(nsize, chunk, npy.fill_sync) / 1e9, "threads": 1},
    ]
    for row in rows:
        row["vs_memcpy"] = row["GBps"] / rows[0]["GBps"]
    emit(
        "generation",
        rows,
        ("generator", "GBps", "threads", "vs_memcpy"),
        {"size_bytes": size, "chunk_size": chunk, "usable_cpus": budget.usable_cpus},
    )


if __name__ == "__main__":
    main()

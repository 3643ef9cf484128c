"""Peak memory: streaming vs preallocate (the method streaming replaces) at several sizes.

Each run is a fresh process: peak RSS (VmHWM) minus the idle RSS after imports. Streaming must
stay flat at <= pool + 64 MiB whatever the size; preallocate grows with the checkpoint.

    python benchmarks/bench_memory.py --sizes 1GiB,4GiB,16GiB [--dir /path] [--target file|null]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import directory, emit

from asyncckpt import parse_size


def status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


async def child(method: str, size: int, uri: str, chunk: int, buffers: int) -> None:
    from asyncckpt import AsyncCheckpointer

    idle = status_bytes("VmRSS")
    async with AsyncCheckpointer(chunk_size=chunk, num_buffers=buffers) as ckpt:
        result = await ckpt.save(uri, size, method=method)
        await ckpt.delete(uri)
    print(
        json.dumps(
            {
                "idle_rss": idle,
                "peak_rss": status_bytes("VmHWM"),
                "throughput_bps": result.throughput_bps,
                "pool_bytes": chunk * buffers,
            }
        )
    )


def run_one(method: str, size: int, uri: str, chunk: int, buffers: int) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--child", method, str(size), uri, str(chunk), str(buffers)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    data: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return data


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="1GiB,4GiB,16GiB")
    p.add_argument("--chunk-size", default="32MiB")
    p.add_argument("--num-buffers", type=int, default=8)
    p.add_argument("--target", choices=("file", "null"), default="file")
    p.add_argument("--dir", type=directory, default=None)
    p.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        method, size, uri, chunk, buffers = args.child
        asyncio.run(child(method, int(size), uri, int(chunk), int(buffers)))
        return
    chunk = parse_size(args.chunk_size)
    rows = []
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="asyncckpt-mem-") as tmp:
        uri = str(Path(tmp) / "ckpt.bin") if args.target == "file" else "null://mem"
        for text in args.sizes.split(","):
            size = parse_size(text)
            for method in ("streaming", "preallocate"):
                d = run_one(method, size, uri, chunk, args.num_buffers)
                over = d["peak_rss"] - d["idle_rss"]
                rows.append(
                    {
                        "size": text,
                        "method": method,
                        "peak_over_idle_MiB": over / 2**20,
                        "pool_MiB": d["pool_bytes"] / 2**20 if method == "streaming" else None,
                        "within_pool_plus_64MiB": over <= d["pool_bytes"] + 64 * 2**20
                        if method == "streaming"
                        else None,
                        "GBps": d["throughput_bps"] / 1e9,
                    }
                )
    emit(
        "memory",
        rows,
        ("size", "method", "peak_over_idle_MiB", "pool_MiB", "within_pool_plus_64MiB", "GBps"),
        {"target": args.target},
    )


if __name__ == "__main__":
    main()

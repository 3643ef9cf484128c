"""Multi-endpoint aiobotocore saves vs one endpoint, against S3 discard servers (no storage).

Baseline in the same run: the single-endpoint path (no router). Then the same save spread
over N discard servers with ``round_robin`` and ``least_connections``. Configurations are
interleaved over ``--repeat`` rounds and the median is reported, so drift on a shared machine
hits all alike. Each discard server is its own process: on a machine with few cores they
compete with the client for CPU, so N servers measure routing overhead and spread, not
N-fold bandwidth.

    python benchmarks/bench_endpoints.py --size 256MiB --part-size 32MiB --endpoints 3 --repeat 3
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

from _common import emit, median

from asyncckpt import AsyncCheckpointer
from asyncckpt.units import parse_size

SEED = 7


async def save(a: argparse.Namespace, options: dict[str, Any]) -> dict[str, Any]:
    base = {"region": "us-east-1", "dotenv": False, "access_key_id": "bench", "secret_access_key": "bench-s"}
    async with AsyncCheckpointer(
        chunk_size=a.part_size,
        num_buffers=a.max_in_flight + 2,
        max_in_flight=a.max_in_flight,
        backend="aiobotocore",
        backend_options={**base, **options},
        seed=SEED,
    ) as ckpt:
        await ckpt.save("s3://bench/warmup", a.part_size * 2)  # pool touch, clients, connections
        r = await ckpt.save("s3://bench/ckpt", a.size)
    x = r.metadata.extra
    spread = "/".join(str(e["parts"]) for e in x.get("endpoints", [])) or "-"
    return {"wall_s": r.wall_s, "io_s": r.io_s, "spread": spread, "bottleneck": r.bottleneck}


def start_servers(n: int) -> tuple[list[subprocess.Popen[str]], list[str]]:
    script = Path(__file__).with_name("s3_discard_server.py")
    procs, urls = [], []
    for _ in range(n):
        proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        procs.append(proc)
        urls.append(proc.stdout.readline().split()[1])
    return procs, urls


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="256MiB")
    p.add_argument("--part-size", default="32MiB")
    p.add_argument("--max-in-flight", type=int, default=4)
    p.add_argument("--endpoints", type=int, default=3, help="discard servers to start (>= 2)")
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()
    a.size, a.part_size = parse_size(a.size, name="--size"), parse_size(a.part_size, name="--part-size")
    if a.endpoints < 2:
        p.error(f"--endpoints must be >= 2, got {a.endpoints}")
    procs, urls = start_servers(a.endpoints)
    configs: dict[str, dict[str, Any]] = {
        "single endpoint (baseline)": {"endpoint_url": urls[0]},
        f"round_robin x{a.endpoints}": {"endpoints": urls, "lb_strategy": "round_robin"},
        f"least_connections x{a.endpoints}": {"endpoints": urls, "lb_strategy": "least_connections"},
    }
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in configs}
    try:
        for _ in range(a.repeat):
            for name, options in configs.items():
                runs[name].append(asyncio.run(save(a, options)))
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait()
    base = median([r["wall_s"] for r in runs["single endpoint (baseline)"]])
    rows = []
    for name, rs in runs.items():
        wall = median([r["wall_s"] for r in rs])
        rows.append(
            {
                "config": name,
                "GB/s": a.size / wall / 1e9,
                "wall_s": wall,
                "vs_baseline": base / wall,
                "parts per endpoint": rs[-1]["spread"],
                "bottleneck": rs[-1]["bottleneck"],
                "walls_s": [r["wall_s"] for r in rs],
            }
        )
    headers = ("config", "GB/s", "wall_s", "vs_baseline", "parts per endpoint", "bottleneck")
    extra = {"size": a.size, "part_size": a.part_size, "max_in_flight": a.max_in_flight, "repeat": a.repeat}
    emit("endpoints", rows, headers, extra)


if __name__ == "__main__":
    main()

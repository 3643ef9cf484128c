"""An isolated ``load_state`` against ``load()`` of the same bytes through the same writer process.

Issue 24's defect: an isolated ``load_state`` (s3dlio's and obstore's default) never attached
the shared arena, so every read crossed the pipe in small messages (0.04x of ``load()``). This
saves a state of ``--size`` bytes (float32 tensors of ``--tensor`` bytes) with ``save_state``
and a raw object of the same size with ``save``, then loads both, alternating which goes first,
``--pairs`` times, through one checkpointer (one writer process). Target: the state load's
throughput >= 0.9 x the raw load's, judged on the median ratio and its 95 % bootstrap interval.

    python benchmarks/bench_state_load.py                          # embedded moto, s3dlio
    python benchmarks/bench_state_load.py --server swift --size 1GiB
    python benchmarks/bench_state_load.py --target /nvme/tmp --isolation process
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
from typing import Any

import numpy as np
from _common import emit, median, ratio_verdict

from asyncckpt import AsyncCheckpointer, parse_size
from asyncckpt.servers.embedded import start_for_bench

TARGET = 0.9


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="256MiB", help="bytes of each object (default 256MiB: moto is slow)")
    p.add_argument("--tensor", default="16MiB", help="bytes per tensor of the state (default 16MiB)")
    p.add_argument(
        "--pairs", type=int, default=5, help="alternating pairs (default 5, the verdict's minimum)"
    )
    p.add_argument("--target", default=None, help="a directory or s3://bucket/prefix (default: --server's)")
    p.add_argument("--server", default="moto", choices=("moto", "swift"), help="embedded S3 server")
    p.add_argument("--backend", default=None, help="default: the URI's (s3dlio when installed)")
    p.add_argument("--isolation", default="auto", help="auto (s3dlio: a writer process), process, none")
    p.add_argument("--chunk-size", default="32MiB")
    return p.parse_args(argv)


def make_state(size: int, tensor: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    n, per = max(1, size // tensor), tensor // 4
    return {f"layer{i}": rng.standard_normal(per, dtype=np.float32) for i in range(n)}


async def run(args: argparse.Namespace, base: str) -> dict[str, Any]:
    size, tensor = parse_size(args.size), parse_size(args.tensor, name="tensor")
    state = make_state(size, tensor)
    nbytes = sum(a.nbytes for a in state.values())
    options: dict[str, Any] = {"isolation": args.isolation, "chunk_size": parse_size(args.chunk_size)}
    if args.backend:
        options["backend"] = args.backend
    rows: list[dict[str, Any]] = []
    async with AsyncCheckpointer(**options) as ckpt:
        state_uri, raw_uri = f"{base}/state.safetensors", f"{base}/raw.bin"
        await ckpt.save_state(state_uri, state)
        await ckpt.save(raw_uri, nbytes)
        await ckpt.load(raw_uri)  # warm-up: the writer process, the pool
        for pair in range(args.pairs):
            order = ("state", "raw") if pair % 2 == 0 else ("raw", "state")
            got: dict[str, Any] = {}
            for kind in order:
                if kind == "state":
                    r = await ckpt.load_state(state_uri)
                    got[kind] = r.load
                else:
                    got[kind] = await ckpt.load(raw_uri)
            extra = got["state"].metadata.extra
            rows.append(
                {
                    "pair": pair + 1,
                    "state_gbps": got["state"].throughput_bps / 1e9,
                    "raw_gbps": got["raw"].throughput_bps / 1e9,
                    "ratio": got["state"].throughput_bps / got["raw"].throughput_bps,
                    "isolation": extra.get("isolation"),
                    "reads_arena": extra.get("reads_arena", 0),
                    "reads_inline": extra.get("reads_inline", 0),
                }
            )
        for uri in (state_uri, raw_uri):
            await ckpt.delete(uri)
    ratios = [r["ratio"] for r in rows]
    return {
        "rows": rows,
        "bytes": nbytes,
        "state_gbps_median": median([r["state_gbps"] for r in rows]),
        "raw_gbps_median": median([r["raw_gbps"] for r in rows]),
        "verdict": ratio_verdict(ratios, TARGET) if len(ratios) >= 5 else None,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with contextlib.ExitStack() as stack:
        if args.target is None:
            base = start_for_bench(stack, args.server).rsplit("/", 1)[0] + "/bench-state-load"
        elif "://" in args.target:
            base = args.target.rstrip("/")
        else:
            base = stack.enter_context(tempfile.TemporaryDirectory(dir=args.target))
        out = asyncio.run(run(args, base))
    rows = out.pop("rows")
    headers = ["pair", "state_gbps", "raw_gbps", "ratio", "isolation", "reads_arena", "reads_inline"]
    emit("bench_state_load", rows, headers, {"target": base, **out})
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Tiered checkpoints (issue 26): the local commit against a plain local save, and the drain
against a direct save of the same state to the same store.

Per pair, through one checkpointer (one staging area, one pool) and one manager of each kind
for the whole run (warmed up by a step 0; the steps of each measurement are removed after it,
untimed):

- ``plain``: a ``CheckpointManager(LOCAL)`` saves the state as a step; the time from
  ``maybe_save`` to the step's commit (``wait()``);
- ``tiered``: a ``CheckpointManager(REMOTE, local=LOCAL)`` saves it; the time from
  ``maybe_save`` to the local commit (``stats.tiers``), then its drain's seconds (measured by
  the drain itself: reading the local file, uploading, verified against the header's CRCs);
- ``direct``: ``save_state(REMOTE/..., staging="none")`` of the same state: what the drain
  is compared with (the same bytes into the same store, from memory).

Order alternates within each pair. Targets: local commit <= 1.05 x plain; drain throughput
>= 0.9 x direct, each judged on the median ratio and its 95 % bootstrap interval.

    python benchmarks/bench_tiers.py                          # remote: an embedded moto
    python benchmarks/bench_tiers.py --server swift --size 1GiB
    python benchmarks/bench_tiers.py --remote /mnt/other-disk --dir /var/tmp
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from _common import directory, emit, median, ratio_verdict

from asyncckpt import AsyncCheckpointer, CheckpointManager, parse_size
from asyncckpt.servers.embedded import start_for_bench
from asyncckpt.steps import delete_step, make_directory, steps_under

LOCAL_TARGET, DRAIN_TARGET = 1.05, 0.9


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="256MiB", help="bytes of the state (default 256MiB: moto is slow)")
    p.add_argument("--tensor", default="16MiB", help="bytes per tensor (default 16MiB)")
    p.add_argument(
        "--pairs", type=int, default=5, help="alternating pairs (default 5, the verdict's minimum)"
    )
    p.add_argument(
        "--dir", type=directory, default=None, help="where the local tier's roots go (default: the temp dir)"
    )
    p.add_argument(
        "--remote",
        type=remote_root,
        default=None,
        help="an existing directory or s3://bucket/prefix (default: --server's)",
    )
    p.add_argument("--server", default="moto", choices=("moto", "swift"), help="embedded S3 server")
    p.add_argument("--chunk-size", default="32MiB")
    p.add_argument(
        "--stall-timeout",
        type=float,
        default=120.0,
        help="seconds without progress before a storage call is given up (120: moto on a busy 2-core VM "
        "left a part unacknowledged for the default 20 s)",
    )
    p.add_argument(
        "--request-timeout",
        type=float,
        default=300.0,
        help="seconds one S3 request may take, part uploads and the completion included (300: moto "
        "assembles a 1 GiB multipart upload in more than the default 10 s, and the drain then failed)",
    )
    return p.parse_args(argv)


def remote_root(value: str) -> str:
    """An argparse type: a URI, or an existing directory (named in the usage error if not)."""
    return value if "://" in value else directory(value)


def make_state(size: int, tensor: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    n, per = max(1, size // tensor), tensor // 4
    return {f"layer{i}": rng.standard_normal(per, dtype=np.float32) for i in range(n)}


async def remove_steps(ckpt: AsyncCheckpointer, *roots: str) -> None:
    for root in roots:
        for step in await steps_under(ckpt, root):
            await delete_step(ckpt, root, step)


async def plain(mgr: CheckpointManager, step: int, state: dict[str, Any]) -> float:
    t0 = time.perf_counter()
    await mgr.maybe_save(step, state)
    await mgr.wait()
    seconds = time.perf_counter() - t0
    await remove_steps(mgr.ckpt, mgr.root)  # untimed
    return seconds


async def tiered(mgr: CheckpointManager, step: int, state: dict[str, Any]) -> dict[str, float]:
    await mgr.maybe_save(step, state)
    await mgr.wait()
    assert mgr.tiers is not None
    facts = mgr.tiers.stats.steps[step]
    if facts.state != "remote-committed" or facts.local_commit_s is None:
        raise RuntimeError(f"the tiered step did not commit remotely: {facts}")
    await remove_steps(mgr.ckpt, mgr.tiers.local, mgr.tiers.remote)  # untimed
    return {
        "local_s": facts.local_commit_s,
        "drain_s": facts.drain_s,
        "remote_s": facts.remote_commit_s or 0.0,
    }


async def direct(ckpt: AsyncCheckpointer, remote: str, state: dict[str, Any]) -> float:
    uri = f"{remote}/direct.safetensors"
    await make_directory(ckpt, remote)  # a directory remote (a no-op on S3)
    t0 = time.perf_counter()
    await ckpt.save_state(uri, state, staging="none")
    seconds = time.perf_counter() - t0
    await ckpt.delete(uri)
    return seconds


async def run(args: argparse.Namespace, remote_base: str, local_base: Path) -> dict[str, Any]:
    state = make_state(parse_size(args.size), parse_size(args.tensor, name="tensor"))
    nbytes = sum(a.nbytes for a in state.values())
    rows: list[dict[str, Any]] = []
    async with contextlib.AsyncExitStack() as stack:
        options: dict[str, Any] = {
            "chunk_size": parse_size(args.chunk_size),
            "stall_timeout": args.stall_timeout,
        }
        if remote_base.startswith("s3://"):
            options["backend_options"] = {"request_timeout": args.request_timeout}
        ckpt = await stack.enter_async_context(AsyncCheckpointer(**options))
        await ckpt.reserve_staging(state)
        for name in ("plain", "tiered"):
            (local_base / name).mkdir()
        # one manager each for the whole run (a tiered one keeps its drains' pool): warmed up by
        # step 0, as a training run is by its first checkpoint
        managers = {
            "plain": CheckpointManager(local_base / "plain", checkpointer=ckpt),
            "tiered": CheckpointManager(remote_base, local=local_base / "tiered", checkpointer=ckpt),
        }
        for mgr in managers.values():
            stack.push_async_callback(mgr.aclose)
            await mgr.start()
        await plain(managers["plain"], 0, state)
        await tiered(managers["tiered"], 0, state)
        await direct(ckpt, f"{remote_base}/warm", state)
        for pair in range(args.pairs):
            got: dict[str, Any] = {}
            step = pair + 1
            for kind in ("plain", "tiered", "direct") if pair % 2 == 0 else ("direct", "tiered", "plain"):
                if kind == "plain":
                    got[kind] = await plain(managers["plain"], step, state)
                elif kind == "tiered":
                    got[kind] = await tiered(managers["tiered"], step, state)
                else:
                    got[kind] = await direct(ckpt, f"{remote_base}/direct-{step}", state)
            t = got["tiered"]
            rows.append(
                {
                    "pair": pair + 1,
                    "plain_local_s": got["plain"],
                    "tiered_local_s": t["local_s"],
                    "local_ratio": t["local_s"] / got["plain"],
                    "drain_gbps": nbytes / t["drain_s"] / 1e9,
                    "direct_gbps": nbytes / got["direct"] / 1e9,
                    "drain_ratio": got["direct"] / t["drain_s"],
                    "remote_durable_s": t["remote_s"],
                }
            )
    return {
        "rows": rows,
        "bytes": nbytes,
        "local_commit": ratio_verdict([r["local_ratio"] for r in rows], LOCAL_TARGET, at_most=True)
        if len(rows) >= 5
        else None,
        "drain_vs_direct": ratio_verdict([r["drain_ratio"] for r in rows], DRAIN_TARGET)
        if len(rows) >= 5
        else None,
        "drain_gbps_median": median([r["drain_gbps"] for r in rows]),
        "direct_gbps_median": median([r["direct_gbps"] for r in rows]),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with contextlib.ExitStack() as stack:
        if args.remote is None:
            remote = start_for_bench(stack, args.server).rsplit("/", 1)[0] + "/bench-tiers"
        elif "://" in args.remote:
            remote = args.remote.rstrip("/")
        else:
            remote = stack.enter_context(tempfile.TemporaryDirectory(dir=args.remote))
        local = Path(stack.enter_context(tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-tiers-")))
        stack.callback(shutil.rmtree, local, True)
        out = asyncio.run(run(args, remote, local))
    rows = out.pop("rows")
    headers = [
        *("pair", "plain_local_s", "tiered_local_s", "local_ratio"),
        *("drain_gbps", "direct_gbps", "drain_ratio", "remote_durable_s"),
    ]
    emit("bench_tiers", rows, headers, {"remote": remote, **out})
    return 0


if __name__ == "__main__":
    sys.exit(main())

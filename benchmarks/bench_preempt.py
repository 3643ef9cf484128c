"""What ``save_on_signal`` costs a training step: ``maybe_save`` on a step it does not save.

With ``save_on_signal`` set and several ranks, every ``maybe_save`` all-gathers the ranks'
signal flags (a second channel of the transport), so a signal that reached one rank makes all
save the same step. This measures that price: per rank, two managers on the same job, one
without ``save_on_signal`` (baseline: the cadence check only) and one with it, each timing
``--calls`` calls of ``maybe_save`` on steps the cadence does not save, alternating which goes
first, ``--pairs`` pairs. Reported (rank 0): the median microseconds per call of each and of
their difference, with the 95 % bootstrap interval of the difference's median.

Run it under the launcher whose transport you use (it re-runs itself under mpirun by default):
``python benchmarks/bench_preempt.py --np 2`` (``--np 1``: a world of one, no collective).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from asyncckpt import CheckpointManager  # noqa: E402
from asyncckpt.node.topology import world  # noqa: E402
from benchmarks._common import bootstrap_ci, emit, median  # noqa: E402


async def per_call_us(mgr: CheckpointManager, calls: int, state: dict[str, Any]) -> float:
    start = time.perf_counter()
    for step in range(1, calls + 1):  # every_n_steps is huge: never due
        await mgr.maybe_save(step, state)
    return (time.perf_counter() - start) / calls * 1e6


async def measure(root: str, calls: int, pairs: int) -> list[tuple[float, float]]:
    state: dict[str, Any] = {"w": b"\0" * 64}
    options: dict[str, Any] = {
        "every_n_steps": 10**12,
        "staging": "none",
        "chunk_size": 1 << 20,
        "num_buffers": 2,
    }
    async with (
        CheckpointManager(f"{root}/plain", **options) as plain,
        CheckpointManager(f"{root}/watched", save_on_signal=signal.SIGUSR1, **options) as watched,
    ):
        await plain.start()
        await watched.start()  # its side channel made, outside the timing
        await per_call_us(plain, 50, state)
        await per_call_us(watched, 50, state)
        out = []
        for pair in range(pairs):  # alternate which goes first
            first, second = (plain, watched) if pair % 2 == 0 else (watched, plain)
            a = await per_call_us(first, calls, state)
            b = await per_call_us(second, calls, state)
            out.append((a, b) if first is plain else (b, a))
        return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--np", type=int, default=2, help="ranks (mpirun -np N); 1: no launcher")
    p.add_argument("--calls", type=int, default=500)
    p.add_argument("--pairs", type=int, default=7)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.np > 1 and not args.child:
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        cmd = ["mpirun", "-np", str(args.np), "--oversubscribe", sys.executable, __file__, "--child"]
        cmd += ["--np", str(args.np), "--calls", str(args.calls), "--pairs", str(args.pairs)]
        sys.exit(subprocess.run(cmd, env=env, check=False).returncode)
    with tempfile.TemporaryDirectory() as tmp:
        root = os.environ.get("BENCH_PREEMPT_ROOT", tmp)  # ranks share it only on one node
        rows = asyncio.run(measure(root, args.calls, args.pairs))
    if world()[0] != 0:
        return
    diffs = [w - p for p, w in rows]
    low, high = bootstrap_ci(diffs)
    table = [{"pair": i + 1, "plain_us": p, "save_on_signal_us": w} for i, (p, w) in enumerate(rows)]
    summary = {
        "ranks": args.np,
        "calls_per_timing": args.calls,
        "plain_us_median": round(median([p for p, _ in rows]), 2),
        "save_on_signal_us_median": round(median([w for _, w in rows]), 2),
        "added_us_median": round(median(diffs), 2),
        "added_us_ci95": [round(low, 2), round(high, 2)],
    }
    emit("preempt_agreement", table, ["pair", "plain_us", "save_on_signal_us"], summary)


if __name__ == "__main__":
    main()

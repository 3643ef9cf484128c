"""Scale-out benchmark: 1 vs 2 MPI ranks, and the generator-thread budget (the seed bug).

1. Rank scaling on a target that is not the bottleneck (``null://``: NullSink discards):
   ``mpirun -np 1`` then ``-np 2``, same per-rank size; the job throughput by the MLPerf rule
   (total bytes ÷ max duration over ranks) of 2 ranks over 1 rank. Target: >= 1.8x. mpirun
   binds each rank to a core by default, so each rank brings one core.
2. Thread budget: ``L`` ranks on this node of a job that is ``W`` ranks in total. The seed
   bug divided the node's CPUs by ``W``; asyncckpt divides by ``L`` (measured by MPI). Both
   are run on a generation-sensitive target (null by default, where every chunk waits on
   generation) under ``mpirun -np L --bind-to none``: once with ``--gen-threads`` forced to
   ``cpus // W`` (the bug) and once with no override (asyncckpt's own budget).

Prints JSON (``--json FILE`` to keep it) and a table. Smoke run:
``python benchmarks/bench_mpi.py --size 256MiB --repeat 2``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from asyncckpt.bench.cli import build_parser  # noqa: E402
from asyncckpt.node.topology import usable_cpus  # noqa: E402
from asyncckpt.results.text import format_table, gbps  # noqa: E402

#: saves only (builds with a load path default to save + load; null:// keeps nothing to read)
SAVE_ONLY = ["--mode", "save"] if "mode" in {a.dest for a in build_parser()._actions} else []


def bench(
    np: int, args: argparse.Namespace, mpi: Sequence[str] = (), extra: Sequence[str] = ()
) -> dict[str, Any]:
    """One ``mpirun -np N [mpi] python -m asyncckpt.bench [extra]``; its rank-0 JSON report."""
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        cmd = ["mpirun", "-np", str(np), "--oversubscribe", *mpi, sys.executable, "-m", "asyncckpt.bench"]
        cmd += [
            *extra,
            args.target,
            "--size",
            args.size,
            "--repeat",
            str(args.repeat),
            "--json",
            str(out),
            "-q",
        ]
        cmd += ["--chunk-size", args.chunk_size, "--no-fsync", *SAVE_ONLY]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
        if proc.returncode != 0:
            raise SystemExit(f"failed: {' '.join(cmd)}\n{proc.stderr}")
        report: dict[str, Any] = json.loads(out.read_text())
    return report


def figures(report: dict[str, Any]) -> dict[str, Any]:
    (phase,) = [p for p in report["phases"] if p["phase"] == "save"]
    s = phase["summary"]
    last = phase["checkpoints"][-1]["per_rank"]
    return {
        "ranks": report["world_size"],
        "total_bytes": s["total_bytes"],
        "throughput_bps_mean": s["throughput_bps_mean"],
        "throughput_bps_stdev": s["throughput_bps_stdev"],
        "min_rank_throughput_bps_mean": s["min_rank_throughput_bps_mean"],
        "duration_s_mean": s["duration_s_mean"],
        "chunks_generation_bound": s["bottleneck_counts"].get("Generation", 0),
        "chunks_io_bound": s["bottleneck_counts"].get("I/O", 0),
        "gen_threads": sorted({r["gen_threads"] for r in last}),
        "local_ranks": sorted({r["local_ranks"] for r in last}),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="1GiB", help="per-rank checkpoint size (1GiB)")
    p.add_argument("--chunk-size", default="32MiB")
    p.add_argument("--repeat", type=int, default=3, help="checkpoints per configuration (3)")
    p.add_argument("--target", default="null://bench", help="shared target (null://bench)")
    p.add_argument("--world-size", type=int, default=4, help="simulated job size W for the budget (4)")
    p.add_argument("--local-size", type=int, default=1, help="ranks on this node L for the budget (1)")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()

    one, two = figures(bench(1, args)), figures(bench(2, args))
    ratio = two["throughput_bps_mean"] / one["throughput_bps_mean"]
    cpus = usable_cpus()
    w, n_local = args.world_size, args.local_size
    bug_threads = max(1, cpus // w)
    unbound = ["--bind-to", "none"]
    buggy = figures(bench(n_local, args, unbound, ["--gen-threads", str(bug_threads)]))
    fixed = figures(bench(n_local, args, unbound))
    result = {
        "scaling": {
            "one_rank": one,
            "two_ranks": two,
            "ratio": ratio,
            "target_ratio": 1.8,
            "met": ratio >= 1.8,
        },
        "thread_budget": {
            "usable_cpus": cpus,
            "world_size_simulated": w,
            "local_size": n_local,
            "world_divisor": {"threads_forced": bug_threads, **buggy},
            "local_divisor": {"threads_expected": max(1, cpus // n_local), **fixed},
        },
        "size_per_rank": args.size,
        "target": args.target,
        "repeat": args.repeat,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    rows = [
        (name, f["ranks"], ",".join(map(str, f["gen_threads"])), gbps(f["throughput_bps_mean"]),
         gbps(f["throughput_bps_stdev"]), gbps(f["min_rank_throughput_bps_mean"]),
         f"{f['chunks_generation_bound']} / {f['chunks_io_bound']}")
        for name, f in (
            ("1 rank", one),
            ("2 ranks", two),
            (f"budget cpus//W={cpus}//{w}", buggy),
            (f"budget cpus//L={cpus}//{n_local}", fixed),
        )
    ]  # fmt: skip
    print()
    print(
        format_table(
            ("run", "ranks", "gen threads", "throughput", "stdev", "min rank", "gen/io-bound chunks"), rows
        )
    )
    print(f"\n2 ranks / 1 rank = {ratio:.2f}x (target >= 1.8x: {'met' if ratio >= 1.8 else 'NOT met'})")


if __name__ == "__main__":
    main()

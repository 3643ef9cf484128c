"""The scaling model's inputs, its projection, and its check against 1 and 2 ranks (issue 12, goal 6).

1. Inputs, measured here: for each backend (``null://``, a file on tmpfs, S3 through
   aiobotocore against ``benchmarks/s3_discard_server.py`` when aiobotocore is installed)
   ``--reps`` default saves of ``--size``: the pipeline's CPU-s/GB (the result's
   ``cpu_s_per_gb``, writer process included) and the per-request latency (p50 of the chunk
   writes' ``write_latency_s``), with the chunk size and writes in flight they were taken at.
2. The model (docs/scaling.md): per node,
   ``T = min(C / c, R · q · s / L, E · B_ep, device, NIC)`` with C cores, R ranks, q writes in
   flight per rank of s bytes taking L seconds each, E endpoints of B_ep bytes/s each. The
   projection tables for C = 8, 16, 64 and E = 1..8, and the cores each backend needs for
   25 and 50 GB/s (``X · c``).
3. The check: ``mpirun -np 1`` and ``-np 2`` (each rank bound to one core, as mpirun does)
   saving ``null://`` (benchmarks/bench_mpi.py's runner), measured job throughput (MLPerf rule)
   against the model's ``min(R / c, R · q · s / L)`` with ``c`` the one-core ``null://`` input;
   error = measured ÷ predicted − 1, target within ±10 %. The VM's memory bandwidth drifts
   from minute to minute, and a prediction from an input taken minutes earlier inherited that
   drift (errors −16 to +14 % over five runs whose medians were within 10 %), so the check is
   ``--pairs`` rounds, each measuring the one-core input right beside its own ``-np 1`` and
   ``-np 2`` runs (input first in even rounds, last in odd ones); the verdict per rank count
   comes from the rounds' ratios measured ÷ predicted: "met" only when the median's 95 %
   bootstrap interval lies within [0.90, 1.10].

    python benchmarks/bench_scaling.py --size 2GiB --reps 3 --pairs 5 [--no-s3] [--no-mpi]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _common import emit, ratio_verdict

from asyncckpt import AsyncCheckpointer, parse_size

GB = 1e9
CORES = (8, 16, 64)
ENDPOINTS = (1, 2, 4, 8)
RANKS = (1, 8)
TARGETS_GBPS = (25, 50)


async def measure(uri: str, args: argparse.Namespace, **config: Any) -> dict[str, Any]:
    """Median CPU-s/GB and per-request latency of ``--reps`` default saves into ``uri``."""
    size, chunk = parse_size(args.size), parse_size(args.chunk_size)
    costs, latencies, rates = [], [], []
    async with AsyncCheckpointer(chunk_size=chunk, seed=1, **config) as ckpt:
        await ckpt.save(uri, min(size, 4 * chunk))  # warm-up: pool, generator pool, client
        for _ in range(args.reps):
            r = await ckpt.save(uri, size)
            assert r.cpu_s_per_gb is not None
            costs.append(r.cpu_s_per_gb)
            latencies.append(r.write_latency_s.p50)
            rates.append(r.throughput_bps)
            in_flight = r.metadata.max_in_flight
            scope = r.cpu_scope
    return {
        "cpu_s_per_gb": statistics.median(costs),
        "request_latency_s": statistics.median(latencies),
        "chunk_bytes": chunk,
        "in_flight": in_flight,
        "cpu_scope": scope,
        "measured_GBps": statistics.median(rates) / GB,
    }


def measure_one_core(args: argparse.Namespace) -> dict[str, Any]:
    """``null://`` inputs in a fresh process confined to one core before anything starts: the
    generator pool then gets one thread, as a rank that mpirun binds to one core does."""
    cmd = [sys.executable, __file__, "--size", args.size, "--chunk-size", args.chunk_size]
    cmd += ["--reps", str(args.reps), "--null-input-only"]
    core = min(os.sched_getaffinity(0))
    cmd += ["--core", str(core)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    if proc.returncode != 0:
        raise SystemExit(f"one-core input failed:\n{proc.stderr}")
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


def measure_s3(args: argparse.Namespace) -> dict[str, Any] | None:
    try:
        import aiobotocore  # noqa: F401
    except ImportError:
        return None
    script = Path(__file__).with_name("s3_discard_server.py")
    server = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        endpoint = server.stdout.readline().split()[1]
        options = {"endpoint_url": endpoint, "region": "us-east-1", "dotenv": False}
        os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench-secret")
        return asyncio.run(
            measure(
                "s3://bench/scaling",
                args,
                backend="aiobotocore",
                backend_options=options,
                isolation="none",
            )
        )
    finally:
        server.terminate()
        server.wait()


def node_throughput(
    inp: dict[str, Any],
    *,
    cores: float,
    ranks: int,
    endpoints: int,
    endpoint_gbps: float | None,
    nic_gbps: float,
) -> float:
    """The model: GB/s of one node (see docs/scaling.md)."""
    bounds = [cores / inp["cpu_s_per_gb"], nic_gbps]
    if inp["request_latency_s"] > 0:
        bounds.append(ranks * inp["in_flight"] * inp["chunk_bytes"] / inp["request_latency_s"] / GB)
    if endpoint_gbps is not None:
        bounds.append(endpoints * endpoint_gbps)
    return min(bounds)


def mpi_runs(args: argparse.Namespace) -> list[dict[str, Any]]:
    """``mpirun -np 1`` and ``-np 2`` into ``null://``: job GB/s and the ranks' own cost per byte."""
    from bench_mpi import bench, figures  # the same runner as the MPI benchmark

    run = argparse.Namespace(
        target="null://scaling",
        size=args.size,
        repeat=args.reps,
        chunk_size=args.chunk_size,
        timeout=args.timeout,
    )
    out = []
    for np in (1, 2):
        report = bench(np, run)
        f = figures(report)
        (phase,) = [p for p in report["phases"] if p["phase"] == "save"]
        costs = [r["cpu_s_per_gb"] for c in phase["checkpoints"] for r in c["per_rank"]]
        known = [c for c in costs if c is not None]
        out.append(
            {
                "ranks": np,
                "measured_GBps": f["throughput_bps_mean"] / GB,
                "rank_cpu_s_per_gb": statistics.median(known) if known else None,
                "gen_threads": f["gen_threads"],
            }
        )
    return out


def against(run: dict[str, Any], one_core: dict[str, Any]) -> dict[str, Any]:
    """One MPI run against the model fed the one-core input."""
    np, measured, cost = run["ranks"], run["measured_GBps"], run["rank_cpu_s_per_gb"]
    # mpirun binds each rank to one core: the node's cores for this job are the ranks
    predicted = node_throughput(
        one_core, cores=np, ranks=np, endpoints=1, endpoint_gbps=None, nic_gbps=float("inf")
    )
    return {
        **run,
        "input_cpu_s_per_gb": one_core["cpu_s_per_gb"],
        "predicted_GBps": predicted,
        "ratio": measured / predicted,
        "error": measured / predicted - 1,
        # the two terms of the error: did the cost per byte hold (the ranks' own against the
        # input), and how many cores did the ranks get
        "cost_vs_input": cost / one_core["cpu_s_per_gb"] if cost is not None else None,
        "cores_used": measured * cost if cost is not None else None,
    }


def within(ratios: list[float], tolerance: float = 0.10) -> dict[str, Any]:
    """Two-sided verdict: "met" when the median ratio's interval lies in [1 - tol, 1 + tol]."""
    low = ratio_verdict(ratios, 1 - tolerance)
    high = ratio_verdict(ratios, 1 + tolerance, at_most=True)
    verdicts = {low["verdict"], high["verdict"]}
    verdict = "met" if verdicts == {"met"} else "not met" if "not met" in verdicts else "not demonstrated"
    return {**low, "target": f"within {tolerance:.0%} of the model", "verdict": verdict}


def mpi_check(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``--pairs`` rounds of (one-core input, -np 1, -np 2), the input's place alternating."""
    rows: list[dict[str, Any]] = []
    for i in range(args.pairs):
        if i % 2 == 0:
            one_core = measure_one_core(args)
            runs = mpi_runs(args)
        else:  # the input after its runs: drift within a round does not favour one side
            runs = mpi_runs(args)
            one_core = measure_one_core(args)
        checks = [against(r, one_core) for r in runs]
        rows += [{"round": i, **r} for r in checks]
        for r in checks:
            print(
                f"# round {i}: {r['ranks']} rank(s) {r['measured_GBps']:.2f} GB/s, predicted "
                f"{r['predicted_GBps']:.2f} (input {r['input_cpu_s_per_gb']:.3f} CPU-s/GB): "
                f"{r['error'] * 100:+.1f} %",
                file=sys.stderr,
            )
    summary = {f"{np}_ranks": within([r["ratio"] for r in rows if r["ranks"] == np]) for np in (1, 2)}
    return rows, summary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="2GiB", help="per save (and per rank in the MPI check)")
    p.add_argument("--chunk-size", default="32MiB")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--pairs", type=int, default=5, help="rounds of the MPI check (>= 5)")
    p.add_argument("--tmpfs", default="/dev/shm")
    p.add_argument("--nic-gbps", type=float, default=50.0, help="per-node NIC for the projection (400 Gb/s)")
    p.add_argument(
        "--endpoint-gbps", type=float, default=None, help="per-endpoint S3 bandwidth for the projection"
    )
    p.add_argument("--no-s3", action="store_true")
    p.add_argument("--no-mpi", action="store_true")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--null-input-only", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--core", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.pairs < 5 and not args.no_mpi:
        p.error("--pairs: a verdict needs at least 5 rounds")
    if args.null_input_only:  # the one-core child of measure_one_core
        if args.core is not None:  # before the generator pool starts: it sizes itself from this
            os.sched_setaffinity(0, {args.core})
        print(json.dumps(asyncio.run(measure("null://scaling", args))))
        return

    inputs: dict[str, dict[str, Any]] = {"null": asyncio.run(measure("null://scaling", args))}
    with tempfile.TemporaryDirectory(dir=args.tmpfs, prefix="asyncckpt-scaling-") as tmp:
        inputs["file (tmpfs)"] = asyncio.run(measure(os.path.join(tmp, "ckpt.bin"), args))
    if not args.no_s3 and (s3 := measure_s3(args)) is not None:
        inputs["s3 (aiobotocore)"] = s3

    rows: list[dict[str, Any]] = []
    for name, inp in inputs.items():
        endpoint_gbps = args.endpoint_gbps if name.startswith("s3") else None
        for cores in CORES:
            for ranks in RANKS:
                row: dict[str, Any] = {"backend": name, "cores": cores, "ranks": ranks}
                for e in ENDPOINTS if name.startswith("s3") else (1,):
                    row[f"E={e}"] = node_throughput(
                        inp,
                        cores=cores,
                        ranks=ranks,
                        endpoints=e,
                        endpoint_gbps=endpoint_gbps,
                        nic_gbps=args.nic_gbps,
                    )
                rows.append(row)
    cores_needed = {
        name: {f"{x}_GBps": round(x * inp["cpu_s_per_gb"], 1) for x in TARGETS_GBPS}
        for name, inp in inputs.items()
    }
    check, verdicts = ([], {}) if args.no_mpi else mpi_check(args)
    emit(
        "scaling",
        rows,
        ("backend", "cores", "ranks", *(f"E={e}" for e in ENDPOINTS)),
        {
            "size_bytes": parse_size(args.size),
            "model": "T = min(C / c, R * q * s / L, E * B_ep, device, NIC) per node, GB/s",
            "nic_gbps": args.nic_gbps,
            "endpoint_gbps": args.endpoint_gbps,
            "inputs": inputs,
            "cores_needed": cores_needed,
            "check": check,
            "check_verdicts": verdicts,
            "check_target": "measured within 10 % of predicted (ratio in [0.90, 1.10])",
        },
    )
    for name, v in verdicts.items():
        errors = ", ".join(f"{(r - 1) * 100:+.1f}" for r in v["ratios"])
        print(
            f"check, {name.replace('_', ' ')}: errors {errors} %; median ratio {v['median_ratio']:.3f} "
            f"[{v['ci95'][0]:.3f}, {v['ci95'][1]:.3f}]: {v['verdict']}"
        )


if __name__ == "__main__":
    main()

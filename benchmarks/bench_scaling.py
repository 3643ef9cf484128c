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
   against the model's ``min(R / c_null, R · q · s / L_null)``; error = measured ÷ predicted − 1,
   target within ±10 %.

    python benchmarks/bench_scaling.py --size 2GiB --reps 3 [--no-s3] [--no-mpi]
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

from _common import emit

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


def mpi_check(
    args: argparse.Namespace, null: dict[str, Any], one_core: dict[str, Any]
) -> list[dict[str, Any]]:
    from bench_mpi import bench, figures  # the same runner as the MPI benchmark

    run = argparse.Namespace(
        target="null://scaling",
        size=args.size,
        repeat=args.reps,
        chunk_size=args.chunk_size,
        timeout=args.timeout,
    )
    rows = []
    for np in (1, 2):
        report = bench(np, run)
        f = figures(report)
        (phase,) = [p for p in report["phases"] if p["phase"] == "save"]
        rank_costs = [r["cpu_s_per_gb"] for c in phase["checkpoints"] for r in c["per_rank"]]
        # mpirun binds each rank to one core: the node's cores for this job are the ranks;
        # predicted from the inputs taken at two threads on two cores and at one core
        predicted = node_throughput(
            null, cores=np, ranks=np, endpoints=1, endpoint_gbps=None, nic_gbps=float("inf")
        )
        predicted_1c = node_throughput(
            one_core, cores=np, ranks=np, endpoints=1, endpoint_gbps=None, nic_gbps=float("inf")
        )
        measured = f["throughput_bps_mean"] / GB
        cost = statistics.median(c for c in rank_costs if c is not None) if any(rank_costs) else None
        rows.append(
            {
                "ranks": np,
                "predicted_GBps": predicted,
                "measured_GBps": measured,
                "error": measured / predicted - 1,
                "within_10pct": abs(measured / predicted - 1) <= 0.10,
                "predicted_1core_GBps": predicted_1c,
                "error_1core": measured / predicted_1c - 1,
                "within_10pct_1core": abs(measured / predicted_1c - 1) <= 0.10,
                # the two terms of the error: did the cost per byte hold (the ranks' own
                # cpu_s_per_gb against the input), and how many cores did the ranks get
                "rank_cpu_s_per_gb": cost,
                "cost_vs_input": cost / null["cpu_s_per_gb"] if cost is not None else None,
                "cores_used": measured * cost if cost is not None else None,
                "gen_threads": f["gen_threads"],
            }
        )
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="2GiB", help="per save (and per rank in the MPI check)")
    p.add_argument("--chunk-size", default="32MiB")
    p.add_argument("--reps", type=int, default=3)
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
    one_core = measure_one_core(args)
    check = [] if args.no_mpi else mpi_check(args, inputs["null"], one_core)
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
            "null_input_one_core": one_core,
            "cores_needed": cores_needed,
            "check": check,
            "check_target": "measured within 10 % of predicted",
        },
    )
    for r in check:
        print(
            f"check: {r['ranks']} rank(s): predicted {r['predicted_GBps']:.2f} GB/s, measured "
            f"{r['measured_GBps']:.2f} GB/s, error {r['error'] * 100:+.1f} %; from the one-core input "
            f"{r['predicted_1core_GBps']:.2f} GB/s, error {r['error_1core'] * 100:+.1f} %; "
            f"cores used {r['cores_used'] or 0:.2f}"
        )


if __name__ == "__main__":
    main()

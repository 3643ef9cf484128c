"""What the load's default CRC32C check costs, and why: one object loaded four ways.

fio reads without checking anything; asyncckpt's load checks each chunk's CRC32C by default.
One file of ``--size`` bytes, loaded ``--pairs`` times each way by one checkpointer with its
defaults, the arms rotating round by round:

- ``verified``: the default load;
- ``unverified``: ``verify=False``;
- ``unverified + CRC neighbour``: ``verify=False`` while another *process* computes CRC32C
  over its own 256 MiB at ``--duty`` of one core (the check's own share of a verified load,
  ``verify_s`` / wall, is about 0.2 here): the check's CPU and memory traffic, without the
  check in the load's pipeline;
- ``unverified + spin neighbour``: the same duty spent spinning on the CPU, touching no
  memory.

A process, not a thread, so the neighbours never hold the load's GIL. If the CRC neighbour
costs the unverified load what the check costs, the price is the work itself on this machine
(not the pipeline's structure); the spin neighbour separates CPU time from memory traffic.

``--state`` saves a state object instead (float32 tensors of 64 MiB, with ``save_state``) and
loads it with ``load_state`` into arrays touched before timing: its checksums are per 256 KiB
block, not per 32 MiB chunk, so each read holds 128 of them.

``--num-buffers`` and ``--max-in-flight`` set the checkpointer's pool and reads in flight
(defaults: the library's), to see whether the check holds buffers the reads wait for.

    python benchmarks/bench_verify_cost.py [--size 2GiB] [--pairs 6] [--dir /var/tmp] [--duty 0.2]
                                           [--num-buffers N] [--max-in-flight N] [--state]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import tempfile
import time
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import numpy as np
from _common import directory, emit, median, positive_int, rate_stats, rotation

from asyncckpt import AsyncCheckpointer, parse_size

PIECE = 32 << 20  # the CRC neighbour's piece: one pipeline chunk
TENSOR = 64 << 20
ARMS = ("verified", "unverified", "unverified + CRC neighbour", "unverified + spin neighbour")


def neighbour(kind: str, duty: float, stop: Event, ready: Event) -> None:
    """Work for ``duty`` of one core until ``stop``: CRC32C of 32 MiB pieces, or a spin of the
    same length; sleeping the rest."""
    import os

    from asyncckpt.checksum import crc

    data = memoryview(bytearray(os.urandom(1 << 20) * 256))
    piece = 0
    ready.set()
    while not stop.is_set():
        t0 = time.perf_counter()
        if kind == "crc":
            at = (piece % (len(data) // PIECE)) * PIECE
            crc(data[at : at + PIECE])
            piece += 1
        else:
            while time.perf_counter() - t0 < 0.0027:  # about one piece's CRC here
                pass
        busy = time.perf_counter() - t0
        stop.wait(busy * (1 - duty) / duty)


def state_of(size: int) -> dict[str, Any]:
    """float32 tensors of 64 MiB (the last one shorter) holding ``size`` bytes, every page touched."""
    rng = np.random.default_rng(0)
    out, left, i = {}, size, 0
    while left > 0:
        n = min(left, TENSOR) // 4
        out[f"t{i:03d}"] = rng.standard_normal(n, dtype=np.float32)
        left, i = left - n * 4, i + 1
    return out


async def run(args: argparse.Namespace) -> tuple[dict[str, list[float]], dict[str, dict[str, list[float]]]]:
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = str(Path(tmp) / "verify-cost.bin")
        rates: dict[str, list[float]] = {arm: [] for arm in ARMS}
        # from the load's own records: after the last read ended, and reads waiting for a buffer
        trace: dict[str, dict[str, list[float]]] = {
            arm: {"tail_s": [], "wait_free_s": [], "check_s": [], "check_cpu_s": []} for arm in ARMS
        }
        knobs = {
            k: v
            for k, v in (("num_buffers", args.num_buffers), ("max_in_flight", args.max_in_flight))
            if v is not None
        }
        async with AsyncCheckpointer(**knobs) as ckpt:
            into = None
            if args.state:
                into = await asyncio.to_thread(state_of, args.size)
                await ckpt.save_state(path, into)
            else:
                await ckpt.save(path, args.size)
            for i in range(args.pairs):
                for arm in (ARMS[k] for k in rotation(len(ARMS), i)):
                    stop, ready = ctx.Event(), ctx.Event()
                    proc = None
                    if "neighbour" in arm:
                        kind = "crc" if "CRC" in arm else "spin"
                        proc = ctx.Process(target=neighbour, args=(kind, args.duty, stop, ready))
                        proc.start()
                        await asyncio.to_thread(ready.wait)
                    try:
                        t0 = time.perf_counter()
                        if into is not None:
                            got = await ckpt.load_state(path, into=into, verify=arm == "verified")
                            result = got.load
                        else:
                            result = await ckpt.load(path, verify=arm == "verified")
                        t1 = time.perf_counter()
                        rates[arm].append(args.size / (t1 - t0) / 1e9)
                        records = result.records
                        trace[arm]["tail_s"].append(t1 - max(r.t_read_end for r in records))
                        trace[arm]["wait_free_s"].append(sum(r.wait_free_s for r in records))
                        trace[arm]["check_s"].append(sum(r.verify_s for r in records))
                        trace[arm]["check_cpu_s"].append(sum(r.verify_cpu_s for r in records))
                    finally:
                        stop.set()
                        if proc is not None:
                            await asyncio.to_thread(proc.join)
        return rates, trace


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=parse_size, default=parse_size("2GiB"))
    p.add_argument("--pairs", type=int, default=6, help="rounds; each loads once per arm")
    p.add_argument("--dir", type=directory, default=tempfile.gettempdir())
    p.add_argument("--duty", type=float, default=0.2, help="the neighbours' share of one core")
    p.add_argument(
        "--num-buffers", type=positive_int, default=None, help="the pool's buffers (default: library)"
    )
    p.add_argument(
        "--max-in-flight", type=positive_int, default=None, help="reads in flight (default: library)"
    )
    p.add_argument("--state", action="store_true", help="a state object, loaded with load_state")
    args = p.parse_args()
    if not 0 < args.duty <= 1:
        p.error(f"--duty must be in (0, 1], got {args.duty}")
    rates, trace = asyncio.run(run(args))
    base = rates["unverified"]
    rows: list[dict[str, Any]] = [
        {
            "load": arm,
            **rate_stats(r, base, "÷ unverified (per round, median)"),
            "after last read s": median(trace[arm]["tail_s"]),
            "waiting for a buffer s": median(trace[arm]["wait_free_s"]),
            "check s": median(trace[arm]["check_s"]),
            "check CPU s": median(trace[arm]["check_cpu_s"]),
        }
        for arm, r in rates.items()
    ]
    emit(
        "verify_cost",
        rows,
        [
            "load",
            "GB/s median",
            "GB/s min",
            "GB/s max",
            "÷ unverified (per round, median)",
            "after last read s",
            "waiting for a buffer s",
            "check s",
            "check CPU s",
        ],
        {
            "size": args.size,
            "duty": args.duty,
            "num_buffers": args.num_buffers,
            "max_in_flight": args.max_in_flight,
            "state": args.state,
            "rates": rates,
            "trace": trace,
        },
    )


if __name__ == "__main__":
    main()

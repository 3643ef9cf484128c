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

``--stand-ins`` adds three verified loads whose check is replaced, in this process, by a
stand-in that does part of its work and passes (the library's ``first_bad``, which every
whole-chunk check calls, is swapped for the load and put back):

- ``check -> sleep``: as long as the check took in an untimed verified load first, per byte;
  the check's place in the pipeline (its thread hop, the buffer held), no CPU, no memory;
- ``check -> CRC of a cached block``: the CRC32C of one 256 KiB block, as many times as the
  chunk has blocks: the check's CPU, without its memory traffic;
- ``check -> CRC of other memory``: the CRC32C of as many bytes of another 256 MiB area, not
  the load's: the check's CPU and memory traffic, at its place, on bytes the reads never
  touch.

``--num-buffers`` and ``--max-in-flight`` set the checkpointer's pool and reads in flight
(defaults: the library's), to see whether the check holds buffers the reads wait for.

    python benchmarks/bench_verify_cost.py [--size 2GiB] [--pairs 6] [--dir /var/tmp] [--duty 0.2]
                                           [--num-buffers N] [--max-in-flight N] [--state]
                                           [--stand-ins]
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

import asyncckpt.engine.verify as verify_module
from asyncckpt import AsyncCheckpointer, LoadResult, parse_size
from asyncckpt.checksum import crc

PIECE = 32 << 20  # the CRC neighbour's piece: one pipeline chunk
TENSOR = 64 << 20
ARMS = ("verified", "unverified", "unverified + CRC neighbour", "unverified + spin neighbour")
STAND_INS = ("check -> sleep", "check -> CRC of a cached block", "check -> CRC of other memory")
BLOCK = 256 << 10
OTHER = 256 << 20


class StandIn:
    """Replacements for the check (``verify.first_bad``): each passes every chunk."""

    def __init__(self, check_s_per_byte: float) -> None:
        self.check_s_per_byte = check_s_per_byte  # from an untimed verified load
        self.cached = memoryview(bytearray(np.random.default_rng(1).bytes(BLOCK)))
        self.other = memoryview(bytearray(np.random.default_rng(2).bytes(OTHER)))
        self.at = 0

    def sleep(self, manifest: Any, view: memoryview, chunk: int, count: int) -> None:
        time.sleep(self.check_s_per_byte * len(view))

    def cached_block(self, manifest: Any, view: memoryview, chunk: int, count: int) -> None:
        for _ in range(max(1, len(view) // BLOCK)):
            crc(self.cached)

    def other_memory(self, manifest: Any, view: memoryview, chunk: int, count: int) -> None:
        n = min(len(view), OTHER)
        if self.at + n > OTHER:
            self.at = 0
        crc(self.other[self.at : self.at + n])
        self.at += n

    def of(self, arm: str) -> Any:
        ways = (self.sleep, self.cached_block, self.other_memory)
        return dict(zip(STAND_INS, ways, strict=True))[arm]


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
        arms = ARMS + STAND_INS if args.stand_ins else ARMS
        rates: dict[str, list[float]] = {arm: [] for arm in arms}
        # from the load's own records: after the last read ended, and reads waiting for a buffer
        trace: dict[str, dict[str, list[float]]] = {
            arm: {"tail_s": [], "wait_free_s": [], "check_s": [], "check_cpu_s": []} for arm in arms
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

            async def load(verify: bool) -> LoadResult:
                """One load of the object, verified or not."""
                if into is not None:
                    return (await ckpt.load_state(path, into=into, verify=verify)).load
                return await ckpt.load(path, verify=verify)

            stand_in = None
            if args.stand_ins:  # the check's time per byte, from an untimed verified load
                first = await load(True)
                checked = sum(r.nbytes for r in first.records)
                stand_in = StandIn(sum(r.verify_s for r in first.records) / max(1, checked))
            real_check = verify_module.first_bad
            for i in range(args.pairs):
                for arm in (arms[k] for k in rotation(len(arms), i)):
                    stop, ready = ctx.Event(), ctx.Event()
                    proc = None
                    if "neighbour" in arm:
                        kind = "crc" if "CRC" in arm else "spin"
                        proc = ctx.Process(target=neighbour, args=(kind, args.duty, stop, ready))
                        proc.start()
                        await asyncio.to_thread(ready.wait)
                    verified = arm == "verified" or arm in STAND_INS
                    if arm in STAND_INS:
                        assert stand_in is not None
                        verify_module.first_bad = stand_in.of(arm)
                    try:
                        t0 = time.perf_counter()
                        result = await load(verified)
                        t1 = time.perf_counter()
                        rates[arm].append(args.size / (t1 - t0) / 1e9)
                        records = result.records
                        trace[arm]["tail_s"].append(t1 - max(r.t_read_end for r in records))
                        trace[arm]["wait_free_s"].append(sum(r.wait_free_s for r in records))
                        trace[arm]["check_s"].append(sum(r.verify_s for r in records))
                        trace[arm]["check_cpu_s"].append(sum(r.verify_cpu_s for r in records))
                    finally:
                        verify_module.first_bad = real_check
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
    p.add_argument(
        "--stand-ins",
        action="store_true",
        help="also verified loads whose check is replaced by part of its work",
    )
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
            "stand_ins": args.stand_ins,
            "rates": rates,
            "trace": trace,
        },
    )


if __name__ == "__main__":
    main()

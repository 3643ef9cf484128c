"""A state of many small tensors: what each tensor costs a save and a load, beside a memcpy.

A mixture-of-experts checkpoint has tens of thousands of tensors (DeepSeek-V3's has about
91 000), so per-tensor work (laying out the header, sharing the copies, listing the result)
can outweigh the bytes. This saves ``--tensors`` float32 tensors of ``--elements`` each with
``save_state(staging="host")`` (the caller's blocked time, then the time to durable) and
``staging="none"``, loads the object back, and measures in each round the same-process copy
of every tensor into preallocated arrays (the memcpy the blocked time is compared with).
Rounds alternate the arms' order; medians over ``--rounds``.

It also encodes the state's step index (``save_step`` writes it) in a worker thread with the
C ``json.dumps`` and with ``engine.jsontext.dumps``, while a 1 ms ticker on the event loop
records its worst tick: the C encoder holds the GIL for the whole document, so the loop's
thread waits that long.

    python benchmarks/bench_many_tensors.py [--tensors 80000] [--elements 2] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
from _common import directory, emit, median, positive_int, rotation

from asyncckpt import AsyncCheckpointer
from asyncckpt.engine import jsontext
from asyncckpt.state import StagedSave
from asyncckpt.state.index import INDEX


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--tensors", type=positive_int, default=80_000, help="tensors in the state (default 80000)"
    )
    p.add_argument("--elements", type=positive_int, default=2, help="float32 elements per tensor (default 2)")
    p.add_argument("--rounds", type=positive_int, default=5, help="rounds (default 5)")
    p.add_argument(
        "--dir", type=directory, default=None, help="directory for the object (default: a temporary one)"
    )
    return p.parse_args(argv)


def make_state(tensors: int, elements: int) -> dict[str, Any]:
    return {
        "model": {f"layers.{i}.w": np.full(elements, i, dtype=np.float32) for i in range(tensors)},
        "step": 1,
    }


def memcpy(state: dict[str, Any], into: dict[str, np.ndarray[Any, Any]]) -> float:
    t0 = time.perf_counter()
    for name, array in state["model"].items():
        np.copyto(into[name], array)
    return time.perf_counter() - t0


async def run(args: argparse.Namespace, where: str) -> dict[str, Any]:
    state = await asyncio.to_thread(make_state, args.tensors, args.elements)
    into = {k: np.empty_like(v) for k, v in state["model"].items()}
    uri = f"{where}/many.safetensors"
    names = ("memcpy", "blocked", "durable", "none", "load", "index json", "index jsontext")
    figures: dict[str, list[float]] = {k: [] for k in names}
    ticks: dict[str, list[float]] = {"index json": [], "index jsontext": []}
    async with AsyncCheckpointer() as ckpt:
        await ckpt.save_step(f"{where}/steps", 1, state)
        raw = await asyncio.to_thread(Path(f"{where}/steps/step-1/{INDEX}").read_bytes)
        index = json.loads(raw)

        def encoding(arm: str, dumps: Callable[..., str]) -> Callable[[], Awaitable[None]]:
            async def encode() -> None:
                worst, done = 0.0, False

                async def tick() -> None:
                    nonlocal worst
                    while not done:
                        t0 = time.perf_counter()
                        await asyncio.sleep(0.001)
                        worst = max(worst, time.perf_counter() - t0 - 0.001)

                ticker = asyncio.create_task(tick())
                await asyncio.sleep(0.01)
                t0 = time.perf_counter()
                await asyncio.to_thread(dumps, index, sort_keys=True)
                figures[arm].append(time.perf_counter() - t0)
                done = True
                await ticker
                ticks[arm].append(worst)

            return encode

        async def host() -> None:
            t0 = time.perf_counter()
            staged = await ckpt.save_state(uri, state, staging="host")
            figures["blocked"].append(time.perf_counter() - t0)
            assert isinstance(staged, StagedSave)
            await staged
            figures["durable"].append(time.perf_counter() - t0)

        async def none() -> None:
            t0 = time.perf_counter()
            await ckpt.save_state(uri, state, staging="none")
            figures["none"].append(time.perf_counter() - t0)

        async def load() -> None:
            t0 = time.perf_counter()
            loaded = await ckpt.load_state(uri)
            figures["load"].append(time.perf_counter() - t0)
            assert loaded.verified and loaded.tensors == args.tensors

        async def copy() -> None:
            figures["memcpy"].append(await asyncio.to_thread(memcpy, state, into))

        arms = [
            copy,
            host,
            none,
            load,
            encoding("index json", json.dumps),
            encoding("index jsontext", jsontext.dumps),
        ]
        await host()  # warm: the pool, the staging area, the threads
        figures["blocked"].clear()
        figures["durable"].clear()
        for r in range(args.rounds):
            for i in rotation(len(arms), r):
                await arms[i]()
    rows = [
        {
            "arm": arm,
            "median s": median(v),
            "min s": min(v),
            "max s": max(v),
            "us per tensor": median(v) / args.tensors * 1e6,
            "worst loop tick s": median(ticks[arm]) if arm in ticks else None,
        }
        for arm, v in figures.items()
    ]
    ratio = median([b / m for b, m in zip(figures["blocked"], figures["memcpy"], strict=True)])
    return {"rows": rows, "blocked_over_memcpy": ratio}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.dir) as where:
        out = asyncio.run(run(args, where))
    emit(
        "bench_many_tensors",
        out["rows"],
        ["arm", "median s", "min s", "max s", "us per tensor", "worst loop tick s"],
        {"tensors": args.tensors, "elements": args.elements, "rounds": args.rounds,
         "blocked_over_memcpy": out["blocked_over_memcpy"]},
    )  # fmt: skip


if __name__ == "__main__":
    main()

"""Resharded and partial loads: bytes read against bytes needed, and throughput against a
same-world-size load of the same step (issue 27's targets).

Steps are saved by real ranks (``torchrun``, gloo, CPU): a state of ``--size`` bytes in
float32 tensors of ``--tensor`` bytes, each split by rows across the ranks (an explicit
:class:`asyncckpt.Shard` per rank, as ``DTensor`` ``Shard(0)`` lays it out). Each load of M
ranks is then run in this process, rank after rank (``load_step`` into that rank's
``Shard`` boxes: the bytes each rank reads do not depend on the others running beside it,
and a 2-core machine could not run 4 ranks side by side without measuring the time-slicing).
The baseline is the same-world-size load of the same step: each of its N saving ranks
loading its own object with ``load_state``, rank after rank. Per case, alternating
``--pairs`` pairs: the median of the resharded load's throughput (bytes needed / time) over
the baseline's, with its 95 % bootstrap interval; and the bytes read / bytes needed. The
partial case loads 10 % of the tensors of one object with ``keys=``.

By default each load's destination arrays are new (``np.zeros`` for the resharded ranks'
boxes, the library's own for ``load_state``), so first touching their pages is part of every
load's time. On a VM with free-page reporting that costs 0.03-1.9 s per 512 MiB depending on
which pages the allocator hands back, and swamps the loads' own differences. ``--warm``
allocates and touches every destination before timing (``load_state(into=)`` on the same
footing), as a training job resuming into its existing tensors would.

``--together`` runs the ranks of each load at once instead (``asyncio.gather`` in this
process, each rank with its own checkpointer, as ranks in their own processes have their own
pools), both sides alike: the time is the whole job's, from the first rank's start to the last
rank's end, so one rank's fixed costs (listing, commit record, index, headers) overlap the
others' reads, as they do when a job resumes. The ranks share this process's two cores, GIL
and device; an untimed load of each side makes every checkpointer's pool first, and the pairs
start once every pool is faulted in.

    python benchmarks/bench_reshard.py --target /nvme/tmp        # 2->4, 4->2, 2->1, 10 % partial
    python benchmarks/bench_reshard.py --size 1GiB --pairs 7
    python benchmarks/bench_reshard.py --warm --pairs 7           # destinations touched first
``--processes`` runs every rank in its own process, as a job does: one ``torchrun`` job per
case with as many ranks as the larger side; each pair times both sides between two gloo
barriers (rank 0's clock), the ranks a side does not use waiting at the barriers. Each rank
has its own checkpointer, pool and GIL; the ranks share the machine's cores and device. Where
fewer ranks load than saved (4 -> 2, 2 -> 1), a third side is a control: the loading ranks
load the objects their boxes cover whole, with ``load_state`` one after another, so the
resharded load is also compared with the same work in as many processes (``ratio_vs_whole``):
what the resharding costs, apart from how the device serves fewer readers.

    python benchmarks/bench_reshard.py --warm --together --pairs 7 # every rank of a load at once
    python benchmarks/bench_reshard.py --warm --processes --pairs 7 # every rank its own process
    python benchmarks/bench_reshard.py --save-rank ROOT ...        # internal: one saving rank
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from _common import directory, emit, median, ratio_verdict

from asyncckpt import AsyncCheckpointer, Shard, parse_size

READ_TARGET, SPEED_TARGET, PARTIAL_TARGET = 1.1, 0.9, 0.15
CASES = ((2, 4), (4, 2), (2, 1))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="512MiB", help="bytes of the state (default 512MiB)")
    p.add_argument("--tensor", default="16MiB", help="bytes per tensor (default 16MiB)")
    p.add_argument(
        "--pairs", type=int, default=5, help="alternating pairs (default 5, the verdict's minimum)"
    )
    p.add_argument(
        "--target", type=directory, default=None, help="a directory (default: a temporary one under /tmp)"
    )
    p.add_argument("--chunk-size", default="32MiB")
    p.add_argument(
        "--warm", action="store_true", help="destinations allocated and touched before timing (both sides)"
    )
    p.add_argument(
        "--together",
        action="store_true",
        help="the ranks of each load at once, a checkpointer each (both sides); default: rank after rank",
    )
    p.add_argument(
        "--processes",
        action="store_true",
        help="every rank of a load in its own process (torchrun, gloo barriers around each load)",
    )
    p.add_argument(
        "--max-in-flight",
        type=int,
        default=None,
        help="reads in flight for every load, both sides (default: the library's)",
    )
    p.add_argument("--save-rank", default=None, help=argparse.SUPPRESS)
    p.add_argument("--load-rank", nargs=4, default=None, help=argparse.SUPPRESS)  # root saved loaded out
    return p.parse_args(argv)


def shapes(size: int, tensor: int) -> list[tuple[int, int]]:
    cols = 1024
    rows = max(1, tensor // 4 // cols)
    return [(rows, cols)] * max(1, size // tensor)


def rows_of(n: int, rank: int, world: int) -> tuple[int, int]:
    """Rank's rows of n, torch's Shard(0) split (ceil-sized chunks, the last ones short)."""
    per = -(-n // world)
    start = min(n, rank * per)
    return start, min(n, start + per) - start


def tensor(i: int, shape: tuple[int, int]) -> np.ndarray[Any, Any]:
    return np.random.default_rng(i).standard_normal(shape, dtype=np.float32)


def rank_state(shape_list: list[tuple[int, int]], rank: int, world: int, zero: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for i, shape in enumerate(shape_list):
        start, count = rows_of(shape[0], rank, world)
        data = np.zeros((count, shape[1]), np.float32) if zero else tensor(i, shape)[start : start + count]
        out[f"t{i:03d}"] = Shard(shape, (start, 0), np.ascontiguousarray(data))
    return out


async def save_rank(args: argparse.Namespace) -> None:
    import torch.distributed as dist  # only in the saving ranks

    dist.init_process_group("gloo")
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        state = rank_state(shapes(parse_size(args.size), parse_size(args.tensor)), rank, world, zero=False)
        async with AsyncCheckpointer(chunk_size=parse_size(args.chunk_size)) as c:
            await c.save_step(args.save_rank, 1, state)
    finally:
        dist.destroy_process_group()


def run_ranks(ranks: int, args: argparse.Namespace, extra: list[str]) -> None:
    """This script as ``ranks`` real ``torchrun`` ranks (gloo, CPU) with ``extra`` arguments."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--nnodes", "1",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--max-restarts", "0",
        os.path.abspath(__file__), "--size", args.size, "--tensor", args.tensor,
        "--chunk-size", args.chunk_size,
        "--pairs", str(args.pairs), *(["--warm"] if args.warm else []),
        *([] if args.max_in_flight is None else ["--max-in-flight", str(args.max_in_flight)]), *extra,
    ]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, text=True)


def save_with(ranks: int, root: Path, args: argparse.Namespace) -> None:
    run_ranks(ranks, args, ["--save-rank", str(root)])


def touched(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with every page of its arrays written once (``--warm``)."""
    for leaf in state.values():
        (leaf.data if isinstance(leaf, Shard) else leaf).fill(1)
    return state


async def one_resharded(
    c: AsyncCheckpointer, root: Path, rank: int, world: int, shape_list: list[tuple[int, int]], into: Any
) -> tuple[int, int]:
    """(bytes read, bytes needed) of rank ``rank`` of ``world`` loading the step resharded
    (into ``into``'s boxes when given, else into new ones)."""
    dest = into if into is not None else rank_state(shape_list, rank, world, zero=True)
    got = await c.load_step(root, into=dest)
    assert got.reads is not None
    return got.reads.read, got.reads.needed


async def one_same(c: AsyncCheckpointer, root: Path, rank: int, world: int, into: Any) -> int:
    """Bytes of rank ``rank`` loading its own object of a step saved by ``world`` ranks (into
    ``into``'s arrays when given)."""
    got = await c.load_state(root / "step-1" / f"rank-{rank}-of-{world}.safetensors", into=into)
    return int(got.tensor_bytes)


async def resharded(
    cs: list[AsyncCheckpointer],
    root: Path,
    world: int,
    shape_list: list[tuple[int, int]],
    into: list[dict[str, Any]] | None = None,
) -> tuple[int, int, float]:
    """(bytes read, bytes needed, seconds) of a load by ``world`` ranks, rank after rank with
    one checkpointer, or all at once with one each (into ``into``'s boxes when given, else
    into new ones)."""

    async def one(rank: int) -> tuple[int, int]:
        dest = into[rank] if into is not None else None
        return await one_resharded(cs[rank % len(cs)], root, rank, world, shape_list, dest)

    t0 = time.perf_counter()
    got = await ranks(one, world, together=len(cs) > 1)
    return sum(r for r, _ in got), sum(n for _, n in got), time.perf_counter() - t0


async def same_world(
    cs: list[AsyncCheckpointer], root: Path, world: int, into: list[dict[str, Any]] | None = None
) -> tuple[int, float]:
    """(bytes, seconds) of each rank loading its own object of a step saved by ``world`` ranks
    (into ``into``'s arrays when given), rank after rank or all at once as ``resharded``."""

    async def one(rank: int) -> int:
        return await one_same(cs[rank % len(cs)], root, rank, world, into[rank] if into is not None else None)

    t0 = time.perf_counter()
    got = await ranks(one, world, together=len(cs) > 1)
    return sum(got), time.perf_counter() - t0


async def ranks(one: Any, world: int, *, together: bool) -> list[Any]:
    """``one(rank)`` for every rank: all at once, or one after another."""
    if together:
        return list(await asyncio.gather(*(one(rank) for rank in range(world))))
    return [await one(rank) for rank in range(world)]


async def partial(c: AsyncCheckpointer, base: Path, shape_list: list[tuple[int, int]]) -> dict[str, Any]:
    uri = base / "partial.safetensors"
    state = {f"t{i:03d}": tensor(i, s) for i, s in enumerate(shape_list)}
    await c.save_state(uri, state)
    keys = sorted(state)[::10][: max(1, len(state) // 10)]
    got = await c.load_state(uri, keys=keys)
    total = sum(a.nbytes for a in state.values())
    return {"tensors": len(keys), "of": len(state), "read": got.load.size_bytes, "total": total,
            "fraction": got.load.size_bytes / total, "target": f"<= {PARTIAL_TARGET}",
            "met": got.load.size_bytes / total <= PARTIAL_TARGET}  # fmt: skip


def checkpointer(args: argparse.Namespace) -> AsyncCheckpointer:
    """A loading rank's checkpointer: ``--chunk-size``, and ``--max-in-flight`` when given."""
    tuning = {} if args.max_in_flight is None else {"max_in_flight": args.max_in_flight}
    return AsyncCheckpointer(chunk_size=parse_size(args.chunk_size), **tuning)


async def pool_ready(c: AsyncCheckpointer) -> None:
    """Wait until ``c``'s pool is made and every buffer faulted in: the pool is built at its
    first use and faulted in beside it, which would slow the first timed loads of a rank
    that had not been used yet (a same-world side with more ranks than the resharded one)."""
    pool = c.runtime.pool_now
    if pool is not None:
        await pool.faulted()


def rotated(sides: Sequence[str], pair: int) -> list[str]:
    """The order of the sides in pair ``pair``: each side first in turn."""
    k = pair % len(sides)
    return [*sides[k:], *sides[:k]]


def pair_row(
    case: str,
    pair: int,
    reshard: tuple[int, int, float],
    same: tuple[int, float],
    whole: tuple[int, float] | None = None,
) -> dict[str, Any]:
    """One pair's row: bytes read / needed and both sides' throughput (bytes needed / time);
    with ``whole`` (``--processes``, fewer ranks loading), the control's too."""
    read, needed, secs = reshard
    same_bytes, same_secs = same
    ratio = (needed / secs) / (same_bytes / same_secs)
    row = {"case": case, "pair": pair, "read_over_needed": read / needed}
    row |= {
        "reshard_gbps": needed / secs / 1e9,
        "same_gbps": same_bytes / same_secs / 1e9,
        "ratio": ratio,
    }
    if whole is not None:
        whole_bytes, whole_secs = whole
        row["whole_gbps"] = whole_bytes / whole_secs / 1e9
        row["ratio_vs_whole"] = (needed / secs) / (whole_bytes / whole_secs)
    return row


async def in_this_process(
    args: argparse.Namespace, base: Path, shape_list: list[tuple[int, int]], stack: contextlib.AsyncExitStack
) -> list[dict[str, Any]]:
    """Every case's pairs, the ranks of a load run in this process (one after another, or
    together with ``--together``)."""
    rows = []
    most = max(n for case in CASES for n in case) if args.together else 1
    cs = [await stack.enter_async_context(checkpointer(args)) for _ in range(most)]
    for saved, loaded in CASES:
        step = base / f"saved-by-{saved}"
        warm: dict[str, list[dict[str, Any]]] = {}
        if args.warm:  # made and touched once, before any timing; reused by every pair
            warm["reshard"] = [touched(rank_state(shape_list, r, loaded, zero=True)) for r in range(loaded)]
            warm["same"] = [touched(rank_state(shape_list, r, saved, zero=True)) for r in range(saved)]
        if args.together:  # untimed: every checkpointer's pool made before the pairs
            await resharded(cs, step, loaded, shape_list, warm.get("reshard"))
            await same_world(cs, step, saved, warm.get("same"))
            for c in cs:
                await pool_ready(c)
        for pair in range(args.pairs):
            got: dict[str, Any] = {}
            for which in rotated(("reshard", "same"), pair):
                if which == "reshard":
                    got["reshard"] = await resharded(cs, step, loaded, shape_list, warm.get("reshard"))
                else:  # the same step, loaded by the world size that saved it
                    got["same"] = await same_world(cs, step, saved, warm.get("same"))
            rows.append(pair_row(f"{saved}->{loaded}", pair + 1, got["reshard"], got["same"]))
    return rows


def in_processes(args: argparse.Namespace, base: Path) -> list[dict[str, Any]]:
    """Every case's pairs, one ``torchrun`` job per case (``--processes``)."""
    rows = []
    for saved, loaded in CASES:
        out = base / f"pairs-{saved}-{loaded}.json"
        run_ranks(
            max(saved, loaded),
            args,
            ["--load-rank", str(base / f"saved-by-{saved}"), str(saved), str(loaded), str(out)],
        )
        for pair, got in enumerate(json.loads(out.read_text())):
            whole = tuple(got["whole"]) if got["whole"] is not None else None
            rows.append(
                pair_row(f"{saved}->{loaded}", pair + 1, tuple(got["reshard"]), tuple(got["same"]), whole)
            )
    return rows


def whole_objects(rank: int, saved: int, loaded: int) -> range:
    """The objects a rank of ``loaded`` covers when fewer ranks load than saved (the control's
    whole-object loads); none otherwise."""
    if loaded >= saved or saved % loaded or rank >= loaded:
        return range(0)
    k = saved // loaded
    return range(rank * k, (rank + 1) * k)


async def load_rank(args: argparse.Namespace) -> list[dict[str, Any]] | None:
    """One rank of a ``--processes`` job: every side of every pair, each between two barriers
    (the time is rank 0's, from the first barrier to the second); rank 0 returns the pairs.
    Where fewer ranks load than saved, a third side is the control: the loading ranks load
    the objects their boxes cover whole, each with ``load_state`` as a same-world rank does,
    one after another, so that the resharded load is also compared with the same work
    done by as many processes."""
    import torch.distributed as dist  # only in the ranks

    dist.init_process_group("gloo")
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        root, saved, loaded = Path(args.load_rank[0]), int(args.load_rank[1]), int(args.load_rank[2])
        shape_list = shapes(parse_size(args.size), parse_size(args.tensor))
        into_r = (
            touched(rank_state(shape_list, rank, loaded, zero=True)) if args.warm and rank < loaded else None
        )
        into_s = (
            touched(rank_state(shape_list, rank, saved, zero=True)) if args.warm and rank < saved else None
        )
        objs = whole_objects(rank, saved, loaded)
        into_w = [touched(rank_state(shape_list, o, saved, zero=True)) if args.warm else None for o in objs]
        sides = ["reshard", "same"] + (["whole"] if whole_objects(0, saved, loaded) else [])
        async with checkpointer(args) as c:

            async def side(which: str) -> tuple[float, list[int]]:
                dist.barrier()  # blocking on purpose: nothing else runs on this loop meanwhile
                t0 = time.perf_counter()
                mine = [0, 0, 0, 0]  # bytes read, needed (resharded); bytes (same world; whole)
                if which == "reshard" and rank < loaded:
                    mine[:2] = await one_resharded(c, root, rank, loaded, shape_list, into_r)
                elif which == "same" and rank < saved:
                    mine[2] = await one_same(c, root, rank, saved, into_s)
                elif which == "whole":
                    for o, dest in zip(objs, into_w, strict=True):
                        mine[3] += await one_same(c, root, o, saved, dest)
                dist.barrier()
                secs = time.perf_counter() - t0
                every: list[Any] = [None] * world
                dist.all_gather_object(every, mine)
                return secs, [sum(m[i] for m in every) for i in range(4)]

            for which in sides:  # untimed: the pool made, the files opened once
                await side(which)
            await pool_ready(c)
            dist.barrier()
            pairs = []
            for pair in range(args.pairs):
                got = {}
                for which in rotated(sides, pair):
                    got[which] = await side(which)
                (r_secs, (read, needed, _, _)), (s_secs, (_, _, nbytes, _)) = got["reshard"], got["same"]
                whole = [got["whole"][1][3], got["whole"][0]] if "whole" in got else None
                pairs.append({"reshard": [read, needed, r_secs], "same": [nbytes, s_secs], "whole": whole})
        return pairs if rank == 0 else None
    finally:
        dist.destroy_process_group()


async def run(args: argparse.Namespace, base: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    shape_list = shapes(parse_size(args.size), parse_size(args.tensor))
    for n in sorted({saved for saved, _ in CASES}):
        await asyncio.to_thread(save_with, n, base / f"saved-by-{n}", args)
    verdicts: dict[str, Any] = {}
    async with contextlib.AsyncExitStack() as stack:
        if args.processes:
            rows = await asyncio.to_thread(in_processes, args, base)
        else:
            rows = await in_this_process(args, base, shape_list, stack)
        for saved, loaded in CASES:
            case_rows = [r for r in rows if r["case"] == f"{saved}->{loaded}"]
            ratios = [r["ratio"] for r in case_rows]
            verdicts[f"{saved}->{loaded}"] = {
                "read_over_needed": median([r["read_over_needed"] for r in case_rows]),
                "read_target": f"<= {READ_TARGET}",
                "throughput": ratio_verdict(ratios, SPEED_TARGET) if len(ratios) >= 5 else None,
            }
            vs_whole = [r["ratio_vs_whole"] for r in case_rows if "ratio_vs_whole" in r]
            if len(vs_whole) >= 5:  # the control: the same ranks loading their objects whole
                verdicts[f"{saved}->{loaded}"]["vs_whole"] = ratio_verdict(vs_whole, SPEED_TARGET)
        c = await stack.enter_async_context(checkpointer(args))
        verdicts["partial"] = await partial(c, base, shape_list)
    return rows, verdicts


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.save_rank is not None:
        asyncio.run(save_rank(args))
        return 0
    if args.load_rank is not None:
        pairs = asyncio.run(load_rank(args))
        if pairs is not None:  # rank 0
            Path(args.load_rank[3]).write_text(json.dumps(pairs))
        return 0
    with tempfile.TemporaryDirectory(dir=args.target, prefix="bench-reshard-") as tmp:
        rows, verdicts = asyncio.run(run(args, Path(tmp)))
    headers = ["case", "pair", "read_over_needed", "reshard_gbps", "same_gbps", "ratio"]
    if args.processes:
        headers += ["whole_gbps", "ratio_vs_whole"]
    meta = {"size": args.size, "tensor": args.tensor, "warm": args.warm, "together": args.together}
    meta["processes"] = args.processes
    meta["verdicts"] = verdicts
    emit("bench_reshard", rows, headers, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())

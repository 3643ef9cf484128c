"""Peer replica vs a local save of the same bytes (issue 26's optional part).

With ``replicate_to_peer=True`` each rank's object of a step is copied to the next node's local
tier over the job's transport (``asyncckpt.replicas.transfer``): read with O_DIRECT from the
local tier, sent in 16 MiB rounds, each piece checked against the sender's CRC32C, written and
published atomically on the peer. This measures how fast that second copy is made, in the same
run, against two baselines on the same disk: ``save``, the plain ``save_state`` of the same
state (``staging="none"``: written from the arrays, returning once durable), and ``copy``, the
same object copied to this node's own directory by the drain's verified copy
(``asyncckpt.drain.drain_object``: O_DIRECT read, checksums, atomic publish), which moves the
same bytes through the same disk as the replica, without the transport. On this machine both
"nodes" share one disk, which reads the objects and writes the replicas: twice a save's
traffic (on real nodes the read and the write are on different nodes' disks).

``mpirun -np 2`` on this machine: each rank stands for a node with its own directory under
``--dir`` and sends to the other (the ring of two nodes). Both arms run on both ranks at once,
as in a job; a round is one save, one copy and one replica per rank, in rotating order, each preceded
(untimed) by a ``sync``, the deletion of the previous pair's files and a barrier. Job GB/s by
the MLPerf rule: all ranks' bytes ÷ the slowest rank's time. ``--btl tcp`` makes Open MPI move
the bytes over TCP on the loopback (else shared memory between the two processes), closer to
a network between nodes, though not a real one: the two "nodes" share the CPUs and the disk.

    python benchmarks/bench_replica.py --size 1GiB --pairs 5 --dir /var/tmp [--btl tcp]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from _common import bootstrap_ci, directory, emit, median, positive_int, rotation

from asyncckpt import AsyncCheckpointer, parse_size
from asyncckpt.drain import drain_object
from asyncckpt.node.collectives import get_collectives
from asyncckpt.replicas import transfer

ARMS = ("save", "copy", "replica")


def state_of(size: int, rank: int) -> dict[str, Any]:
    return {"w": np.full(size // 4, rank + 1, dtype=np.float32)}


async def worker(base: Path, size: int, pairs: int) -> None:
    """One rank: the pairs of both arms; rank 0 writes every rank's times to ``base/times.json``."""
    async with get_collectives() as coll, AsyncCheckpointer() as ckpt:
        rank, world = coll.rank, coll.world_size
        to = [(r + 1) % world for r in range(world)]
        source = to.index(rank)
        node = base / f"node-{rank}"
        state = state_of(size, rank)
        mine = node / "object.safetensors"
        await ckpt.save_state(str(mine), state, staging="none")  # what the replicas send
        size = await asyncio.to_thread(lambda: mine.stat().st_size)  # both arms write these bytes
        times: dict[str, list[float]] = {a: [] for a in ARMS}
        for i in range(pairs):
            for arm in (ARMS[k] for k in rotation(len(ARMS), i)):
                out = node / f"pair-{i}-{arm}"
                await asyncio.to_thread(out.mkdir)
                await asyncio.to_thread(os.sync)  # the previous arm's frees land outside the timing
                await coll.barrier()
                t0 = time.perf_counter()
                if arm == "save":
                    await ckpt.save_state(str(out / "state.safetensors"), state, staging="none")
                elif arm == "copy":  # the drain's verified copy, to this node's own disk
                    await drain_object(ckpt, str(mine), str(out / "copy.safetensors"))
                else:
                    moved = await transfer(ckpt, coll, to, send=str(mine), recv=str(out / f"from-{source}"))
                    assert moved.received == size, moved
                times[arm].append(time.perf_counter() - t0)
                await asyncio.to_thread(shutil.rmtree, out)
                await ckpt.storage.settle()
        everyone = await coll.all_gather_object({"times": times, "size": size})
        if rank == 0:
            await asyncio.to_thread((base / "times.json").write_text, json.dumps(everyone))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="1GiB", help="state per rank")
    p.add_argument("--pairs", type=positive_int, default=5)
    p.add_argument("--dir", type=directory, default=tempfile.gettempdir())
    p.add_argument("--btl", choices=("default", "tcp"), default="default", help="Open MPI's byte transport")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    size = parse_size(args.size)
    if args.worker:
        asyncio.run(worker(Path(args.worker), size, args.pairs))
        return
    if shutil.which("mpirun") is None:
        sys.exit("mpirun not found: install Open MPI (tests/setup_system.sh)")
    base = Path(tempfile.mkdtemp(prefix="bench-replica-", dir=args.dir))
    try:
        for r in (0, 1):
            (base / f"node-{r}").mkdir()
        btl = ["--mca", "btl", "tcp,self"] if args.btl == "tcp" else []
        here = str(Path(__file__).resolve())
        cmd = ["mpirun", "-np", "2", "--oversubscribe", *btl, sys.executable, here, "--worker", str(base),
               "--size", args.size, "--pairs", str(args.pairs)]  # fmt: skip
        env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
        subprocess.run(cmd, check=True, env=env)
        ranks = json.loads((base / "times.json").read_text())
    finally:
        shutil.rmtree(base, ignore_errors=True)
    rows, rates = [], {}
    for arm in ARMS:
        total = sum(r["size"] for r in ranks)
        slowest = [max(r["times"][arm][i] for r in ranks) for i in range(args.pairs)]
        rates[arm] = [total / t / 1e9 for t in slowest]
        rows.append({"arm": arm, "job GB/s median": median(rates[arm]), "min": min(rates[arm]),
                     "max": max(rates[arm]), "s median": median(slowest), "bytes": total})  # fmt: skip
    splits = {}
    for arm, base_arm in (("replica", "save"), ("replica", "copy"), ("copy", "save")):
        ratios = [a / b for a, b in zip(rates[arm], rates[base_arm], strict=True)]
        low, high = bootstrap_ci(ratios)
        splits[f"{arm}_vs_{base_arm}"] = {"median": median(ratios), "ci95": [low, high], "ratios": ratios}
        rows.append(
            {"arm": f"{arm} ÷ {base_arm}", "job GB/s median": median(ratios), "min": low, "max": high}
        )
    extra = {"size_per_rank": size, "pairs": args.pairs, "btl": args.btl, "ranks": ranks, **splits}
    emit("replica", rows, ["arm", "job GB/s median", "min", "max", "s median", "bytes"], extra)


if __name__ == "__main__":
    main()

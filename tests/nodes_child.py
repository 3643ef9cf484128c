"""Programs run on the nodes of tests/nodes.py: ``python -m tests.nodes_child MODE ARGS``.

``job OUT LOCAL ROOT torch|mpi`` (one rank of a torchrun or mpirun job spanning both nodes):
records what the rank sees of its place (rank, node-local rank and size from asyncckpt.node,
host name), saves
its state to the node-local directory ``LOCAL`` and lists that directory after a barrier,
then saves step 1 under the remote ``ROOT`` with every rank (``save_step``). Writes
``OUT/rank<r>.json``.
``reload OUT ROOT WORLD``: one process loads and verifies every rank's object of the latest
committed step under ``ROOT`` (a 1-node reload); writes ``OUT/reload.json``.
``local-save LOCAL TAG`` / ``local-load OUT LOCAL``: one process saves its node's state to
``LOCAL/state.safetensors``, or loads it back and writes what happened to ``OUT``.
``put URI TAG`` / ``check URI TAG``: save the state of ``TAG`` to ``URI``; load it back verified
(exit status 1 when it differs).
``tiers OUT LOCAL ROOT save|restore torch|mpi`` (one rank of a job spanning both nodes): a
tiered manager with its local tier at ``LOCAL`` (the same path on both nodes, each node's own
disk) and the remote ``ROOT``; ``save`` commits steps 1 and 2 and waits for their drains,
``restore`` restores the newest step into fresh arrays; ``save-peer`` and ``restore-peer`` do the
same with ``replicate_to_peer=True``; ``resume-peer`` only starts and waits (replicas a previous
run left unmade are made then). Writes ``OUT/tiers-<phase>-<r>.json``.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from asyncckpt import AsyncCheckpointer, CheckpointManager
from asyncckpt.errors import AsyncCkptError
from asyncckpt.node import launcher, topology
from asyncckpt.node.collectives import get_collectives, job_comm
from asyncckpt.steps import latest_step, rank_object, read_commit, save_step, step_uri
from tests.torch_exit import leave

#: S3 wants parts of 5 MiB or more; in-process writers: a writer process per rank would add a
#: Python start and imports per rank to every run, and the bed is about where ranks run
OPTIONS: dict[str, Any] = {"chunk_size": 5 << 20, "num_buffers": 4, "isolation": "none"}
#: S3 through aiobotocore: s3dlio (the s3:// default when installed) imports torch, 6 s per
#: process on the busy VM, which the processes that do not train would pay for nothing
REMOTE: dict[str, Any] = {**OPTIONS, "backend": "aiobotocore"}
STARTED = time.monotonic()


def mark(phases: dict[str, float], name: str) -> None:
    """Seconds since this process started its main module (where a slow run spent its time)."""
    phases[name] = round(time.monotonic() - STARTED, 3)


def state_of(tag: int, step: int = 1) -> dict[str, Any]:
    return {"w": np.arange(100_000, dtype=np.float32) + 1000 * tag + step, "tag": tag, "step": step}


def same(state: dict[Any, Any], tag: int, step: int = 1) -> bool:
    want = state_of(tag, step)
    return bool(np.array_equal(state["w"], want["w"])) and state["tag"] == tag and state["step"] == step


async def job(out: Path, local: Path, root: str, phases: dict[str, float]) -> None:
    comm = job_comm()  # torch.distributed (initialised in __main__), as a training job has it
    budget = topology.thread_budget()
    async with (
        AsyncCheckpointer(**OPTIONS) as disk,
        AsyncCheckpointer(**REMOTE) as ckpt,
        get_collectives() as coll,
    ):
        rank = coll.rank
        await disk.save_state(str(local / f"rank{rank}.safetensors"), state_of(rank))
        await coll.barrier()  # every rank's node-local save is done before anyone looks
        mark(phases, "saved_local")
        seen = sorted(await asyncio.to_thread(os.listdir, local))
        committed = await save_step(ckpt, root, 1, state_of(rank), coll=coll)
        mark(phases, "committed")
    record = {
        "rank": rank,
        "world": coll.world_size,
        "backend": coll.backend,
        "hostname": socket.gethostname(),
        "local_rank": launcher.local_rank(),
        "local_ranks": topology.local_ranks(),
        "comm": {
            "rank": comm.info.rank,
            "size": comm.info.size,
            "local_rank": comm.info.local_rank,
            "local_size": comm.info.local_size,
            "launcher": comm.info.launcher,
        },
        "budget_local_ranks": budget.local_ranks,
        "group_rank": int(os.environ.get("GROUP_RANK", -1)),  # torchrun's node rank
        "seen_local": seen,
        "committed": committed.objects,
        "phases": phases,
    }
    await asyncio.to_thread((out / f"rank{rank}.json").write_text, json.dumps(record))


async def tiers(out: Path, local: Path, root: str, phase: str) -> None:
    """Steps through a node-local tier drained to ``root``, or a restore from the nearest tier."""
    rank, _ = topology.world()
    peer = phase.endswith("-peer")  # replicate_to_peer=True
    options = REMOTE if root.startswith("s3://") else OPTIONS
    async with CheckpointManager(
        root, local=local, keep_local=1, keep_last=2, replicate_to_peer=peer, **options
    ) as mgr:
        record: dict[str, Any] = {"rank": rank, "hostname": socket.gethostname()}
        if phase == "resume-peer":  # replicas a previous run left unmade: made at start
            await mgr.start()
            await mgr.wait()
        elif phase.startswith("save"):
            for step in (1, 2):  # step 1 remote-committed before step 2's local commit prunes it
                await mgr.maybe_save(step, state_of(rank, step))
                await mgr.wait()
        else:
            into = state_of(rank, 0)
            step = await mgr.restore(into=into)
            record.update(step=step, equal=step is not None and same(into, rank, step))
        assert mgr.stats.tiers is not None
        tier_stats = mgr.stats.tiers.as_dict()
    names = await asyncio.to_thread(lambda: sorted(str(p.relative_to(local)) for p in local.rglob("*")))
    record.update(local=names, tiers=tier_stats)
    await asyncio.to_thread((out / f"tiers-{phase}-{rank}.json").write_text, json.dumps(record))


async def reload(out: Path, root: str, world: int) -> None:
    async with AsyncCheckpointer(**REMOTE) as ckpt:
        step = await latest_step(ckpt, root)
        assert step is not None, f"no committed step under {root}"
        record = await read_commit(ckpt, root, step)
        assert record is not None
        verified = []
        for rank in range(world):  # every object of the step, checked against its checksums on load
            loaded = await ckpt.load_state(f"{step_uri(root, step)}/{rank_object(rank, world)}")
            verified.append(same(loaded.state, rank))
    result = {"step": step, "world": record.world_size, "objects": record.objects, "verified": verified}
    await asyncio.to_thread((out / "reload.json").write_text, json.dumps(result))


async def local_save(local: Path, tag: int) -> None:
    async with AsyncCheckpointer(**OPTIONS) as ckpt:
        await ckpt.save_state(str(local / "state.safetensors"), state_of(tag))


async def local_load(out: Path, local: Path) -> None:
    try:
        async with AsyncCheckpointer(**OPTIONS) as ckpt:
            loaded = await ckpt.load_state(str(local / "state.safetensors"))
        result: dict[str, Any] = {"tag": loaded.state["tag"], "ok": same(loaded.state, loaded.state["tag"])}
    except AsyncCkptError as exc:
        result = {"error": type(exc).__name__, "message": str(exc)}
    result["listing"] = sorted(await asyncio.to_thread(os.listdir, local))
    await asyncio.to_thread(out.write_text, json.dumps(result))


async def put(uri: str, tag: int) -> None:
    async with AsyncCheckpointer(**REMOTE) as ckpt:
        await ckpt.save_state(uri, state_of(tag))


async def check(uri: str, tag: int) -> None:
    async with AsyncCheckpointer(**REMOTE) as ckpt:
        loaded = await ckpt.load_state(uri)
    if not same(loaded.state, tag):
        sys.exit(f"{uri}: not the state of {tag}")


def main(argv: list[str]) -> None:
    mode, args = argv[0], argv[1:]
    if mode == "job" and args[3] == "mpi":
        asyncio.run(job(Path(args[0]), Path(args[1]), args[2], {}))
    elif mode == "job":
        phases: dict[str, float] = {}
        import torch.distributed as dist

        mark(phases, "imported_torch")
        dist.init_process_group("gloo")
        mark(phases, "joined_group")
        try:
            asyncio.run(job(Path(args[0]), Path(args[1]), args[2], phases))
        finally:
            dist.destroy_process_group()
        leave()
    elif mode == "tiers" and args[4] == "mpi":
        asyncio.run(tiers(Path(args[0]), Path(args[1]), args[2], args[3]))
    elif mode == "tiers":
        import torch.distributed as dist

        dist.init_process_group("gloo")
        try:
            asyncio.run(tiers(Path(args[0]), Path(args[1]), args[2], args[3]))
        finally:
            dist.destroy_process_group()
        leave()
    elif mode == "reload":
        asyncio.run(reload(Path(args[0]), args[1], int(args[2])))
    elif mode == "local-save":
        asyncio.run(local_save(Path(args[0]), int(args[1])))
    elif mode == "local-load":
        asyncio.run(local_load(Path(args[0]), Path(args[1])))
    elif mode in ("put", "check"):
        asyncio.run((put if mode == "put" else check)(args[0], int(args[1])))
    else:
        sys.exit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])

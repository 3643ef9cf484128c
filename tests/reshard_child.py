"""One rank of a resharding test: ``python -m tests.reshard_child MODE ROOT OUT``.

``save1d``: a 1-D mesh of every rank saves step 1 through a :class:`CheckpointManager`
(staged): DTensors ``Shard(0)`` with an uneven split, ``Shard(1)`` in bfloat16, ``Replicate``
int64, a NumPy :class:`asyncckpt.Shard`, plain values. ``save2d``: the same tensors on a 2x2
mesh (four ranks), through ``save_step``. ``load``: a 1-D mesh of every rank loads the latest
step into zeroed DTensors and checks each local tensor bit for bit against the same tensor
distributed directly; each rank writes ``OUT/ok-<rank>-of-<world>.json`` (bytes read and
needed), or ``OUT/error-<rank>-of-<world>.txt`` on a checksum mismatch. ``RESHARD_S3``
(JSON: endpoint, key, secret, region) points the checkpointer at an S3 server.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, distribute_tensor
from torch.distributed.tensor import Shard as TShard

from asyncckpt import AsyncCheckpointer, CheckpointManager, ChecksumMismatchError, Shard
from tests.torch_exit import leave

CHUNK = 8 << 20


def full() -> dict[str, Any]:
    g = torch.Generator().manual_seed(11)
    return {
        "a": torch.randn(7, 5, generator=g),  # 7 rows: uneven on 2, 3 and 4 ranks
        "b": torch.randn(6, 9, generator=g).to(torch.bfloat16),  # 9 columns: uneven
        "c": torch.arange(5, dtype=torch.int64) * 1000 + 7,
        "n": np.arange(40, dtype=np.float64).reshape(10, 4) / 3,
    }


def rows(n: int, rank: int, world: int) -> tuple[int, int]:
    cuts = np.array_split(np.arange(n), world)[rank]
    return (int(cuts[0]) if len(cuts) else n, len(cuts))


def state(mesh: Any, two_d: bool, zero: bool) -> dict[str, Any]:
    f = full()
    if zero:
        f = {
            k: (torch.zeros_like(v) if isinstance(v, torch.Tensor) else np.zeros_like(v))
            for k, v in f.items()
        }
    rank, world = dist.get_rank(), dist.get_world_size()
    if two_d:
        placements = {
            "a": [TShard(0), TShard(1)],
            "b": [Replicate(), TShard(1)],
            "c": [Replicate(), Replicate()],
        }
    else:
        placements = {"a": [TShard(0)], "b": [TShard(1)], "c": [Replicate()]}
    start, count = rows(10, rank, world)
    model = {k: distribute_tensor(f[k], mesh, placements[k]) for k in ("a", "b", "c")}
    return {
        "model": model,
        "n": Shard((10, 4), (start, 0), np.ascontiguousarray(f["n"][start : start + count])),
        "plain": torch.arange(4) if not zero else torch.zeros(4, dtype=torch.int64),
        "step": 0 if zero else 3,
    }


def checkpointer() -> AsyncCheckpointer:
    s3 = os.environ.get("RESHARD_S3")
    if s3 is None:
        return AsyncCheckpointer(chunk_size=CHUNK, num_buffers=3)
    o = json.loads(s3)
    options = {"endpoint_url": o["endpoint"], "access_key_id": o["key"], "secret_access_key": o["secret"]}
    options |= {"region": o["region"], "dotenv": False}
    return AsyncCheckpointer(chunk_size=CHUNK, num_buffers=3, backend="aiobotocore", backend_options=options)


async def run(mode: str, root: str, out: Path) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    two_d = mode == "save2d"
    mesh = init_device_mesh("cpu", (2, 2) if two_d else (world,))
    async with checkpointer() as c:
        if mode == "save2d":
            await c.save_step(root, 1, state(mesh, two_d, zero=False))
            return
        if mode == "save1d":  # through a manager (a staged save): item 6 restores it elsewhere
            async with CheckpointManager(root, every_n_steps=1, checkpointer=c) as mgr:
                await mgr.maybe_save(1, state(mesh, two_d, zero=False))
            return
        want = state(mesh, False, zero=False)  # every rank takes part in torch's collectives
        into = state(mesh, False, zero=True)
        try:
            got = await c.load_step(root, into=into)
        except ChecksumMismatchError as exc:
            (out / f"error-{rank}-of-{world}.txt").write_text(f"{exc.offset} {exc}")
            return
    for k in ("a", "b", "c"):
        mine, ref = into["model"][k].to_local(), want["model"][k].to_local()
        assert mine.dtype == ref.dtype and torch.equal(mine, ref), (rank, k, mine, ref)
    assert np.array_equal(into["n"].data, want["n"].data), (rank, into["n"], want["n"])
    assert torch.equal(into["plain"], want["plain"]) and got.state["step"] == 3 and into["step"] == 3
    assert got.reads is not None
    facts = {"read": got.reads.read, "needed": got.reads.needed, "objects": len(got.reads.objects)}
    (out / f"ok-{rank}-of-{world}.json").write_text(json.dumps(facts))


def main() -> None:
    mode, root, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    dist.init_process_group("gloo")
    try:
        asyncio.run(run(mode, root, out))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
    leave()

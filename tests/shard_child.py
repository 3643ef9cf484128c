"""One rank of a sharded-step test: ``python -m tests.shard_child MODE ROOT``.

``overlap``: rank ``r`` saves step 1 with ``Shard((4,), (r,), 2 values)``: the boxes
``[0, 2)`` and ``[1, 3)`` overlap (and their sizes sum to the global 4); each rank writes the
error it got (or ``committed``) to ``ROOT/result-<r>.txt``.

``restore``: two ranks save step 1 of DTensors (``Shard(0)`` rows, ``Replicate``), an explicit
:class:`Shard`, a plain tensor and a value that differ per rank, then load it back on the same
two ranks: into DTensors, into whole tensors, and one object with ``load_state`` into
DTensors/Shards. Each rank asserts what it got and writes ``ROOT/result-<r>.json``.

``hf``: two ranks save step 1 of DTensors (``Shard(0)``, ``Shard(1)``, ``Replicate``) and an
explicit :class:`Shard`, then ``dcp.load`` it with DCP's ``HuggingFaceStorageReader`` into
zeroed DTensors of the same placements; each rank asserts its local tensors.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, distribute_tensor
from torch.distributed.tensor import Shard as TShard

from asyncckpt import AsyncCheckpointer, ConfigError, Shard
from tests.torch_exit import leave

A = torch.arange(12, dtype=torch.float32).reshape(4, 3)
C = torch.arange(5, dtype=torch.int64) + 100
N = np.arange(4, dtype=np.float64) / 3


async def overlap(root: Path) -> None:
    rank = dist.get_rank()
    async with AsyncCheckpointer(chunk_size=1 << 20, num_buffers=3) as ckpt:
        try:
            await ckpt.save_step(root / "run", 1, {"x": Shard((4,), (rank,), np.arange(2.0) + 10 * rank)})
            text = "committed"
        except Exception as exc:  # what each rank was told, for the test to read
            text = f"{type(exc).__name__}: {exc}"
    (root / f"result-{rank}.txt").write_text(text)


def sharded(mesh: Any, zero: bool) -> dict[str, Any]:
    rank = dist.get_rank()
    a, c, n = (torch.zeros_like(A), torch.zeros_like(C), np.zeros_like(N)) if zero else (A, C, N)
    return {
        "a": distribute_tensor(a, mesh, [TShard(0)]),
        "c": distribute_tensor(c, mesh, [Replicate()]),
        "n": Shard((4,), (2 * rank,), np.ascontiguousarray(n[2 * rank : 2 * rank + 2])),
        "p": torch.zeros(2) if zero else torch.full((2,), float(rank)),
        "rank": -1 if zero else rank,
    }


async def restore(root: Path) -> None:
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    facts: dict[str, Any] = {}
    async with AsyncCheckpointer(chunk_size=1 << 20, num_buffers=3) as ckpt:
        await ckpt.save_step(root / "run", 1, sharded(mesh, zero=False))
        into = sharded(mesh, zero=True)
        got = await ckpt.load_step(root / "run", into=into)
        assert torch.equal(into["a"].to_local(), A[2 * rank : 2 * rank + 2]), into["a"]
        assert torch.equal(into["c"].to_local(), C), into["c"]
        assert np.array_equal(into["n"].data, N[2 * rank : 2 * rank + 2]), into["n"]
        facts["dtensor"] = {"p": into["p"].tolist(), "rank": into["rank"], "state_rank": got.state["rank"]}
        whole = {"a": torch.zeros(4, 3), "c": torch.zeros(5, dtype=torch.int64), "n": np.zeros(4)}
        whole |= {"p": torch.zeros(2), "rank": -1}
        got = await ckpt.load_step(root / "run", into=whole)
        assert torch.equal(whole["a"], A) and torch.equal(whole["c"], C) and np.array_equal(whole["n"], N)
        facts["whole"] = {"p": whole["p"].tolist(), "rank": whole["rank"]}
        into = sharded(mesh, zero=True)
        uri = root / "run" / "step-1" / f"rank-{rank}-of-2.safetensors"
        try:
            got_state = await ckpt.load_state(uri, into=into)
            assert got_state.state["a"] is into["a"]
            assert torch.equal(into["a"].to_local(), A[2 * rank : 2 * rank + 2]), into["a"]
            assert np.array_equal(into["n"].data, N[2 * rank : 2 * rank + 2]), into["n"]
            facts["load_state"] = "ok"
        except ConfigError as exc:
            facts["load_state"] = str(exc)
        other = Shard((4,), (2 * (1 - rank),), np.zeros(2))  # the other rank's box
        try:
            await ckpt.load_state(uri, into={"n": other}, keys=["n"])
            facts["other_box"] = other.data.tolist()
        except ConfigError as exc:
            facts["other_box"] = str(exc)
    (root / f"result-{rank}.json").write_text(json.dumps(facts))


def hf_state(mesh: Any, zero: bool) -> dict[str, Any]:
    rank = dist.get_rank()
    a, c, n = (torch.zeros_like(A), torch.zeros_like(C), np.zeros_like(N)) if zero else (A, C, N)
    return {
        "a": distribute_tensor(a, mesh, [TShard(0)]),
        "b": distribute_tensor(a.T.contiguous(), mesh, [TShard(1)]),
        "c": distribute_tensor(c, mesh, [Replicate()]),
        "n": Shard((4,), (2 * rank,), torch.from_numpy(np.ascontiguousarray(n[2 * rank : 2 * rank + 2]))),
    }


async def hf(root: Path) -> None:
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    async with AsyncCheckpointer(chunk_size=1 << 20, num_buffers=3) as ckpt:
        await ckpt.save_step(root / "run", 1, hf_state(mesh, zero=False))
    want = hf_state(mesh, zero=False)
    into = hf_state(mesh, zero=True)
    dtensors = {k: into[k] for k in ("a", "b", "c")}
    dcp.load(dtensors, storage_reader=dcp.HuggingFaceStorageReader(str(root / "run" / "step-1")))
    for k in ("a", "b", "c"):
        assert torch.equal(into[k].to_local(), want[k].to_local()), (k, into[k], want[k])


def main() -> None:
    mode, root = sys.argv[1], Path(sys.argv[2])
    dist.init_process_group("gloo")
    try:
        asyncio.run({"overlap": overlap, "restore": restore, "hf": hf}[mode](root))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
    leave()

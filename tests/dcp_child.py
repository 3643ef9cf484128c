"""One rank of a 2-process DCP run: ``python -m tests.dcp_child MODE ROOT`` under torchrun (gloo).

``roundtrip``: save a sharded + replicated state to ROOT/a through asyncckpt, load it back
into zeroed tensors of the same sharding, and check every value on every rank; the same
with ``dcp.async_save`` to ROOT/b; then load
ROOT/full (one unsharded save) into the sharded layout (each rank narrows its rows out).
``crash``: save ROOT/prev completely, then start ROOT/partial; rank 1 SIGKILLs itself once
its object is partly written (after its first chunk, once rank 0's object is committed), in
the middle of the save.
"""

from __future__ import annotations

import os
import signal
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from asyncckpt.integrations.dcp import AsyncCkptStorageReader, AsyncCkptStorageWriter
from tests.torch_exit import leave

CHUNK = 1 << 20
ROWS, COLS = 2048, 512  # 4 MiB of float32: each rank's 2 MiB shard spans two chunks


def expected() -> dict[str, Any]:
    """The full (unsharded) state every rank derives from the same seed."""
    g = torch.Generator().manual_seed(1234)
    return {
        "sharded": torch.randn(ROWS, COLS, generator=g),
        "replicated": torch.randn(300, generator=g).to(torch.bfloat16),
        "optim": {"step": torch.tensor(11.0), "exp_avg": torch.randn(64, 8, generator=g)},
        "epoch": 7,
    }


def sharded_state(mesh: Any, zero: bool) -> dict[str, Any]:
    full = expected()
    state = {k: (torch.zeros_like(v) if zero and isinstance(v, torch.Tensor) else v) for k, v in full.items()}
    state["optim"] = {k: torch.zeros_like(v) if zero else v for k, v in full["optim"].items()}
    if zero:
        state["epoch"] = 0
    state["sharded"] = distribute_tensor(state["sharded"], mesh, [Shard(0)])
    return state


def main(mode: str, root: Path) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    with AsyncCkptStorageWriter(root / ("a" if mode == "roundtrip" else "prev"), chunk_size=CHUNK) as w:
        dcp.save(sharded_state(mesh, zero=False), storage_writer=w)
    if mode == "roundtrip":
        into = sharded_state(mesh, zero=True)
        with AsyncCkptStorageReader(root / "a", chunk_size=CHUNK) as r:
            dcp.load(into, storage_reader=r)
        want = sharded_state(mesh, zero=False)
        assert isinstance(into["sharded"], DTensor)
        assert torch.equal(into["sharded"].to_local(), want["sharded"].to_local()), rank
        assert torch.equal(into["replicated"], want["replicated"]), rank
        assert all(torch.equal(into["optim"][k], want["optim"][k]) for k in want["optim"]), rank
        assert into["epoch"] == 7, into["epoch"]
        with AsyncCkptStorageWriter(root / "b", chunk_size=CHUNK) as w:  # async_save: DCP's own thread
            dcp.async_save(sharded_state(mesh, zero=False), storage_writer=w).result()
        again = sharded_state(mesh, zero=True)
        with AsyncCkptStorageReader(root / "b", chunk_size=CHUNK) as r:
            dcp.load(again, storage_reader=r)
        assert torch.equal(again["sharded"].to_local(), want["sharded"].to_local()), rank
        assert torch.equal(again["replicated"], want["replicated"]) and again["epoch"] == 7, rank
        if (root / "full").exists():  # saved unsharded by one process: each rank reads its slice
            resharded = sharded_state(mesh, zero=True)
            with AsyncCkptStorageReader(root / "full", chunk_size=CHUNK) as r:
                dcp.load(resharded, storage_reader=r)
            assert torch.equal(resharded["sharded"].to_local(), want["sharded"].to_local()), rank
        print(f"rank {rank}: loaded", flush=True)
    else:
        # Rank 1 dies only once rank 0's object is committed, so the run's ending is fixed:
        # rank 0's object stands, rank 1's temporary is left torn. (Unordered, rank 0 could
        # open its object after rank 1 had died and rightly remove the dead rank's temporary.)
        store = dist.FileStore(str(root / "order"), 2)
        store.set_timeout(timedelta(seconds=60))

        def die_midway(done: int) -> None:
            if rank == 1 and done >= CHUNK:
                store.wait(["rank 0 committed"])
                os.kill(os.getpid(), signal.SIGKILL)

        class Rank0Signals(AsyncCkptStorageWriter):
            def write_data(self, plan: Any, planner: Any) -> Any:
                done = super().write_data(plan, planner)
                if rank == 0:
                    done.add_done_callback(lambda _: store.set("rank 0 committed", "1"))
                return done

        with Rank0Signals(root / "partial", chunk_size=CHUNK, progress=die_midway) as w:
            dcp.save(sharded_state(mesh, zero=False), storage_writer=w)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
    leave()

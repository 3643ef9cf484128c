"""One rank of DCP's process-based ``async_save``: ``python -m tests.dcp_process_child ROOT``.

Under torchrun (2 ranks, gloo). Saves the sharded + replicated state of ``tests.dcp_child``
with ``async_save(..., async_checkpointer_type=PROCESS)`` and asyncckpt's writer three times:
ROOT/p1 and ROOT/p2 (DCP's default stager; the second save reuses the checkpoint daemon and
the writer), ROOT/p3 with a ``DefaultStager`` in shared memory, staged in the background; then
loads each back into zeroed tensors of the same sharding and checks every value. DCP's daemon
is a spawned process that imports this module again: everything runs under ``__main__``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
from torch.distributed.device_mesh import init_device_mesh

from asyncckpt.integrations.dcp import AsyncCkptStorageReader, AsyncCkptStorageWriter

from .dcp_child import CHUNK, sharded_state


def check(root: Path, mesh: object) -> None:
    into = sharded_state(mesh, zero=True)
    with AsyncCkptStorageReader(root, chunk_size=CHUNK) as reader:
        dcp.load(into, storage_reader=reader)
    want = sharded_state(mesh, zero=False)
    assert torch.equal(into["sharded"].to_local(), want["sharded"].to_local()), root
    assert torch.equal(into["replicated"], want["replicated"]) and into["epoch"] == 7, root
    assert all(torch.equal(into["optim"][k], want["optim"][k]) for k in want["optim"]), root


def main(root: Path) -> None:
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    process = AsyncCheckpointerType.PROCESS
    with AsyncCkptStorageWriter(root / "p1", chunk_size=CHUNK) as writer:
        for name in ("p1", "p2"):
            state = sharded_state(mesh, zero=False)
            future = dcp.async_save(
                state, storage_writer=writer, checkpoint_id=root / name, async_checkpointer_type=process
            )
            future.result()
        stager = DefaultStager(StagingOptions(False, True, True, False))
        response = dcp.async_save(
            sharded_state(mesh, zero=False), storage_writer=writer, checkpoint_id=root / "p3",
            async_checkpointer_type=process, async_stager=stager,
        )  # fmt: skip
        response.staging_completion.result()
        response.upload_completion.result()
        stager.close()
    for name in ("p1", "p2", "p3"):
        check(root / name, mesh)
    print(f"rank {dist.get_rank()}: loaded", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))

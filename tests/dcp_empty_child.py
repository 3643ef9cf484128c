"""One rank of a DCP save where rank 1 has nothing to write: ``python -m tests.dcp_empty_child ROOT``.

Both ranks hold the same ``w`` (DCP's planner gives it to one rank) and an empty tensor of
their own, ``e<rank>``: rank 1's plan has one item of 0 bytes, so it writes no object.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from asyncckpt.integrations.dcp import AsyncCkptStorageWriter
from tests.torch_exit import leave


def main(root: str) -> None:
    dist.init_process_group("gloo")
    try:
        rank = dist.get_rank()
        with AsyncCkptStorageWriter(root, chunk_size=1 << 20) as writer:
            dcp.save({"w": torch.arange(10.0), f"e{rank}": torch.zeros(0)}, storage_writer=writer)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
    leave()

"""One rank of a sharded-step test: ``python -m tests.shard_child MODE ROOT``.

``overlap``: rank ``r`` saves step 1 with ``Shard((4,), (r,), 2 values)``: the boxes
``[0, 2)`` and ``[1, 3)`` overlap (and their sizes sum to the global 4); each rank writes the
error it got (or ``committed``) to ``ROOT/result-<r>.txt``.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import numpy as np
import torch.distributed as dist

from asyncckpt import AsyncCheckpointer, Shard


async def overlap(root: Path) -> None:
    rank = dist.get_rank()
    async with AsyncCheckpointer(chunk_size=1 << 20, num_buffers=3) as ckpt:
        try:
            await ckpt.save_step(root / "run", 1, {"x": Shard((4,), (rank,), np.arange(2.0) + 10 * rank)})
            text = "committed"
        except Exception as exc:  # what each rank was told, for the test to read
            text = f"{type(exc).__name__}: {exc}"
    (root / f"result-{rank}.txt").write_text(text)


def main() -> None:
    mode, root = sys.argv[1], Path(sys.argv[2])
    dist.init_process_group("gloo")
    try:
        asyncio.run({"overlap": overlap}[mode](root))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

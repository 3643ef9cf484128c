"""One rank of a 2-process step that stock tools open: ``python -m tests.hf_child ROOT``.

Step 1: rank ``r`` saves every other tensor of ``ROOT/ref.safetensors`` (a tiny model's
weights, written by the test), nested by the first part of each name (``model.layers.0.w``
becomes ``{"model": {"layers.0.w": t}}``: the saved names are the dotted paths again), plus a
non-tensor ``step``. Step 2: first saved with distinct names (an index is written), then saved
again with the same name on both ranks: the index of the first save must not survive.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import torch.distributed as dist
from safetensors.torch import load_file

from asyncckpt import AsyncCheckpointer
from asyncckpt.node.collectives import get_collectives
from tests.torch_exit import leave


def nested(flat: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, tensor in flat.items():
        head, _, rest = name.partition(".")
        out.setdefault(head, {})[rest] = tensor
    return out


async def main(root: Path) -> None:
    ref = load_file(root / "ref.safetensors")
    async with AsyncCheckpointer(chunk_size=1 << 20, num_buffers=4) as ckpt, get_collectives() as coll:
        names = sorted(ref)[coll.rank :: coll.world_size]
        await ckpt.save_step(root / "run", 1, {**nested({k: ref[k] for k in names}), "step": 1})
        await ckpt.save_step(root / "run", 2, {f"w{coll.rank}": ref[names[0]]})
        await ckpt.save_step(root / "run", 2, {"w": ref[names[0]]})  # each rank its own "w"


if __name__ == "__main__":
    dist.init_process_group("gloo")
    try:
        asyncio.run(main(Path(sys.argv[1])))
    finally:
        dist.destroy_process_group()
    leave()

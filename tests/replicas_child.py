"""One rank of a replica ring on one machine: ``python -m tests.replicas_child BASE MODE``.

Each rank stands for a node: its local tier is ``BASE/node-<rank>``. Every rank saves its state
object of step 1 there, then :func:`asyncckpt.replicas.transfer` sends it to the next rank
(``to[r] = r + 1 mod world``) and receives the previous rank's. ``ok``: every replica is
published. ``corrupt``: rank 0 flips one byte of its object's data before the transfer; rank 1
must publish nothing (and say where), the other replicas must still be published. ``big``:
two ranks, eight rounds, each rank's pid in ``BASE/pid-<rank>`` (the test kills one mid-way);
``again``: the same objects once more, into the directories a killed ``big`` run left.
Each rank writes ``BASE/result-<rank>.json``: what it sent, received, the error if any and the
names in its node's step directory.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from asyncckpt import AsyncCheckpointer
from asyncckpt.node.collectives import get_collectives
from asyncckpt.replicas import PIECE, transfer
from asyncckpt.steps import rank_object, step_uri
from tests.torch_exit import leave

#: a little over two rounds of the ring, so that the corrupt byte lands in a middle round
ELEMENTS = (2 * PIECE + PIECE // 2) // 4


#: ``big``: eight rounds, so that a kill once the replica's temporary exists lands mid-way
BIG = 8 * PIECE // 4


def state_of(rank: int, elements: int = ELEMENTS) -> dict[str, Any]:
    return {"w": np.arange(elements, dtype=np.float32) + 1000 * rank}


def flip(path: str, offset: int) -> None:
    """Invert one byte of the file at ``path``: a local copy corrupted after its save."""
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


async def main(base: Path, mode: str) -> None:
    async with get_collectives() as coll, AsyncCheckpointer(chunk_size=1 << 20, num_buffers=4) as ckpt:
        rank, world = coll.rank, coll.world_size
        to = [(r + 1) % world for r in range(world)]
        source = to.index(rank)
        step = step_uri(str(base / f"node-{rank}"), 1)
        mine = f"{step}/{rank_object(rank, world)}"
        os.makedirs(step, exist_ok=mode == "again")
        elements = BIG if mode in ("big", "again") else ELEMENTS
        await ckpt.save_state(mine, state_of(rank, elements))
        if mode == "big":  # the test stops and kills ranks by these
            (base / f"pid-{rank}").write_text(str(os.getpid()))
        if mode == "corrupt" and rank == 0:
            await asyncio.to_thread(flip, mine, PIECE + 12345)  # in the ring's second round
        result: dict[str, Any] = {"rank": rank}
        try:
            moved = await transfer(ckpt, coll, to, send=mine, recv=f"{step}/{rank_object(source, world)}")
        except Exception as exc:
            result["error"] = [type(exc).__name__, str(exc), getattr(exc, "offset", None)]
        else:
            result.update(sent=moved.sent, received=moved.received)
            loaded = await ckpt.load_state(f"{step}/{rank_object(source, world)}")
            result["equal"] = bool(np.array_equal(loaded.state["w"], state_of(source, elements)["w"]))
        result["names"] = sorted(os.listdir(step))
        (base / f"result-{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    if sys.argv[3:] == ["torch"]:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        try:
            asyncio.run(main(Path(sys.argv[1]), sys.argv[2]))
        finally:
            dist.destroy_process_group()
        leave()
    else:
        asyncio.run(main(Path(sys.argv[1]), sys.argv[2]))

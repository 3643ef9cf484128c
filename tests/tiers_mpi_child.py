"""One rank of a two-"node" tiered run: ``python -m tests.tiers_mpi_child BASE MODE``.

Each rank stands for a node of its own: its local tier is ``BASE/node-<rank>`` and it is the
first (only) rank of that node (``LOCAL_RANK=0``); the remote root ``BASE/remote`` is shared.
``save``: steps 1-3 with ``keep_local=1`` and ``keep_last=2``; each rank writes its tier stats to
``BASE/stats-<rank>.json``. ``restore``: the newest step, loaded in place; each rank writes
``BASE/restored-<rank>.json`` (step, tier and why, whether the arrays are the saved ones).
``outage``: step 4 with the remote root under the file ``BASE/blocker`` (committed locally
only); ``resume``: start with that root listable again, and write ``BASE/resumed-<rank>.json``.
``restore-blind``: the same as ``restore``, but rank 1 reaches the remote through a symlink that it replaces
by a file once its manager is made: it cannot list the remote, rank 0 can.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from asyncckpt import CheckpointManager
from asyncckpt.node.topology import world

OPTIONS: dict[str, Any] = {"chunk_size": 1 << 20, "num_buffers": 4}


def state_of(rank: int, step: int) -> dict[str, Any]:
    return {"w": np.arange(400_000, dtype=np.float32) + 1000 * rank + step, "step": step}


async def main(base: Path, mode: str) -> None:
    rank, _ = world()
    local = base / f"node-{rank}"
    local.mkdir(exist_ok=True)
    remote = base / ("blocker/remote" if mode in ("outage", "resume") else "remote")
    if mode == "restore-blind" and rank == 1:
        remote = base / "remote-of-rank-1"
        remote.symlink_to(base / "remote")
    mgr = CheckpointManager(remote, local=local, keep_local=1, keep_last=2, **OPTIONS)
    if remote.is_symlink():  # the root check passed; now this rank cannot list it
        remote.unlink()
        remote.write_text("")
    async with mgr:
        if mode == "outage":  # BASE/blocker is a file: step 4 commits locally, its drain fails
            await mgr.maybe_save(4, state_of(rank, 4))
            await mgr.wait()
            return
        if mode == "resume":
            await mgr.start()
            await mgr.wait()
            assert mgr.stats.tiers is not None
            (base / f"resumed-{rank}.json").write_text(json.dumps(mgr.stats.tiers.resumed))
            return
        if mode == "save":
            for step in (1, 2, 3):
                await mgr.maybe_save(step, state_of(rank, step))
                await mgr.wait()
            assert mgr.stats.tiers is not None
            (base / f"stats-{rank}.json").write_text(json.dumps(mgr.stats.tiers.as_dict()))
            return
        into = state_of(rank, 0)
        step = await mgr.restore(into=into)
        assert mgr.stats.tiers is not None
        equal = step is None or bool(np.array_equal(into["w"], state_of(rank, step)["w"]))
        record = {"step": step, "from": mgr.stats.tiers.restored_from, "equal": equal}
        (base / f"restored-{rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    os.environ["LOCAL_RANK"] = "0"  # each rank is the only one on its "node" (a test stand-in)
    asyncio.run(main(Path(sys.argv[1]), sys.argv[2]))

"""One rank of a step test: ``python -m tests.steps_child ROOT MODE [torch]``.

``ok``: save step 1 of two ranks and load it back (each rank writes ``ROOT/loaded-<r>.json``).
``crash``: commit step 1, then in step 2 rank 1 SIGKILLs itself once its object is durable,
before the ranks agree the step is complete; rank 0 waits in the all-gather until the
launcher tears the job down. Step 2 must stay uncommitted. ``fail``: rank 1's state of step 2
cannot be saved; each rank writes the error it got to ``ROOT/error-<r>.txt``. ``failsame``: the
same, saving step 1 again; then each rank loads step 1 (``ROOT/loaded-<r>.json``). ``commitfail``:
every object of step 2 is saved but rank 0 cannot write its index (a directory holds the
name); each rank writes the error it got to ``ROOT/error-<r>.txt``.
``policies``: a manager with ``every_seconds`` is refused on each rank (``ROOT/error-<r>.txt``);
one with ``every_n_steps`` and ``best_n`` saves steps 1 and 2 with metrics.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import numpy as np

from asyncckpt import AsyncCheckpointer, CheckpointManager
from asyncckpt.errors import ConfigError
from asyncckpt.node.collectives import get_collectives
from asyncckpt.node.topology import world
from asyncckpt.state.index import INDEX
from asyncckpt.steps import save_step, start_step
from tests.torch_exit import leave


def state_of(rank: int, step: int) -> dict[str, object]:
    return {"w": np.arange(50_000, dtype=np.float32) + 1000 * rank + step, "step": step, "rank": rank}


async def policies(root: Path) -> None:
    options: dict[str, int] = {"chunk_size": 1 << 20, "num_buffers": 4}
    rank, _ = world()
    timed = CheckpointManager(root, every_seconds=60, **options)
    try:
        await timed.start()
    except ConfigError as exc:
        (root / f"error-{rank}.txt").write_text(str(exc))
    finally:
        await timed.aclose()
    async with CheckpointManager(root, best_n=1, best_metric="loss", **options) as mgr:
        for step, loss in ((1, 0.5), (2, 0.7)):
            await mgr.maybe_save(step, state_of(rank, step), metrics={"loss": loss})


async def main(root: Path, mode: str) -> None:
    if mode == "policies":
        await policies(root)
        return
    async with AsyncCheckpointer(chunk_size=1 << 20, num_buffers=4) as ckpt, get_collectives() as coll:
        await ckpt.save_step(root, 1, state_of(coll.rank, 1))
        if mode == "ok":
            loaded = await ckpt.load_step(root)
            w = loaded.state["w"]
            ok = bool(np.array_equal(w, state_of(coll.rank, 1)["w"]))
            record = {"step": loaded.step, "rank": loaded.state["rank"], "equal": ok}
            (root / f"loaded-{coll.rank}.json").write_text(json.dumps(record))
            return
        if mode == "fail":  # rank 1's state cannot be saved: both ranks must hear of it, none hang
            bad = {"z": np.zeros(3, np.complex128)} if coll.rank == 1 else state_of(0, 2)
            try:
                await save_step(ckpt, root, 2, bad, coll=coll)
            except Exception as exc:
                (root / f"error-{coll.rank}.txt").write_text(f"{type(exc).__name__}: {exc}")
            return
        if mode == "failsame":  # step 1 saved again, rank 1's state refused: step 1 stays committed
            bad = {"z": np.zeros(3, np.complex128)} if coll.rank == 1 else state_of(0, 1)
            try:
                await save_step(ckpt, root, 1, bad, coll=coll)
            except Exception as exc:
                (root / f"error-{coll.rank}.txt").write_text(f"{type(exc).__name__}: {exc}")
            loaded = await ckpt.load_step(root, 1)
            ok = bool(np.array_equal(loaded.state["w"], state_of(coll.rank, 1)["w"]))
            (root / f"loaded-{coll.rank}.json").write_text(json.dumps({"step": loaded.step, "equal": ok}))
            return
        if mode == "commitfail":  # rank 0 cannot publish the index: no rank may wait for it
            if coll.rank == 0:
                (root / "step-2" / INDEX).mkdir(parents=True)
            try:
                await save_step(ckpt, root, 2, state_of(coll.rank, 2), coll=coll)
            except Exception as exc:
                (root / f"error-{coll.rank}.txt").write_text(f"{type(exc).__name__}: {exc}")
            return
        commit = await start_step(ckpt, root, 2, state_of(coll.rank, 2), coll=coll)
        if coll.rank == 1:  # its object is durable; the step is not committed yet
            os.kill(os.getpid(), signal.SIGKILL)
        await commit  # rank 0: never returns, the launcher kills it when rank 1 dies


if __name__ == "__main__":
    if sys.argv[3:] == ["torch"]:
        import torch.distributed as dist

        dist.init_process_group("gloo")
    asyncio.run(main(Path(sys.argv[1]), sys.argv[2]))
    if sys.argv[3:] == ["torch"]:
        leave()

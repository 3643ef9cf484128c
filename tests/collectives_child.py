"""One rank of a collectives test: ``python -m tests.collectives_child OUT_DIR [torch]``.

Under torchrun (``torch``) it first initialises a gloo process group; under mpirun mpi4py is
the transport. Rank 1 reaches the barrier late, so rank 0 waits in it: its event loop must keep
turning meanwhile. Each rank writes what it saw to ``OUT_DIR/rank<r>.json``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

from asyncckpt.engine.monitor import LoopMonitor
from asyncckpt.node.collectives import get_collectives
from tests.torch_exit import leave

LATE_S = 0.5  # how late rank 1 arrives: long against the 10 ms ticks counted below


async def main(out: Path) -> None:
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    async with get_collectives() as coll, LoopMonitor(0.01) as monitor:
        ticker = asyncio.create_task(tick())
        if coll.rank == 1:
            time.sleep(LATE_S)  # noqa: ASYNC251 - a rank busy elsewhere; rank 0's loop is the one watched
        t0, ticks_before = time.monotonic(), ticks
        await coll.barrier()
        waited, ticked = time.monotonic() - t0, ticks - ticks_before
        got = await coll.broadcast_object({"from": coll.rank, "uri": f"s3://b/step-{coll.rank}"}, src=1)
        gathered = await coll.all_gather_object(coll.rank * 10)
        ticker.cancel()
    record = {
        "backend": coll.backend,
        "rank": coll.rank,
        "world": coll.world_size,
        "broadcast": got,
        "gathered": gathered,
        "barrier_s": waited,
        "ticks_in_barrier": ticked,
        "loop_lag_s": monitor.lag(),
    }
    (out / f"rank{coll.rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    if sys.argv[2:] == ["torch"]:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        asyncio.run(main(Path(sys.argv[1])))
        dist.destroy_process_group()
        leave()
    else:
        asyncio.run(main(Path(sys.argv[1])))

"""A training loop a test preempts: ``python -m tests.preempt_child ROOT ON_PREEMPT DEADLINE [torch]``.

Each rank (one, or several under mpirun) talks to the test through two FIFOs the test made,
``ROOT/up-<rank>`` (the rank writes ``<pid> <step>`` before each ``maybe_save``) and
``ROOT/go-<rank>`` (it reads one line before going on), so the test signals it at a chosen
step; once the signal handler ran, the rank writes ``noted`` (``mgr.wait_preempted()``).
The state of step ``s`` on rank ``r`` is :func:`state_of` (r, s). ``ROOT/result-<rank>.json``
gets what ended the loop (the error, the exit code) and ``mgr.stats.preempted``.
``ON_PREEMPT/sync`` (``exit/sync``): each step is synchronous (the rank blocks on ``go`` without
awaiting, so the signal arrives while no event loop runs) and the rank does not wait for the
handler to report ``noted``.
``ON_PREEMPT+TIER`` (``exit+fast``, ``exit+slow``, ``exit+outage``): a tiered manager, its local
tier ``ROOT/local``, its remote ``ROOT/run`` (``fast``), the same capped at 2 kB/s so a drain
outlasts any deadline (``slow``), or under the file ``ROOT/blocker`` (``outage``: drains fail).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from asyncckpt import CheckpointManager
from asyncckpt.errors import PreemptedError
from asyncckpt.node.topology import world
from tests.torch_exit import leave


def state_of(rank: int, step: int) -> dict[str, Any]:
    rng = np.random.default_rng(1000 * rank + step)  # every step's bytes differ
    return {"w": rng.standard_normal(60_000).astype(np.float32), "step": step, "rank": rank}


async def train(root: Path, on_preempt: str, deadline: float, up: TextIO, go: TextIO) -> dict[str, Any]:
    rank = world()[0]
    options: dict[str, Any] = {"chunk_size": 1 << 20, "num_buffers": 4}
    on_preempt, _, kind = on_preempt.partition("/")
    on_preempt, _, tier = on_preempt.partition("+")
    remote = root / "run"
    if tier:
        (root / "local").mkdir(exist_ok=True)
        options.update(local=root / "local", keep_local=2)
    if tier == "slow":
        options["drain_bandwidth"] = 2_000
    if tier == "outage":
        (root / "blocker").write_text("")
        remote = root / "blocker" / "run"
    result: dict[str, Any] = {}
    mgr = CheckpointManager(
        remote,
        every_n_steps=2,
        save_on_signal=(signal.SIGTERM,),
        preempt_deadline_s=deadline,
        on_preempt=on_preempt,
        **options,
    )

    async def report_signal() -> None:  # lets the test go on only once the handler ran
        await mgr.wait_preempted()
        up.write("noted\n")
        up.flush()

    try:
        async with mgr:
            watcher = asyncio.create_task(report_signal() if kind != "sync" else asyncio.sleep(0))
            for step in range(1, 1000):
                up.write(f"{os.getpid()} {step}\n")
                up.flush()
                if kind == "sync":  # a training step that never awaits: no event loop runs
                    go.readline()
                else:
                    await asyncio.to_thread(go.readline)  # the test may signal us meanwhile
                if await mgr.maybe_save(step, state_of(rank, step)) and mgr.preempted:
                    result["returned"] = step  # on_preempt="continue"
                    break
        watcher.cancel()
    except PreemptedError as exc:
        result["error"] = {"type": type(exc).__name__, "step": exc.step, "signum": exc.signum}
        result["error"]["text"] = str(exc)
    except SystemExit as exc:
        result["exit"] = exc.code
        raise
    finally:
        record = mgr.stats.preempted
        result["record"] = None if record is None else dataclasses.asdict(record)
        result["saved"] = mgr.stats.saved
        tiers = mgr.stats.tiers
        result["tiers"] = None if tiers is None else tiers.as_dict()
        result["handler_back"] = signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
        (root / f"result-{rank}.json").write_text(json.dumps(result))
    return result


if __name__ == "__main__":
    here, mode = Path(sys.argv[1]), sys.argv[2]
    limit = float(sys.argv[3]) if len(sys.argv) > 3 else 30.0
    if sys.argv[4:] == ["torch"]:  # under torchrun: the job's own process group
        import torch.distributed as dist

        dist.init_process_group("gloo")
    me = world()[0]
    with open(here / f"up-{me}", "w") as to_test, open(here / f"go-{me}") as from_test:
        asyncio.run(train(here, mode, limit, to_test, from_test))
    if sys.argv[4:] == ["torch"]:
        leave()

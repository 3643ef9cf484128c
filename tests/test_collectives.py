"""asyncckpt.node.collectives over real transports: mpirun + mpi4py, torchrun + gloo, and a world of one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from asyncckpt import ConfigError
from asyncckpt.node.collectives import get_collectives

from .launch import mpirun, torchrun


def ranks(out: Path) -> list[dict[str, Any]]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


def check_two_ranks(records: list[dict[str, Any]], backend: str) -> None:
    for r, rec in enumerate(records):
        assert (rec["backend"], rec["rank"], rec["world"]) == (backend, r, 2)
        assert rec["broadcast"] == {"from": 1, "uri": "s3://b/step-1"}
        assert rec["gathered"] == [0, 10]
    waiting = records[0]  # rank 1 came 0.5 s late: rank 0 sat in the barrier, its loop turning
    assert waiting["barrier_s"] > 0.3
    assert waiting["ticks_in_barrier"] >= 10
    assert waiting["loop_lag_s"][3] < 0.1  # max lag


@pytest.mark.mpi
def test_mpirun_two_ranks(tmp_path: Path) -> None:
    proc = mpirun("tests.collectives_child", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    check_two_ranks(ranks(tmp_path), "mpi")


@pytest.mark.torchrun
def test_torchrun_two_ranks_gloo(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    proc = torchrun("tests.collectives_child", str(tmp_path), "torch")
    assert proc.returncode == 0, proc.stderr
    check_two_ranks(ranks(tmp_path), "torch")


async def test_world_of_one_needs_no_transport() -> None:
    async with get_collectives({}) as coll:
        assert (coll.backend, coll.rank, coll.world_size, coll.is_coordinator) == ("single", 0, 1, True)
        await coll.barrier()
        assert await coll.broadcast_object({"a": 1}) == {"a": 1}
        assert await coll.all_gather_object(5) == [5]
        with pytest.raises(ConfigError, match=r"rank must be in 0\.\.0"):
            await coll.broadcast_object(1, src=1)


def test_several_ranks_without_a_transport_are_refused() -> None:
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "x"}
    with pytest.raises(ConfigError, match=r"2 ranks started by torchrun .*init_process_group"):
        get_collectives(env)

"""A tiered run SIGKILLed at each point of a step's way through the tiers (tests/tiers_child.py,
files for both tiers): during the local write, just after the local commit, mid-drain, just
before and just after the remote commit. After each kill a new manager restores the newest
committed, verified step; no remote commit record names an incomplete object; the drain of a
locally committed step resumes by itself; nothing of the dead run is left behind."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from asyncckpt import AsyncCheckpointer, CheckpointManager
from asyncckpt.owner import parse_temp
from asyncckpt.state.index import INDEX as STEP_INDEX
from asyncckpt.steps import COMMIT

from .conftest import ROOT
from .launch import mpirun
from .tiers_child import OPTIONS, state_of
from .tiers_mpi_child import state_of as mpi_state_of

POINTS = [
    ("local-write", 2, False),  # (point, N, step 2 committed locally before the kill)
    ("local-commit", 1, True),
    ("drain", 1, True),
    ("drain", 3, True),
    ("before-remote-commit", 1, True),
    ("after-remote-commit", 1, True),
]


def run_child(local: Path, remote: Path, point: str, nth: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "tests.tiers_child", str(local), str(remote), point, str(nth)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )


def remote_records_name_complete_objects(remote: Path) -> list[int]:
    """Every remote commit record's objects are there, at their recorded size."""
    steps = []
    for record_path in sorted(remote.glob(f"step-*/{COMMIT}")):
        record = json.loads(record_path.read_text())
        for name, size in zip(record["objects"], record["sizes"], strict=True):
            assert (record_path.parent / name).stat().st_size == size, record_path
        steps.append(record["step"])
    return sorted(steps)


def temporaries(*roots: Path) -> list[Path]:
    return [p for root in roots for p in root.rglob("*") if parse_temp(p.name) is not None]


@pytest.mark.parametrize(("point", "nth", "local_committed"), POINTS)
async def test_a_kill_at_each_point_restores_the_newest_committed_step_and_resumes(
    tmp_path: Path, point: str, nth: int, local_committed: bool
) -> None:
    local, remote = tmp_path / "local", tmp_path / "remote"
    local.mkdir()
    remote.mkdir()
    done = await asyncio.to_thread(run_child, local, remote, point, nth)  # off the loop
    assert done.returncode == -9, done.stderr[-2000:]
    assert done.stdout.startswith("step1"), done.stdout
    on_remote = remote_records_name_complete_objects(remote)
    assert on_remote == ([1, 2] if point == "after-remote-commit" else [1])
    newest = 2 if local_committed else 1
    into = state_of(0)
    async with CheckpointManager(remote, local=local, keep_local=3, **OPTIONS) as mgr:
        assert await mgr.restore(into=into) == newest
        await mgr.wait()  # the drain of a locally committed step resumes by itself
    assert np.array_equal(into["model"]["w"], state_of(newest)["model"]["w"])
    tiers = mgr.stats.tiers
    assert tiers is not None and tiers.restored_from is not None and tiers.restored_from[0] == "local"
    resumed = [2] if local_committed and point != "after-remote-commit" else []
    assert tiers.resumed == resumed
    assert remote_records_name_complete_objects(remote) == ([1, 2] if local_committed else [1])
    if not local_committed:  # the dead owner's uncommitted step is removed at start
        assert mgr.stats.cleaned == [2] and not (local / "step-2").exists()
    assert temporaries(local) == []
    if local_committed:  # a resumed drain's save collects the dead drain's temporary
        assert temporaries(remote) == []


@pytest.mark.mpi
async def test_two_nodes_drain_their_own_objects_and_restore_from_the_nearest_tier(tmp_path: Path) -> None:
    proc = await asyncio.to_thread(mpirun, "tests.tiers_mpi_child", str(tmp_path), "save")
    assert proc.returncode == 0, proc.stderr
    remote = tmp_path / "remote"
    assert remote_records_name_complete_objects(remote) == [2, 3]  # keep_last=2 on the remote
    record = json.loads((remote / "step-3" / COMMIT).read_text())
    assert record["objects"] == ["rank-0-of-2.safetensors", "rank-1-of-2.safetensors"]
    # the remote copy carries the step index rank 0 wrote locally: one process loads it
    assert record["index"] == STEP_INDEX and (remote / "step-3" / STEP_INDEX).exists()
    async with AsyncCheckpointer() as one:
        loaded = await one.load_step(remote, 3)
    assert loaded.reads is not None  # resharded: saved by 2 ranks, loaded by 1
    assert np.array_equal(loaded.state["w"], mpi_state_of(0, 3)["w"]) and loaded.state["step"] == 3
    for rank in (0, 1):
        node = tmp_path / f"node-{rank}"
        # keep_local=1 on each node, each with its own object and the step's commit record
        assert sorted(p.name for p in node.iterdir()) == ["step-3"]
        assert sorted(p.name for p in (node / "step-3").iterdir()) == sorted(
            [COMMIT, f"rank-{rank}-of-2.safetensors", *([STEP_INDEX, "OWNER.json"] if rank == 0 else [])]
        )
        stats = json.loads((tmp_path / f"stats-{rank}.json").read_text())
        assert [s["state"] for s in stats["steps"]] == (
            ["remote-committed"] * 3 if rank == 0 else ["drained"] * 3
        )
    shutil.rmtree(tmp_path / "node-1")  # node 1 is lost
    proc = await asyncio.to_thread(mpirun, "tests.tiers_mpi_child", str(tmp_path), "restore")
    assert proc.returncode == 0, proc.stderr
    restored = [json.loads((tmp_path / f"restored-{r}.json").read_text()) for r in (0, 1)]
    assert [(r["step"], r["from"][0], r["equal"]) for r in restored] == [
        (3, "local", True),
        (3, "remote", True),
    ]


@pytest.mark.mpi
async def test_ranks_that_see_different_remotes_restore_the_same_step(tmp_path: Path) -> None:
    proc = await asyncio.to_thread(mpirun, "tests.tiers_mpi_child", str(tmp_path), "save")
    assert proc.returncode == 0, proc.stderr
    shutil.rmtree(tmp_path / "node-1")  # node 1 is lost, and cannot list the remote either
    proc = await asyncio.to_thread(mpirun, "tests.tiers_mpi_child", str(tmp_path), "restore-blind")
    assert proc.returncode == 0, proc.stderr
    restored = [json.loads((tmp_path / f"restored-{r}.json").read_text()) for r in (0, 1)]
    # no step is on every rank's local tier, and rank 1 sees none remote-committed: no rank
    # may load one (rank 0 alone restoring step 3 left the job split between two states)
    assert [r["step"] for r in restored] == [None, None]


@pytest.mark.mpi
async def test_a_step_one_node_lost_is_not_resumed_by_the_others(tmp_path: Path) -> None:
    proc = await asyncio.to_thread(mpirun, "tests.tiers_mpi_child", str(tmp_path), "save")
    assert proc.returncode == 0, proc.stderr
    (tmp_path / "blocker").write_text("")  # the remote below it cannot be listed or written
    proc = await asyncio.to_thread(mpirun, "tests.tiers_mpi_child", str(tmp_path), "outage")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "node-0" / "step-4" / "COMMITTED.json").exists()
    shutil.rmtree(tmp_path / "node-1")  # node 1 is lost with its step-4 object
    (tmp_path / "blocker").unlink()
    (tmp_path / "blocker").mkdir()  # the remote is back (empty)
    # rank 0 alone holds steps 3 and 4: resumed, rank 0 would wait for rank 1's objects
    # (600 s), which no rank can drain; nobody resumes them, and the run ends at once
    proc = await asyncio.to_thread(mpirun, "tests.tiers_mpi_child", str(tmp_path), "resume")
    assert proc.returncode == 0, proc.stderr
    assert [json.loads((tmp_path / f"resumed-{r}.json").read_text()) for r in (0, 1)] == [[], []]

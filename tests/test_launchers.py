"""Rank, world size and ranks on this node from every launcher's environment layout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from asyncckpt.errors import ConfigError
from asyncckpt.node import launcher, topology
from asyncckpt.node.distributed import get_comm, rank_info_from_env

from .result_schema import assert_valid

ROOT = Path(__file__).resolve().parent.parent
TORCHRUN = {
    "RANK": "5",
    "WORLD_SIZE": "8",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "4",
    "TORCHELASTIC_RUN_ID": "x",
}
SRUN = {"SLURM_STEP_ID": "0", "SLURM_PROCID": "9", "SLURM_NTASKS": "11", "SLURM_LOCALID": "1",
        "SLURM_TASKS_PER_NODE": "4(x2),3", "SLURM_NODEID": "2"}  # fmt: skip


@pytest.mark.parametrize(
    ("text", "counts"),
    [("4(x2),3", [4, 4, 3]), ("2", [2]), ("1(x4)", [1, 1, 1, 1]), ("8,8(x3),1", [8, 8, 8, 8, 1])],
)
def test_slurm_compressed_task_lists(text: str, counts: list[int]) -> None:
    assert launcher.parse_tasks_per_node(text) == counts


@pytest.mark.parametrize("bad", ["4(x)", "x", "4(2)", ""])
def test_bad_slurm_task_list_is_named(bad: str) -> None:
    with pytest.raises(ConfigError, match="cannot parse Slurm task list"):
        launcher.parse_tasks_per_node(bad)


def test_torchrun() -> None:
    info = rank_info_from_env(TORCHRUN)
    assert (info.rank, info.size, info.local_rank, info.local_size) == (5, 8, 1, 4)
    assert (info.launcher, info.source) == ("torchrun", "RANK")
    expected = (48, 192, 4, "LOCAL_WORLD_SIZE", False, "mlperf", 48)
    assert topology.thread_budget(env=TORCHRUN, cpus=192) == expected
    plain = rank_info_from_env({"RANK": "1", "WORLD_SIZE": "2"})  # another torch launcher
    assert (plain.launcher, plain.rank, plain.size, plain.local_size) == ("torch", 1, 2, 1)


def test_slurm_srun_picks_this_nodes_count_from_the_compressed_list() -> None:
    info = rank_info_from_env(SRUN)
    assert (info.rank, info.size, info.local_rank, info.local_size) == (9, 11, 1, 3)
    assert (info.launcher, info.source) == ("slurm", "SLURM_PROCID")
    budget = topology.thread_budget(env=SRUN, cpus=96)
    assert budget == (32, 96, 3, "SLURM_TASKS_PER_NODE[2]", False, "mlperf", 32)  # 96 // 3, never 96 // 11
    # the step's own layout wins over the job's
    step = {**SRUN, "SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_PROCID": "3"}
    assert topology.local_ranks({**step, "SLURM_NODEID": "1"}) == (2, "SLURM_STEP_TASKS_PER_NODE[1]")
    info = rank_info_from_env({**step, "SLURM_NODEID": "1"})
    assert (info.rank, info.size, info.local_size) == (3, 4, 2)
    # equal counts everywhere: the node index is not needed
    same = {k: v for k, v in SRUN.items() if k != "SLURM_NODEID"} | {
        "SLURM_TASKS_PER_NODE": "4(x3)",
        "SLURM_NTASKS": "12",
    }
    assert topology.local_ranks(same) == (4, "SLURM_TASKS_PER_NODE[0]")


def test_a_batch_script_is_not_a_rank() -> None:
    """sbatch's own shell has SLURM_PROCID=0 and the job's SLURM_NTASKS, but no step."""
    batch = {k: v for k, v in SRUN.items() if k != "SLURM_STEP_ID"} | {"SLURM_PROCID": "0"}
    info = rank_info_from_env(batch)
    assert (info.rank, info.size, info.local_size, info.launcher) == (0, 1, 1, "none")


def test_pmix() -> None:
    info = rank_info_from_env({"PMIX_RANK": "2", "PMIX_SIZE": "4"})
    assert (info.rank, info.size, info.launcher, info.source) == (2, 4, "pmix", "PMIX_RANK")
    srun = {
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "2",
        "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_STEP_TASKS_PER_NODE": "4",
    }
    under_srun = rank_info_from_env({"PMIX_RANK": "2", **srun})
    assert (under_srun.rank, under_srun.size, under_srun.local_size, under_srun.launcher) == (2, 4, 4, "pmix")
    assert rank_info_from_env({"PMIX_RANK": "0"}).launcher == "none"  # a singleton says nothing
    with pytest.raises(ConfigError, match="PMIX_RANK=2 is set but nothing gives the world size"):
        rank_info_from_env({"PMIX_RANK": "2"})


def test_precedence_innermost_launcher_wins() -> None:
    # srun starts one torchrun per node; torchrun's RANK is the process's rank
    nested = {**SRUN, **TORCHRUN}
    assert (launcher.detect(nested).launcher, topology.local_ranks(nested)) == (
        "torchrun",
        (4, "LOCAL_WORLD_SIZE"),
    )
    # mpirun inside a Slurm allocation: Open MPI's variables, not the allocation's
    ompi = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    found = launcher.detect({**SRUN, **ompi, "PMIX_RANK": "3"})
    assert (found.launcher, found.rank, found.size) == ("mpi", 3, 4)
    assert topology.local_ranks({**SRUN, **ompi}) == (2, "OMPI_COMM_WORLD_LOCAL_SIZE")


def test_rank_beyond_world_size_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"rank 9 from RANK is not below the world size 4"):
        launcher.detect({"RANK": "9", "WORLD_SIZE": "4"})


def test_several_torchrun_ranks_without_mpi_are_refused() -> None:
    with pytest.raises(ConfigError, match="start the ranks with mpirun or srun"):
        get_comm(TORCHRUN)
    assert get_comm({**TORCHRUN, "RANK": "0", "WORLD_SIZE": "1"}).size == 1


@pytest.mark.parametrize(
    ("env", "source"),
    [
        ({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}, "LOCAL_WORLD_SIZE"),
        ({"SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_TASKS_PER_NODE": "1"},
         "SLURM_TASKS_PER_NODE[0]"),
    ],
)  # fmt: skip
def test_the_source_is_recorded_in_results(tmp_path: Path, env: dict[str, str], source: str) -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI", "SLURM_", "MV2_"))}
    proc = subprocess.run(
        [sys.executable, "-m", "asyncckpt.bench", "null://x", "--size", "2MiB", "--chunk-size", "1MiB",
         "--mode", "save", "-q", "--json", "r.json"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
        env={**clean, **env, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    assert_valid(doc)
    assert doc["results"][0]["metadata"]["local_ranks_source"] == source


def test_two_torchrun_ranks_exit_2_with_one_line(tmp_path: Path) -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI", "SLURM_", "MV2_"))}
    proc = subprocess.run(
        [sys.executable, "-m", "asyncckpt.bench", "null://x", "--size", "1MiB"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
        env={**clean, **TORCHRUN, "RANK": "0", "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "torchrun" in proc.stderr

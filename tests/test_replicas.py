"""Peer replicas (issue 26's optional part): the ring over the nodes, and the transfer of a
local object to the next node's tier over the job's own transport, on one machine (each rank
stands for a node: ``tests/replicas_child.py``). Across real nodes: ``tests/test_nodes.py``."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from subprocess import PIPE
from typing import Any

import pytest

from asyncckpt import CheckpointManager
from asyncckpt.errors import ConfigError
from asyncckpt.node.collectives import get_collectives
from asyncckpt.owner import parse_temp
from asyncckpt.replicas import PIECE, Ring

from .launch import ROOT, child_env, mpirun, torchrun

OPTIONS: dict[str, Any] = {"chunk_size": 1 << 20, "num_buffers": 4}


def test_each_rank_replicates_to_the_same_local_rank_on_the_next_node() -> None:
    ring = Ring.of(["a", "a", "b", "b", "c", "c"])
    assert ring.peer == (2, 3, 4, 5, 0, 1)
    assert [ring.source(r) for r in range(6)] == [4, 5, 0, 1, 2, 3]
    assert Ring.of(["b", "a", "b", "a"]).peer == (1, 0, 3, 2)  # nodes in order of their first rank


@pytest.mark.parametrize(
    ("hosts", "message"),
    [
        (["n1", "n1"], "needs ranks on two nodes or more; all 2 rank\\(s\\) run on 'n1'"),
        (["n1", "n1", "n2"], "needs as many ranks on every node, got \\{'n1': 2, 'n2': 1\\}"),
    ],
)
def test_a_ring_without_a_peer_for_every_rank_is_refused_naming_the_nodes(
    hosts: list[str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        Ring.of(hosts)


async def test_a_job_on_one_node_is_refused_at_start(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path / "remote", local=tmp_path / "local", replicate_to_peer=True, **OPTIONS)
    with pytest.raises(ConfigError, match="replicate_to_peer=True needs ranks on two nodes or more"):
        async with mgr:
            await mgr.start()


def results(base: Path, world: int) -> list[dict[str, Any]]:
    return [json.loads((base / f"result-{r}.json").read_text()) for r in range(world)]


def test_every_rank_publishes_its_sources_object_over_mpi(tmp_path: Path) -> None:
    proc = mpirun("tests.replicas_child", str(tmp_path), "ok", np=3)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for r in results(tmp_path, 3):
        source = (r["rank"] - 1) % 3
        assert r["equal"] and r["sent"] == r["received"] > 2 * PIECE  # three rounds of the ring
        assert r["names"] == sorted([f"rank-{r['rank']}-of-3.safetensors", f"rank-{source}-of-3.safetensors"])


@pytest.mark.parametrize("engine", ["mpi", "torch"])
def test_a_corrupt_byte_publishes_no_replica_and_names_its_block(tmp_path: Path, engine: str) -> None:
    """Rank 0's object is corrupted after its save, in the ring's second round: rank 1 checks
    each piece against rank 0's sealed checksums, publishes nothing (no temporary either) and
    names the block; the other ranks' replicas, in the same rounds, are published."""
    if engine == "mpi":
        proc = mpirun("tests.replicas_child", str(tmp_path), "corrupt", np=3)
    else:
        pytest.importorskip("torch", reason="torch not installed: pip install 'asyncckpt[torch]'")
        proc = torchrun("tests.replicas_child", str(tmp_path), "corrupt", "torch", nproc=3)
    assert proc.returncode == 0, proc.stderr[-3000:]
    zero, one, two = results(tmp_path, 3)
    name, message, offset = one["error"]
    assert name == "ChecksumMismatchError" and offset == PIECE  # the 256 KiB block of the byte
    assert f"block received at offset {PIECE} differs" in message and "nothing published" in message
    assert one["names"] == ["rank-1-of-3.safetensors"]
    assert zero["equal"] and two["equal"]


def test_a_receiver_killed_mid_replica_leaves_no_object_and_the_next_run_publishes_it(tmp_path: Path) -> None:
    """SIGKILL of the receiving rank while the replica is on its way (its sender held by
    SIGSTOP once the receiver's temporary exists, eight rounds before the end): the replica's
    name never appears, only a temporary naming its dead owner, which the next save into that
    directory removes; the next run publishes the replica."""
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not found: run tests/setup_system.sh (installs Open MPI)")
    env = child_env(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    argv = [sys.executable, "-m", "tests.replicas_child", str(tmp_path), "big"]
    proc = subprocess.Popen(
        ["mpirun", "-np", "2", "--oversubscribe", *argv],
        env=env,
        cwd=ROOT,
        stdout=PIPE,
        stderr=PIPE,
        text=True,
    )
    receiving = tmp_path / "node-1" / "step-1"
    try:
        deadline = time.monotonic() + 60
        while not [p for p in receiving.glob(".rank-0-of-2.safetensors.*") if parse_temp(p.name)]:
            assert proc.poll() is None and time.monotonic() < deadline, "the replica never started"
            time.sleep(0.001)  # polling the directory for the instant to strike
        pids = [int((tmp_path / f"pid-{r}").read_text()) for r in (0, 1)]
        os.kill(pids[0], signal.SIGSTOP)
        os.kill(pids[1], signal.SIGKILL)
        os.kill(pids[0], signal.SIGKILL)
    finally:
        proc.communicate(timeout=60)
    assert proc.returncode != 0
    left = sorted(p.name for p in receiving.iterdir())
    assert "rank-0-of-2.safetensors" not in left, "the kill came after the replica was published"
    temps = [parse_temp(n) for n in left if n != "rank-1-of-2.safetensors"]
    assert temps and all(
        t is not None and t.name == "rank-0-of-2.safetensors" and t.provably_dead() for t in temps
    )
    again = mpirun("tests.replicas_child", str(tmp_path), "again", np=2)
    assert again.returncode == 0, again.stderr[-3000:]
    assert [r["equal"] for r in results(tmp_path, 2)] == [True, True]
    assert sorted(p.name for p in receiving.iterdir()) == [
        "rank-0-of-2.safetensors",
        "rank-1-of-2.safetensors",
    ]


async def test_a_world_of_one_has_no_peer_to_exchange_bytes_with() -> None:
    async with get_collectives() as coll:
        assert coll.world_size == 1
        await coll.sendrecv(None, 0, None, 0)  # nothing either way: nothing to do
        with pytest.raises(ConfigError, match="no peer to exchange bytes with"):
            await coll.sendrecv(memoryview(b"x"), 0, None, 0)
        with pytest.raises(ConfigError, match=r"rank must be in 0\.\.0, got 1"):
            await coll.sendrecv(memoryview(b"x"), 1, None, 0)

"""A real ``torchrun --nproc-per-node 2 -m asyncckpt.bench``: gloo coordinates the ranks, rank 0
reports the same aggregated result an ``mpirun`` run does (tests/test_mpi.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import checkpoint_data, expected_bytes
from .launch import torchrun
from .result_schema import assert_valid

MiB = 1 << 20


@pytest.mark.torchrun
def test_torchrun_two_ranks_aggregate_like_mpirun(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    size, target, out = 3 * MiB + 5, tmp_path / "ckpt", tmp_path / "result.json"
    args = [str(target), "--size", str(size), "--chunk-size", "1MiB", "--num-buffers", "4", "--seed", "3"]
    proc = torchrun("asyncckpt.bench", *args, "--repeat", "2", "--keep", "--json", str(out), "-q")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("torch.distributed run: 2 ranks") == 1  # only rank 0 reports
    for rank in (0, 1):  # each rank its own shard, with its own data (seed + rank)
        data = (target / f"rank{rank:05d}.bin").read_bytes()
        assert checkpoint_data(data) == expected_bytes(size, MiB, 3 + rank)
    report = json.loads(out.read_text())
    assert_valid(report)
    assert (report["mode"], report["world_size"], report["engine"]) == ("mpi", 2, "torch")
    assert (report["launcher"], report["rank_info_source"]) == ("torchrun", "torch.distributed")
    (phase,) = [p for p in report["phases"] if p["phase"] == "save"]
    assert len(phase["checkpoints"]) == 2
    for c in phase["checkpoints"]:
        assert c["total_bytes"] == 2 * size
        assert c["duration_s"] == max(r["wall_s"] for r in c["per_rank"])
        assert c["min_rank_throughput_bps"] <= c["throughput_bps"] <= c["aggregate_bandwidth_bps"]
        assert {r["local_ranks"] for r in c["per_rank"]} == {2}  # LOCAL_WORLD_SIZE

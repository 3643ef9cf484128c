"""Real ``mpirun -np 2 python -m asyncckpt.bench`` runs (Open MPI via tests/setup_system.sh)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from . import moto_multi
from .conftest import checkpoint_data, expected_bytes

ROOT = Path(__file__).resolve().parent.parent
MiB = 1 << 20

pytestmark = [
    pytest.mark.mpi,
    pytest.mark.skipif(
        shutil.which("mpirun") is None,
        reason="mpirun not found: run tests/setup_system.sh (installs Open MPI)",
    ),
]


def mpirun(
    *args: str, np: int = 2, timeout: float = 60, env_extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("mpi4py", reason="mpi4py not installed: pip install 'asyncckpt[mpi]'")
    env = dict(os.environ)
    env.update(
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
    )
    env.update(env_extra or {})
    cmd = ["mpirun", "-np", str(np), "--oversubscribe", sys.executable, "-m", "asyncckpt.bench", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def saves(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in report["phases"] if p["phase"] == "save"]


def test_two_ranks_write_their_shards_and_rank0_reports(tmp_path: Path) -> None:
    size, chunk = 5 * MiB + 123, MiB
    out = tmp_path / "summary.json"
    target = tmp_path / "ckpt"
    args = [str(target), "--size", str(size), "--chunk-size", "1MiB", "--num-buffers", "4"]
    proc = mpirun(*args, "--seed", "7", "--repeat", "2", "--keep", "--json", str(out), "-q")
    assert proc.returncode == 0, proc.stderr
    for rank in (0, 1):  # every rank wrote its own shard, with its own data (seed + rank)
        data = (target / f"rank{rank:05d}.bin").read_bytes()
        assert checkpoint_data(data) == expected_bytes(size, chunk, 7 + rank)
    shards = sorted(p.name for p in target.iterdir() if p.suffix == ".bin")  # (the load path adds manifests)
    assert shards == ["rank00000.bin", "rank00001.bin"]
    assert proc.stdout.count("MPI run: 2 ranks") == 1  # only rank 0 prints
    report = json.loads(out.read_text())
    assert report["world_size"] == 2 and report["seed_base"] == 7
    (phase,) = saves(report)
    assert (phase["phase"], phase["method"]) == ("save", "streaming")
    assert len(phase["checkpoints"]) == 2
    for c in phase["checkpoints"]:
        assert c["total_bytes"] == 2 * size
        assert c["duration_s"] == max(r["wall_s"] for r in c["per_rank"])
        assert c["throughput_bps"] == pytest.approx(2 * size / c["duration_s"])
        assert c["min_rank_throughput_bps"] <= c["throughput_bps"] <= c["aggregate_bandwidth_bps"]
        assert {c["slowest_rank"]["rank"], c["fastest_rank"]["rank"]} <= {0, 1}
        assert sum(c["rank_bottlenecks"].values()) == 2
        # the generator budget used MPI's node-local size, not an env guess
        assert {r["local_ranks"] for r in c["per_rank"]} == {2}
        sources = {r["local_ranks_source"] for r in c["per_rank"]}
        assert all(src.startswith("mpi4py COMM_TYPE_SHARED") for src in sources), sources
    s = phase["summary"]
    for key in ("throughput_bps_mean", "throughput_bps_stdev", "duration_s_mean", "duration_s_stdev"):
        assert s[key] >= 0
    assert s["total_bytes"] == 2 * size and s["checkpoints"] == 2


def test_one_failing_rank_fails_the_run_without_hanging(tmp_path: Path) -> None:
    (tmp_path / "d0").mkdir()  # rank 1's directory d1 does not exist
    t0 = time.monotonic()
    proc = mpirun(str(tmp_path), "--layout", "d{rank}/shard.bin", "--size", "2MiB", "-q", timeout=30)
    assert time.monotonic() - t0 < 20
    assert proc.returncode != 0
    assert "failed on rank 1: TargetNotFoundError" in proc.stderr, proc.stderr
    assert "d1" in proc.stderr and "rank 0:" not in proc.stderr
    assert not list((tmp_path / "d0").iterdir())  # rank 0's shard was removed


def test_setup_error_is_reported_once_before_any_io(tmp_path: Path) -> None:
    proc = mpirun(str(tmp_path / "missing" / "ckpt"), "--size", "1MiB", timeout=30)
    assert proc.returncode == 2
    assert proc.stderr.count("does not exist") == 1, proc.stderr
    assert not (tmp_path / "missing").exists()


def test_preset_and_config_on_null_target(tmp_path: Path) -> None:
    cfg = tmp_path / "workload.yaml"
    cfg.write_text(
        "model: {name: llama3_8b}\n"
        "checkpoint:\n"
        "  checkpoint_folder: null://bench\n"
        "  num_checkpoints_write: 2\n"
        "  num_checkpoints_read: 0\n"  # null:// keeps nothing to read back
        "  fsync: false\n"
        "  streaming: {enabled: true, chunk_size: 1048576, num_buffers: 4, use_dgen: true, nvme: 1}\n"
    )
    out = tmp_path / "s.json"
    proc = mpirun("--config", str(cfg), "--model", "llama3-8b", "--scale", "0.0001", "--json", str(out), "-q")
    assert proc.returncode == 0, proc.stderr
    assert "unknown keys ignored: checkpoint.streaming.nvme" in proc.stderr
    report = json.loads(out.read_text())
    # the preset is MLPerf's llama3-8b workload: 2 of its 8 ranks write their DLIO objects (a subset)
    from asyncckpt.bench.dlio_layout import scaled
    from asyncckpt.bench.presets import PRESETS

    plan = PRESETS["llama3-8b"].plan(2)
    assert report["subset"] and report["plan"]["full_ranks"] == 8 and report["target"] == "null://bench"
    per_rank = [scaled(rp, 0.0001).nbytes for rp in plan.rank_plans]
    assert [c["total_bytes"] for c in report["phases"]["save"]["checkpoints"]] == [sum(per_rank)] * 2
    assert "subset: 2 of the workload's 8 ranks" in proc.stderr


def _s3_backend_missing() -> str | None:
    from asyncckpt.sinks import SCHEMES

    return None if "s3" in SCHEMES else "no s3:// backend in this build (S3 sinks live on branch s3)"


def test_two_ranks_to_s3_with_one_endpoint_per_rank(tmp_path: Path) -> None:
    reason = _s3_backend_missing()
    if reason:
        pytest.skip(reason)
    import boto3

    with moto_multi.started(2) as urls:
        creds = {
            "aws_access_key_id": "testing",
            "aws_secret_access_key": "testing",
            "region_name": "us-east-1",
        }
        s3 = boto3.client("s3", endpoint_url=urls[0], **creds)
        s3.create_bucket(Bucket="mpi")
        env = {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": "us-east-1",
            "S3_ENDPOINT_URIS": ",".join(urls),
            "S3_LOAD_BALANCE_STRATEGY": "rank",
        }
        out = tmp_path / "s.json"
        size = 7 * MiB
        args = ("s3://mpi/run1", "--size", str(size), "--chunk-size", "5MiB", "--keep", "--json", str(out))
        run = mpirun(*args, env_extra=env)
        assert run.returncode == 0, run.stderr
        report = json.loads(out.read_text())
        assert report["rank_endpoints"] == urls  # rank r → endpoint r % 2
        for rank in (0, 1):
            body = s3.get_object(Bucket="mpi", Key=f"run1/rank{rank:05d}.bin")["Body"].read()
            assert len(checkpoint_data(body)) == size
        assert saves(report)[0]["checkpoints"][0]["total_bytes"] == 2 * size


def test_save_then_load_phases_when_the_load_path_exists(tmp_path: Path) -> None:
    from asyncckpt.bench.cli import build_parser

    if "mode" not in {a.dest for a in build_parser()._actions}:
        pytest.skip("no --mode option in this build (the load path lives on branch load)")
    size, out = 3 * MiB + 5, tmp_path / "s.json"
    args = (str(tmp_path / "ck"), "--mode", "both", "--size", str(size), "--chunk-size", "1MiB")
    proc = mpirun(*args, "--num-checkpoints-read", "2", "--json", str(out), "-q")
    assert proc.returncode == 0, proc.stderr
    phases = {p["phase"]: p for p in json.loads(out.read_text())["phases"]}
    assert [c["total_bytes"] for c in phases["save"]["checkpoints"]] == [2 * size]
    assert [c["total_bytes"] for c in phases["load"]["checkpoints"]] == [2 * size, 2 * size]
    assert "LOAD" in proc.stdout


def test_default_temporary_target_is_shared_and_removed(tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    proc = mpirun("--size", "1MiB", "--chunk-size", "1MiB", "--json", str(out), "-q", timeout=30)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    base = Path(report["target"])
    assert [Path(s).parent for s in report["shards"]] == [base, base]  # one directory made by rank 0
    assert not base.exists()  # and removed at the end


@pytest.mark.parametrize("layout", ["same.bin", "n{local_rank}-of-{size}.bin"])
def test_layout_giving_two_ranks_one_object_is_refused_before_any_io(tmp_path: Path, layout: str) -> None:
    """Both ranks on one object overwrite each other and report bytes storage never held.
    Both ranks run on one node here, so {local_rank} differs and the second layout is accepted."""
    target = tmp_path / "ck"
    proc = mpirun(str(target), "--size", "1MiB", "--chunk-size", "1MiB", "--layout", layout, "-q", timeout=30)
    if "{local_rank}" in layout:
        assert proc.returncode == 0, proc.stderr
        assert not target.exists() or not list(target.iterdir())
        return
    assert proc.returncode == 2, proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("asyncckpt.bench")]  # mpirun adds its own
    assert "ranks 0 and 1" in line and repr(layout) in line and "{rank}" in line, line
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert not target.exists()  # refused before rank 0 made the target


def test_documented_node_layout_with_mkdirs_makes_and_removes_each_ranks_folder(tmp_path: Path) -> None:
    """docs/scaleout.md's example: rank 1 (local_rank 1) needs node1/, which rank 0 must make."""
    target = tmp_path / "ck"
    target.mkdir()
    (target / "mine").mkdir()  # not the run's: stays
    layout = "node{local_rank}/r{rank}-of-{size}.bin"
    args = (str(target), "--size", "1MiB", "--chunk-size", "1MiB", "--layout", layout, "--mkdirs", "-q")
    proc = mpirun(*args, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in target.iterdir()) == ["mine"]  # node0/ and node1/ removed with the shards
    proc = mpirun(*args, "--keep", timeout=30)
    assert proc.returncode == 0, proc.stderr
    kept = sorted(str(p.relative_to(target)) for p in target.rglob("*.bin"))
    assert kept == ["node0/r0-of-2.bin", "node1/r1-of-2.bin"]


def test_target_folder_the_run_made_is_removed_with_the_shards(tmp_path: Path) -> None:
    """As in a one-process run: a run removes the folders it made, if empty; a kept one stays."""
    args = ("--size", "1MiB", "--chunk-size", "1MiB", "-q")
    proc = mpirun(str(tmp_path / "new"), *args, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "new").exists()
    (tmp_path / "old").mkdir()  # not the run's: stays, empty
    proc = mpirun(str(tmp_path / "old"), *args, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "old").is_dir() and not list((tmp_path / "old").iterdir())

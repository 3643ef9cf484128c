"""DLIO workload runs: each rank writes its planned objects; MLPerf-style results directory."""

from __future__ import annotations

import json
import shutil
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from asyncckpt.bench.cli import main
from asyncckpt.bench.dlio import load_workload
from asyncckpt.bench.dlio_layout import DLIO_GB, plan_checkpoint
from asyncckpt.servers.s3endpoint import S3Endpoint
from asyncckpt.steps import COMMIT

from .conftest import checkpoint_data
from .s3_harness import new_bucket
from .test_mpi import mpirun

SHAPE = """\
model:
  name: tiny
  type: transformer
  num_layers: {layers}
  model_datatype: fp16
  optimizer_datatype: fp32
  parallelism: {{tensor: {tp}, pipeline: {pp}, zero_stage: {zero}}}
  transformer: {{vocab_size: 1000, hidden_size: 256, ffn_hidden_size: 512,
                 num_attention_heads: 8, num_kv_heads: 4}}
framework: pytorch
workflow: {{generate_data: false, train: false, checkpoint: true}}
checkpoint:
  checkpoint_folder: {folder}
  time_between_checkpoints: {pause}
  num_checkpoints_write: {writes}
  num_checkpoints_read: {reads}
  fsync: true
"""


def write_config(tmp_path: Path, **kw: object) -> Path:
    values = {"layers": 4, "tp": 1, "pp": 1, "zero": 3, "pause": 0, "writes": 1, "reads": 1}
    values.update(kw)
    f = tmp_path / "tiny.yaml"
    f.write_text(SHAPE.format(**values))
    return f


def data_files(root: Path) -> dict[str, int]:
    """Every checkpoint object under ``root``: relative name → bytes of data (the sealed
    manifest at each object's end is not data; commit records are listed by :func:`commits`)."""
    return {
        str(p.relative_to(root)): len(checkpoint_data(p.read_bytes()))
        for p in root.rglob("*")
        if p.is_file() and not p.name.endswith(".manifest.json") and p.name != COMMIT
    }


def commits(root: Path) -> dict[str, dict[str, Any]]:
    """Each step directory's commit record, by directory name."""
    return {p.parent.name: json.loads(p.read_text()) for p in root.rglob(COMMIT)}


def test_single_process_run_honours_the_rules_and_writes_summary_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "ckpt" / "tiny"  # parents do not exist yet: created like DLIO's namespace
    cfg = write_config(tmp_path, folder=folder, pause=0.2, writes=2, reads=1)
    results = tmp_path / "results"
    out = tmp_path / "run.json"
    t0 = datetime.now()
    code = main(["--config", str(cfg), "--chunk-size", "1MiB", "--num-buffers", "2", "--keep",
                 "--results-dir", str(results), "--json", str(out), "-q"])  # fmt: skip
    elapsed = (datetime.now() - t0).total_seconds()
    assert code == 0, capsys.readouterr().err
    assert elapsed >= 2 * 0.2  # emulated compute before each of the two saves (and the read)
    model = load_workload(cfg).model
    assert model is not None
    plan = plan_checkpoint(model, 1)
    expect = {f"global_epoch1_step{s}/{o.name}": o.size for s in (1, 2) for o in plan.rank_plans[0].objects}
    assert data_files(folder) == expect
    records = commits(folder)
    assert sorted(records) == ["global_epoch1_step1", "global_epoch1_step2"]
    for step, record in records.items():  # written after every rank's objects, one per step
        assert record["world_size"] == 1 and record["written_by"] == "asyncckpt"
        assert {f"{step}/{n}": b for n, b in zip(record["objects"][0], record["sizes"][0], strict=True)} == {
            k: v for k, v in expect.items() if k.startswith(step + "/")
        }
    summary = json.loads((results / "summary.json").read_text())
    assert set(summary) >= {"start", "end", "num_accelerators", "num_hosts", "host_memory_GB",
                            "host_cpu_count", "workload", "metric"}  # fmt: skip
    assert summary["workload"] == "tiny" and summary["num_accelerators"] == 1 and summary["num_hosts"] == 1
    assert isinstance(summary["host_memory_GB"], list) and isinstance(summary["host_memory_GB"][0], float)
    assert isinstance(summary["host_cpu_count"], list) and isinstance(summary["host_cpu_count"][0], int)
    datetime.strptime(summary["start"], "%Y-%m-%dT%H:%M:%S.%f")
    writes = summary["metric"]["checkpoint_write_throughput_GB_per_second"]
    reads = summary["metric"]["checkpoint_read_throughput_GB_per_second"]
    assert (
        len(writes) == 2 and len(reads) == 1 and all(isinstance(x, float) and x > 0 for x in writes + reads)
    )
    report = json.loads(out.read_text())
    for c, rate in zip(report["phases"]["save"]["checkpoints"], writes, strict=True):
        assert rate == pytest.approx(c["total_bytes"] / c["duration_s"] / DLIO_GB)  # DLIO's unit
        assert c["total_bytes"] == plan.total_bytes
        assert set(c["kind_seconds_max"]) == {"model", "optimizer"}
    (meta_file,) = results.glob("checkpointing_*_metadata.json")
    meta = json.loads(meta_file.read_text())
    assert meta["benchmark_type"] == "checkpointing" and meta["num_processes"] == 1
    assert meta["parameters"]["model"]["num_layers"] == 4 and meta["override_parameters"] == {}
    assert "--results-dir" in meta["command"]
    # a second run into the same results folder is refused before any I/O
    assert main(["--config", str(cfg), "--results-dir", str(results), "-q"]) == 2
    assert "already has a summary.json" in capsys.readouterr().err


def test_overrides_change_a_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "ckpt"
    cfg = write_config(tmp_path, folder=folder, writes=3, reads=3)
    results = tmp_path / "results"
    w, r = "++workload.checkpoint.num_checkpoints_write=1", "++workload.checkpoint.num_checkpoints_read=1"
    code = main(["--config", str(cfg), w, r, "--results-dir", str(results), "-q"])
    assert code == 0, capsys.readouterr().err
    summary = json.loads((results / "summary.json").read_text())
    assert len(summary["metric"]["checkpoint_write_throughput_GB_per_second"]) == 1
    (meta_file,) = results.glob("checkpointing_*_metadata.json")
    meta = json.loads(meta_file.read_text())
    assert meta["override_parameters"] == {
        "workload.checkpoint.num_checkpoints_write": "1",
        "workload.checkpoint.num_checkpoints_read": "1",
    }
    assert not any(folder.rglob("*.pt")) and not any(folder.rglob(COMMIT))  # it removes what it wrote


def test_a_step_without_its_commit_record_is_not_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run that died mid-step leaves objects but no record: a read-only run refuses them."""
    folder = tmp_path / "ckpt"
    cfg = write_config(tmp_path, folder=folder, writes=1, reads=1)
    assert main(["--config", str(cfg), "--chunk-size", "1MiB", "--keep", "--mode", "save", "-q"]) == 0
    (folder / "global_epoch1_step1" / COMMIT).unlink()  # as if rank 0 died before committing
    assert main(["--config", str(cfg), "--chunk-size", "1MiB", "--keep", "--mode", "load", "-q"]) != 0
    assert "no commit record" in capsys.readouterr().err


def test_uniform_config_takes_its_checkpoint_folder_as_a_folder(tmp_path: Path) -> None:
    folder = tmp_path / "ckpts"
    folder.mkdir()
    cfg = tmp_path / "w.yaml"
    cfg.write_text(f"checkpoint:\n  checkpoint_folder: {folder}\n  num_checkpoints_read: 0\n")
    assert main(["--config", str(cfg), "--size", "1MiB", "--chunk-size", "1MiB", "--keep", "-q"]) == 0
    assert len(checkpoint_data((folder / "checkpoint.bin").read_bytes())) == 1 << 20


@pytest.mark.mpi
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not found: run tests/setup_system.sh")
def test_mpirun_4_ranks_tensor2_pipeline2_zero1_write_exactly_the_planned_objects(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    cfg = write_config(tmp_path, folder=folder, tp=2, pp=2, zero=1, writes=1, reads=1)
    out = tmp_path / "run.json"
    proc = mpirun("--config", str(cfg), "--chunk-size", "1MiB", "--num-buffers", "2", "--keep",
                  "--mode", "save", "--json", str(out), "-q", np=4, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    model = load_workload(cfg).model
    assert model is not None
    plan = plan_checkpoint(model, 4)
    expect = {f"global_epoch1_step1/{o.name}": o.size for rp in plan.rank_plans for o in rp.objects}
    assert any(name.split("/")[1].startswith("layer_") for name in expect)  # per-layer files appear
    assert data_files(folder) == expect
    (record,) = commits(folder).values()  # the commit record, listed apart from the data
    assert record["world_size"] == 4 and [sum(s) for s in record["sizes"]] == [
        rp.nbytes for rp in plan.rank_plans
    ]
    manifests = sorted(p.name for p in folder.rglob("*.manifest.json"))
    assert len(manifests) in (0, len(expect))  # sidecars, when this build still writes them
    report = json.loads(out.read_text())
    (c,) = report["phases"]["save"]["checkpoints"]
    assert c["total_bytes"] == plan.total_bytes and c["ranks"] == 4
    assert c["duration_s"] == max(r["wall_s"] for r in c["per_rank"])
    assert c["throughput_bps"] == pytest.approx(plan.total_bytes / c["duration_s"])
    assert [r["size_bytes"] for r in c["per_rank"]] == [rp.nbytes for rp in plan.rank_plans]
    assert report["plan"]["imbalance"] == pytest.approx(plan.imbalance)
    assert proc.stdout.count("DLIO workload tiny") == 1  # only rank 0 reports


@pytest.mark.realstore
@pytest.mark.mpi
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not found: run tests/setup_system.sh")
def test_mpirun_4_ranks_on_swift_write_the_planned_objects_and_a_commit_record(
    tmp_path: Path, swift_endpoint: S3Endpoint
) -> None:
    bucket = new_bucket(swift_endpoint)
    cfg = write_config(tmp_path, folder=f"s3://{bucket}/run", tp=2, pp=2, zero=1, writes=1, reads=1)
    env = {**swift_endpoint.env(), "AWS_EC2_METADATA_DISABLED": "true"}
    proc = mpirun("--config", str(cfg), "--chunk-size", "5MiB", "--num-buffers", "2", "--keep",
                  "--backend", "aiobotocore", "-q", np=4, timeout=120, env_extra=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    model = load_workload(cfg).model
    assert model is not None
    plan = plan_checkpoint(model, 4)
    client = swift_endpoint.client()
    keys = {o["Key"]: o["Size"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]}
    step = "run/global_epoch1_step1/"
    expect = {step + o.name for rp in plan.rank_plans for o in rp.objects}
    assert set(keys) - {step + COMMIT} == expect  # exactly the planned objects, then the record
    record = json.loads(client.get_object(Bucket=bucket, Key=step + COMMIT)["Body"].read())
    assert any(k.split("/")[-1].startswith("layer_") for k in expect)  # per-layer objects appear
    assert record["world_size"] == 4 and record["written_by"] == "asyncckpt"
    assert [sum(s) for s in record["sizes"]] == [rp.nbytes for rp in plan.rank_plans]


def test_setup_is_reported_apart_and_kept_out_of_the_first_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """DLIO sets up before its timed region: the buffer pool (8 x 32 MiB, touched), threads and
    the storage client are made before checkpoint 1, so its time is its objects' times plus
    the same small bookkeeping as every later checkpoint's."""
    cfg = write_config(tmp_path, folder=tmp_path / "ckpt", writes=3, reads=0)
    out = tmp_path / "run.json"
    assert (
        main(["--config", str(cfg), "--chunk-size", "32MiB", "--num-buffers", "8", "--json", str(out), "-q"])
        == 0
    )
    text = capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["setup_s"] > 0 and len(report["rank_setup_s"]) == 1
    assert f"setup before the timed checkpoints: {report['setup_s']:.3f} s" in text
    cps = report["phases"]["save"]["checkpoints"]
    # what a checkpoint's time holds beyond its objects' own times (one rank: no straggler)
    extra = [c["duration_s"] - sum(c["rank_kind_seconds"][0].values()) for c in cps]
    assert extra[0] <= max(extra[1:]) + 0.1, (extra, report.get("setup_s"))


def test_summary_json_gives_the_written_size_beside_its_throughput_and_the_unscaled_plan_apart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = write_config(tmp_path, folder=tmp_path / "ckpt", writes=1, reads=0)
    results, out = tmp_path / "results", tmp_path / "run.json"
    args = ["--config", str(cfg), "--scale", "0.25", "--results-dir", str(results), "--json", str(out), "-q"]
    assert main(args) == 0, capsys.readouterr().err
    model = load_workload(cfg).model
    assert model is not None
    unscaled = plan_checkpoint(model, 1).total_bytes
    (c,) = json.loads(out.read_text())["phases"]["save"]["checkpoints"]
    assert c["total_bytes"] < unscaled  # scaled: what was written
    metric = json.loads((results / "summary.json").read_text())["metric"]
    assert metric["checkpoint_size_GB"] == pytest.approx(c["total_bytes"] / DLIO_GB)
    (rate,) = metric["checkpoint_write_throughput_GB_per_second"]
    (duration,) = metric["checkpoint_write_duration_seconds"]
    assert rate == pytest.approx(metric["checkpoint_size_GB"] / duration)  # one size, one rate
    assert metric["unscaled_checkpoint_size_GB"] == pytest.approx(unscaled / DLIO_GB)
    assert json.loads(out.read_text())["checkpoint_bytes"] == c["total_bytes"]


def test_a_one_rank_run_of_an_mlperf_workload_file_is_a_subset(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """llama3_8b.yaml needs 8 ranks (MLPerf Storage's full run): one rank writes a subset."""
    fixture = Path(__file__).parent / "fixtures" / "dlio" / "llama3_8b.yaml"
    results, out = tmp_path / "results", tmp_path / "run.json"
    keys = ("time_between_checkpoints=0", "num_checkpoints_write=1", "num_checkpoints_read=0")
    overrides = [f"++workload.checkpoint.{k}" for k in keys]
    args = [str(tmp_path / "ckpt"), "--config", str(fixture), "--scale", "0.00001", "-q", *overrides,
            "--results-dir", str(results), "--json", str(out)]  # fmt: skip
    assert main(args) == 0
    err = capsys.readouterr().err
    report = json.loads(out.read_text())
    assert report["subset"] and report["plan"]["full_ranks"] == 8 and report["world_size"] == 1
    assert json.loads((results / "summary.json").read_text())["subset"] is True
    assert "8 ranks: MLPerf Storage's full run of llama3-8b" in err and "subset: 1 of the workload's 8" in err

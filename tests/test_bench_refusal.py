"""The bench never overwrites or deletes what it did not create (issue: pointed at a user's
``model.pt`` it overwrote it, then deleted it).

A target that exists and is not an asyncckpt checkpoint is refused before any write, with one
line and exit 2 (``--overwrite`` allows it); checkpoints from earlier runs may be replaced;
directory layouts are checked per object, every rank before any rank writes; at the end a run
removes only what its own saves published.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from asyncckpt import AsyncCheckpointer
from asyncckpt.bench.cli import main
from asyncckpt.engine.seal import unseal

from .conftest import run_bench, to_legacy
from .test_dlio_run import write_config
from .test_mpi import mpirun

USER_BYTES = b"my precious model weights\n" * 1000
SMALL = ("--size", "1MiB", "--chunk-size", "1MiB", "-q")


def test_a_file_it_did_not_create_is_refused_and_left_alone(tmp_path: Path) -> None:
    model = tmp_path / "model.pt"
    model.write_bytes(USER_BYTES)
    run = run_bench(str(model), *SMALL, cwd=tmp_path)
    assert run.returncode == 2, run.stderr
    assert run.stderr.count("\n") == 1 and "is not an asyncckpt checkpoint" in run.stderr, run.stderr
    assert "--overwrite" in run.stderr
    assert model.read_bytes() == USER_BYTES
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pt"]  # no temporary either


def test_overwrite_replaces_it_when_asked(tmp_path: Path) -> None:
    model = tmp_path / "model.pt"
    model.write_bytes(USER_BYTES)
    run = run_bench(str(model), *SMALL, "--overwrite", "--keep", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    data, manifest = unseal(model.read_bytes())
    assert manifest.size == len(data) == 1 << 20


def test_checkpoints_of_earlier_runs_may_be_replaced(tmp_path: Path) -> None:
    target = tmp_path / "ck.bin"
    assert run_bench(str(target), *SMALL, "--keep", cwd=tmp_path).returncode == 0
    again = run_bench(str(target), *SMALL, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert not target.exists()  # the second run published it, so it removes it


async def test_probe_tells_checkpoints_from_other_objects(tmp_path: Path) -> None:
    async with AsyncCheckpointer(chunk_size=1 << 20, num_buffers=2) as ckpt:
        assert await ckpt.probe(tmp_path / "absent.bin") == "absent"
        await ckpt.save(tmp_path / "sealed.bin", 12345)
        assert await ckpt.probe(tmp_path / "sealed.bin") == "checkpoint"
        await ckpt.save(tmp_path / "legacy.bin", 12345)
        await asyncio.to_thread(to_legacy, tmp_path / "legacy.bin")
        assert await ckpt.probe(tmp_path / "legacy.bin") == "checkpoint"
        await asyncio.to_thread((tmp_path / "user.bin").write_bytes, USER_BYTES)
        assert await ckpt.probe(tmp_path / "user.bin") == "foreign"


def test_a_workload_run_checks_every_object_and_removes_only_its_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "ckpt"
    cfg = write_config(tmp_path, folder=folder, writes=1, reads=0)
    assert main(["--config", str(cfg), "--keep", "-q"]) == 0
    kept = sorted(folder.rglob("*.pt"))
    assert len(kept) >= 2
    kept[-1].write_bytes(USER_BYTES)  # someone's file where the run will write
    before = {p: p.read_bytes() for p in kept}
    code = main(["--config", str(cfg), "-q"])
    assert code != 0
    assert "is not an asyncckpt checkpoint" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in sorted(folder.rglob("*.pt"))} == before  # nothing written or removed


@pytest.mark.mpi
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not found: run tests/setup_system.sh")
def test_every_rank_checks_its_shard_before_any_rank_writes(tmp_path: Path) -> None:
    target = tmp_path / "ckpt"
    target.mkdir()
    theirs = target / "rank00001.bin"
    theirs.write_bytes(USER_BYTES)
    run = mpirun(str(target), *SMALL)
    assert run.returncode != 0
    assert "rank 1" in run.stderr and "is not an asyncckpt checkpoint" in run.stderr, run.stderr
    assert theirs.read_bytes() == USER_BYTES
    assert sorted(p.name for p in target.iterdir()) == ["rank00001.bin"]  # rank 0 wrote nothing

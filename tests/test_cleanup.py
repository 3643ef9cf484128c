"""``python -m asyncckpt.bench cleanup``: leftovers of dead saves are listed and removed, and
nothing else: a temporary of a live process never, one of unknown owner only when old enough
and asked (``--older-than``), a file that is no temporary of asyncckpt's never."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from asyncckpt.owner import boot_id, host
from asyncckpt.servers.s3endpoint import S3Endpoint

from .conftest import run_bench
from .s3_harness import new_bucket

HOUR = 3600


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped) on this host."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def temp(
    directory: Path, pid: int, who: str | None = None, age_s: float = 0, suffix: str = ".partial"
) -> Path:
    path = directory / f".ck.bin.ackpt~{who or host()}~{boot_id()}~{pid}~0badcafe{suffix}"
    path.write_bytes(b"x" * 4096)
    if age_s:
        then = time.time() - age_s
        os.utime(path, (then, then))
    return path


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_only_provably_dead_saves_are_collected_unless_an_age_is_given(tmp_path: Path) -> None:
    dead = temp(tmp_path, dead_pid())
    alive = temp(tmp_path, os.getpid(), age_s=2 * HOUR)  # old, but its process runs: never
    other_host = temp(tmp_path, 1, who="another-host", age_s=2 * HOUR)
    fresh_other = temp(tmp_path, 2, who="yet-another", age_s=60)
    legacy = tmp_path / ".ck.bin.0123456789ab.partial"
    legacy.write_bytes(b"old")
    os.utime(legacy, (time.time() - 2 * HOUR,) * 2)
    mine = tmp_path / ".hidden-user-file.partial"
    mine.write_bytes(b"keep me")

    dry = run_bench("cleanup", str(tmp_path), "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert "5 leftover(s), 0 removed (dry run)" in dry.stdout, dry.stdout
    assert len(names(tmp_path)) == 6

    run = run_bench("cleanup", str(tmp_path), cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert not dead.exists() and "1 removed" in run.stdout, run.stdout
    assert all(p.exists() for p in (alive, other_host, fresh_other, legacy, mine))

    old = run_bench("cleanup", str(tmp_path), "--older-than", "1h", cwd=tmp_path)
    assert old.returncode == 0, old.stderr
    assert not other_host.exists() and not legacy.exists()
    assert alive.exists() and fresh_other.exists() and mine.read_bytes() == b"keep me"
    assert "its process is running" in old.stdout


def test_a_managers_root_is_searched_in_its_step_directories(tmp_path: Path) -> None:
    """A killed rank leaves its temporary inside ``step-<n>/``: cleanup of the manager's root
    said "0 leftover(s)" and left it. Other directories are not searched."""
    (tmp_path / "step-5").mkdir()
    (tmp_path / "step-5" / "OWNER.json").write_text("{}")
    dead = temp(tmp_path / "step-5", dead_pid())
    alive = temp(tmp_path / "step-5", os.getpid())
    (tmp_path / "data").mkdir()
    theirs = temp(tmp_path / "data", dead_pid())  # not a step directory: not the manager's
    run = run_bench("cleanup", str(tmp_path), cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "2 leftover(s), 1 removed" in run.stdout, run.stdout
    assert str(dead) in run.stdout and not dead.exists()
    assert alive.exists() and theirs.exists() and (tmp_path / "step-5" / "OWNER.json").exists()


def test_aside_names_of_replaced_files_follow_the_owner_rule(tmp_path: Path) -> None:
    """An overwrite links the replaced file to a hidden aside name before its rename; one a
    dead save left is collected like its temporaries, a live one's and a user's never."""
    (tmp_path / "ck.bin").write_bytes(b"published")
    dead = temp(tmp_path, dead_pid(), suffix=".replaced")
    alive = temp(tmp_path, os.getpid(), age_s=2 * HOUR, suffix=".replaced")
    mine = tmp_path / ".ck.bin.replaced"
    mine.write_bytes(b"keep me")

    dry = run_bench("cleanup", str(tmp_path / "ck.bin"), "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert "2 leftover(s), 0 removed (dry run)" in dry.stdout, dry.stdout
    assert "replaced file" in dry.stdout, dry.stdout

    run = run_bench("cleanup", str(tmp_path), "--older-than", "1h", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert not dead.exists() and "1 removed" in run.stdout, run.stdout
    assert alive.exists() and mine.read_bytes() == b"keep me"
    assert (tmp_path / "ck.bin").read_bytes() == b"published"


def test_a_path_that_does_not_exist_is_an_error_unless_a_save_to_it_left_something(tmp_path: Path) -> None:
    """``cleanup /nonexistent`` printed "0 leftover(s), 0 removed" and rc 0: a mistyped path
    looked clean. A checkpoint path whose save died before publishing it is still searched."""
    run = run_bench("cleanup", str(tmp_path / "nowhere"), cwd=tmp_path)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert run.stderr.startswith("asyncckpt.bench cleanup: error: no such file or directory")
    assert repr(str(tmp_path / "nowhere")) in run.stderr and len(run.stderr.splitlines()) == 1
    dead = temp(tmp_path, dead_pid())  # a save of tmp_path/ck.bin, killed before it published
    unpublished = run_bench("cleanup", str(tmp_path / "ck.bin"), cwd=tmp_path)
    assert unpublished.returncode == 0 and "1 leftover(s), 1 removed" in unpublished.stdout
    assert not dead.exists()


def test_a_bad_age_is_refused_before_anything(tmp_path: Path) -> None:
    dead = temp(tmp_path, dead_pid())
    run = run_bench("cleanup", str(tmp_path), "--older-than", "soon", cwd=tmp_path)
    assert run.returncode == 2 and "--older-than must be a duration" in run.stderr
    assert dead.exists()


def test_pending_s3_uploads_under_a_prefix(moto_endpoint: S3Endpoint, tmp_path: Path) -> None:
    bucket = new_bucket(moto_endpoint)
    s3 = moto_endpoint.client()
    ours = s3.create_multipart_upload(Bucket=bucket, Key="run1/rank0.bin")["UploadId"]
    s3.create_multipart_upload(Bucket=bucket, Key="other/rank0.bin")
    env = moto_endpoint.env()

    kept = run_bench("cleanup", f"s3://{bucket}/run1/", cwd=tmp_path, env=env)
    assert kept.returncode == 0, kept.stderr
    assert "owner unknown: give --older-than" in kept.stdout and "0 removed" in kept.stdout

    gone = run_bench("cleanup", f"s3://{bucket}/run1/", "--older-than", "0s", cwd=tmp_path, env=env)
    assert gone.returncode == 0, gone.stderr
    left = {(u["Key"], u["UploadId"]) for u in s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])}
    assert ("run1/rank0.bin", ours) not in left
    assert [k for k, _ in left] == ["other/rank0.bin"]  # outside the prefix: untouched


def test_an_exited_but_unreaped_owner_is_dead() -> None:
    """A zombie (exited, not yet reaped, as orphans are under a PID 1 that does not reap)
    still answers kill(pid, 0); it owns nothing any more."""
    from asyncckpt.owner import Owner

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # exited; left unreaped: a zombie
    try:
        assert Owner("x", host(), boot_id(), proc.pid).state() == "dead"
    finally:
        proc.wait()
    assert Owner("x", host(), boot_id(), os.getpid()).state() == "alive"

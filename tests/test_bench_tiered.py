"""``python -m asyncckpt.bench TARGET --local DIR``: a tiered run measured, in a fresh
interpreter, on files; bad input is one line and rc 2, before any I/O."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import run_bench


def roots(tmp_path: Path) -> tuple[Path, Path]:
    local, remote = tmp_path / "local", tmp_path / "remote"
    local.mkdir()
    remote.mkdir()
    return local, remote


def test_a_tiered_run_reports_local_and_remote_durable_and_drain_rate(tmp_path: Path) -> None:
    local, remote = roots(tmp_path)
    out = tmp_path / "out.json"
    args = (str(remote), "--local", str(local), "--size", "3MiB", "--chunk-size", "1MiB", "--repeat", "2")
    proc = run_bench(*args, "--json", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (
        "local durable s" in proc.stdout and "remote durable s" in proc.stdout and "drain GB/s" in proc.stdout
    )
    doc = json.loads(out.read_text())
    assert doc["mode"] == "tiered" and doc["summary"]["remote_committed"] == 2
    median = next(line.split() for line in proc.stdout.splitlines() if line.startswith("median"))
    summary = doc["summary"]  # the row a report quotes: the JSON's medians, as printed
    assert [float(v) for v in median[1:4]] == [
        round(summary[k], 3)
        for k in ("local_commit_s_median", "remote_commit_s_median", "drain_gb_per_s_median")
    ]
    assert median[4:] == ["2", "of", "2", "remote-committed"]
    for step in doc["steps"]:
        assert step["state"] == "remote-committed" and step["bytes_drained"] >= 3 << 20
        assert step["remote_commit_s"] >= step["local_commit_s"] > 0 and step["drain_gb_per_s"] > 0
    assert list(local.iterdir()) == [] and list(remote.iterdir()) == []  # its steps are removed


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--mode", "load"), "does not take --mode load"),
        (("--method", "preallocate"), "does not take --method"),
        (("--integrity", "none"), "--integrity must be crc32c"),
    ],
)
def test_bad_tiered_input_is_one_line_and_rc_2(tmp_path: Path, extra: tuple[str, ...], message: str) -> None:
    local, remote = roots(tmp_path)
    proc = run_bench(str(remote), "--local", str(local), "--size", "1MiB", *extra, cwd=tmp_path)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_roots_that_overlap_do_not_exist_or_hold_steps_are_refused(tmp_path: Path) -> None:
    local, remote = roots(tmp_path)
    cases = [
        ((str(remote), "--local", str(remote / "inside")), "must be an existing local directory"),
        ((str(tmp_path), "--local", str(local)), "overlap"),
    ]
    (remote / "step-7").mkdir()
    cases.append(((str(remote), "--local", str(local)), "already holds steps [7]"))
    for args, message in cases:
        proc = run_bench(*args, "--size", "1MiB", cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr
        assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert sorted(p.name for p in remote.iterdir()) == ["step-7"] and list(local.iterdir()) == []

"""The benchmark CLI's load phase, run as users run it (a real subprocess on real files)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    size = [] if "load" in args else ["--size", "6MiB"]  # a load reads the saved size
    cmd = [sys.executable, "-m", "asyncckpt.bench", *size, "--chunk-size", "1MiB", "-q", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def test_both_saves_then_loads_and_cleans_up(tmp_path: Path) -> None:
    target, out = tmp_path / "ck.bin", tmp_path / "r.json"
    run = bench(
        str(target), "--num-checkpoints-write", "2", "--num-checkpoints-read", "3", "--json", str(out)
    )
    assert run.returncode == 0, run.stderr
    data = json.loads(out.read_text())
    assert [r["operation"] for r in data["results"]] == ["save"] * 2 + ["load"] * 3
    assert data["summary"]["load"]["runs"] == 3 and data["summary"]["streaming"]["runs"] == 2
    assert all(r["metadata"]["extra"]["verify"] == "checksum" for r in data["results"][2:])
    assert "save (streaming)" in run.stdout and "throughput (mean ± stdev)" in run.stdout
    assert list(tmp_path.iterdir()) == [out]  # checkpoint and manifest deleted


def test_save_keep_then_load_only(tmp_path: Path) -> None:
    target = tmp_path / "ck.bin"
    assert bench(str(target), "--mode", "save", "--keep").returncode == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck.bin"]
    run = bench(
        str(target),
        "--mode",
        "load",
        "--verify",
        "regenerate",
        "--num-readers",
        "2",
        "--num-checkpoints-read",
        "1",
    )
    assert run.returncode == 0, run.stderr
    assert "load" in run.stdout and target.exists()  # a load-only run never deletes


def test_load_errors_are_reported(tmp_path: Path) -> None:
    run = bench("--mode", "load")
    assert run.returncode == 2 and "--mode load needs a TARGET" in run.stderr
    run = bench(str(tmp_path / "x.bin"), "--num-checkpoints-read", "0")
    assert run.returncode == 2 and "--num-checkpoints-read must be >= 1" in run.stderr
    (tmp_path / "orphan.bin").write_bytes(bytes(4096))
    run = bench(str(tmp_path / "orphan.bin"), "--mode", "load")
    assert run.returncode == 1 and "has no manifest" in run.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="--drop-caches needs root (CI runs as root)")
def test_drop_caches_as_root(tmp_path: Path) -> None:
    run = bench(str(tmp_path / "ck.bin"), "--drop-caches", "--allow-cache")
    assert run.returncode == 0, run.stderr

"""benchmarks/bench_fio.py runs as documented: without fio it says how to install it (exit 2);
with fio a small run sweeps, alternates and reports a verdict for the library's defaults."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .launch import ROOT, child_env

SCRIPT = ROOT / "benchmarks" / "bench_fio.py"


def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(SCRIPT), *args]
    return subprocess.run(cmd, env=child_env(**env), capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_without_fio_it_says_how_to_install_it(tmp_path: Path) -> None:
    proc = run("--size", "64MiB", "--dir", str(tmp_path), PATH=str(tmp_path))  # no fio on PATH
    assert proc.returncode == 2, proc.stderr
    assert "apt-get install -y fio" in proc.stderr
    assert list(tmp_path.iterdir()) == []  # nothing measured, nothing written


def test_small_run_reports_verdicts_for_the_defaults(disk_path: Path) -> None:
    if shutil.which("fio") is None:
        pytest.skip("fio not installed: run tests/setup_system.sh (apt-get install -y fio)")
    args = ["--size", "32MiB", "--pairs", "5", "--engines", "libaio", "--depths", "1,2", "--sweep-reps", "1"]
    proc = run(*args, "--dir", str(disk_path))
    assert proc.returncode == 0, proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout[proc.stdout.index("\n{") :])
    assert doc["benchmark"] == "fio"
    assert doc["asyncckpt"]["tuning"] == "none: library defaults"
    assert doc["asyncckpt"]["writes_in_flight"] == doc["asyncckpt"]["file_default_in_flight"]
    assert doc["asyncckpt"]["reads_in_flight"] == doc["asyncckpt"]["file_default_in_flight"]
    assert doc["block_bytes"] == doc["asyncckpt"]["chunk_size"]
    assert {best["depth"] for best in doc["fio_best"].values()} <= {1, 2}
    sweep = [r for r in doc["rows"] if r["phase"] == "sweep"]
    assert len(sweep) == 4  # write and read at depths 1 and 2
    for op in ("save", "load"):
        verdict = doc[op]
        assert verdict["pairs"] == 5 and len(verdict["ratios"]) == 5
        assert all(r > 0 for r in verdict["ratios"])
        assert verdict["verdict"] in {"met", "not met", "not demonstrated"}
        assert verdict["target"] == ">= 0.95"
    assert list(disk_path.iterdir()) == []  # its temporary directory and files are gone

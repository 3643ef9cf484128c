"""An MPI run's result file: schema, per-rank plots with the straggler, HTML, compare."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .result_schema import assert_valid
from .test_mpi import ROOT, mpirun
from .test_results import check_self_contained

pytestmark = [
    pytest.mark.mpi,
    pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not found: run tests/setup_system.sh"),
]


def test_mpi_result_validates_and_plots(tmp_path: Path) -> None:
    out, plots, page = tmp_path / "m.json", tmp_path / "plots", tmp_path / "m.html"
    args = (str(tmp_path / "t"), "--size", "2MiB", "--chunk-size", "1MiB", "--repeat", "2", "-q")
    proc = mpirun(*args, "--json", str(out), "--plots", str(plots), "--report", str(page))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert_valid(report)
    assert report["mode"] == "mpi" and report["launcher"] == "mpi" and report["world_size"] == 2
    names = sorted(p.name for p in plots.iterdir())
    assert names == [
        "checkpoints-1-save-streaming.png",
        "checkpoints-2-load-streaming.png",
        "ranks-1-save-streaming.png",
        "ranks-2-load-streaming.png",
    ]
    assert all(p.stat().st_size > 5000 for p in plots.iterdir())
    check_self_contained(page.read_text())
    again = subprocess.run(
        [sys.executable, "-m", "asyncckpt.bench", "compare", str(out), str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert again.returncode == 0, again.stderr
    assert "min rank throughput" in again.stdout and "n=2 vs 2 is too few" in again.stdout


def test_mpi_csv_is_refused_before_io(tmp_path: Path) -> None:
    proc = mpirun(
        str(tmp_path / "t"), "--size", "1MiB", "--chunk-size", "1MiB", "--csv", str(tmp_path / "x.csv")
    )
    assert proc.returncode == 2 and "MPI run does not gather per-chunk records" in proc.stderr
    assert not (tmp_path / "t").exists()

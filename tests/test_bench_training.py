"""benchmarks/bench_training.py's sham control (issue 26): with ``--sham``, the ``no_checkpoint``
method compares the steps after each moment that saves nothing with the steps at the same
offsets after the next one, so the table gives the measurement's own noise floor beside the
methods' ``slowdown_vs_sham``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .launch import ROOT, child_env

pytest.importorskip("torch")

SCRIPT = ROOT / "benchmarks" / "bench_training.py"


def test_no_checkpoint_gives_the_sham_noise_floor(tmp_path: Path) -> None:
    every, checkpoints = 8, 2
    cmd = [
        *(sys.executable, str(SCRIPT), "--state-size", "4MiB", "--every", str(every)),
        *("--checkpoints", str(checkpoints), "--methods", "no_checkpoint", "--sham"),
        *("--repeats", "1", "--dir", str(tmp_path)),
    ]
    proc = subprocess.run(cmd, env=child_env(), capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc: dict[str, Any] = json.loads(proc.stdout[proc.stdout.index("\n{") :])
    (run,) = doc["runs"]
    # every step of each interval after a "real" moment, against its twin after the sham one
    # (the run ends one step before the moment after its last sham: that interval has one less)
    assert run["steps_vs_sham"] == checkpoints * every - 1
    (row,) = doc["rows"]
    assert row["method"] == "no_checkpoint"
    assert isinstance(row["slowdown_vs_sham"], float)
    assert abs(row["slowdown_vs_sham"]) < 1.0  # a ratio of like step times, not a count
    assert list(tmp_path.iterdir()) == []  # nothing left behind

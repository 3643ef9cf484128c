"""A benchmark given a directory that does not exist says so and exits 2 before any I/O
(it used to end in a raw FileNotFoundError traceback from ``tempfile``, after the saves)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .launch import ROOT, child_env

DIRECTORY_OPTIONS = {
    "bench_cpu_cost.py": "--tmpfs",
    "bench_dcp_stock.py": "--dir",
    "bench_fio.py": "--dir",
    "bench_first_save.py": "--dir",
    "bench_isolation.py": "--dir",
    "bench_load.py": "--dir",
    "bench_loop_lag.py": "--dir",
    "bench_memory.py": "--dir",
    "bench_overwrite.py": "--dir",
    "bench_pipeline.py": "--dir",
    "bench_read_shape.py": "--dir",
    "bench_reshard.py": "--target",
    "bench_tiers.py": "--dir",
    "bench_verify_cost.py": "--dir",
}


@pytest.mark.parametrize("script", sorted(DIRECTORY_OPTIONS))
def test_a_missing_directory_is_a_usage_error(script: str, tmp_path: object) -> None:
    missing = f"{tmp_path}/no-such-dir"
    option = DIRECTORY_OPTIONS[script]
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), option, missing],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"argument {option}: '{missing}' does not exist" in done.stderr
    assert "Traceback" not in done.stderr

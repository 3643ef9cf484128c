"""A benchmark given a directory that does not exist says so and exits 2 before any I/O
(it used to end in a raw FileNotFoundError traceback from ``tempfile``, after the saves); so
does a count that is not a positive integer (``--num-buffers 0`` used to be ignored)."""

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


def bench(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


#: further directory options: bench_tiers' --remote (a directory, or a URI taken as it is)
MORE_DIRECTORY_OPTIONS = [("bench_tiers.py", "--remote")]


@pytest.mark.parametrize(("script", "option"), [*sorted(DIRECTORY_OPTIONS.items()), *MORE_DIRECTORY_OPTIONS])
def test_a_missing_directory_is_a_usage_error(script: str, option: str, tmp_path: object) -> None:
    missing = f"{tmp_path}/no-such-dir"
    done = bench(script, option, missing)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"argument {option}: '{missing}' does not exist" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("script", "args", "bad"),
    [
        ("bench_verify_cost.py", ("--num-buffers", "0"), "'0' is not a positive integer"),
        ("bench_verify_cost.py", ("--max-in-flight", "x"), "'x' is not a positive integer"),
        ("bench_read_shape.py", ("--arms", "32MiB:4,4MiB:0"), "item '4MiB:0'"),
    ],
)
def test_a_count_below_one_is_a_usage_error(script: str, args: tuple[str, ...], bad: str) -> None:
    done = bench(script, *args)
    assert done.returncode == 2, done.stderr[-2000:]
    assert bad in done.stderr and "Traceback" not in done.stderr

"""``python -m asyncckpt.bench ... | head -1``: the reader of stdout goes away before the report
is printed. The bench exits quietly like other Unix tools (rc 141, no traceback) and a run
still removes what it wrote. The reader is closed before the child starts, so every write to
stdout meets a closed pipe: no timing involved."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT, run_bench

SMALL = ("--size", "1MiB", "--chunk-size", "1MiB")


def bench_into_closed_pipe(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [sys.executable, "-m", "asyncckpt.bench", *args],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            cwd=cwd,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    finally:
        os.close(write_end)


@pytest.fixture
def result(tmp_path: Path) -> Path:
    proc = run_bench(
        str(tmp_path / "r.bin"), *SMALL, "--mode", "save", "-q", "--json", "r.json", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    return tmp_path / "r.json"


@pytest.mark.parametrize("quiet", [(), ("-q",)])
def test_a_run_whose_reader_left_exits_quietly_and_cleans_up(tmp_path: Path, quiet: tuple[str, ...]) -> None:
    target = tmp_path / "data"
    target.mkdir()
    proc = bench_into_closed_pipe(str(target / "x.bin"), *SMALL, *quiet, cwd=tmp_path)
    assert (proc.returncode, proc.stderr) == (141, ""), proc.stderr
    assert list(target.iterdir()) == []  # the checkpoint and its manifest were removed


@pytest.mark.parametrize("command", [["report"], ["compare", "{0}"]])
def test_report_and_compare_whose_reader_left_exit_quietly(result: Path, command: list[str]) -> None:
    args = [command[0], str(result), *(a.format(result) for a in command[1:])]
    proc = bench_into_closed_pipe(*args, cwd=result.parent)
    assert (proc.returncode, proc.stderr) == (141, ""), proc.stderr

"""Issue 25: what a new user and an adversary hit on the bench CLI.

Bad input and unusable targets are one line on stderr and exit 2 before any I/O; a run leaves
no folder it made behind; small grammar and documentation faults. Read-only file systems are
real (a tmpfs mounted ``ro``): root ignores mode bits, so a chmod'ed folder would refuse nothing.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from asyncckpt import AsyncCheckpointer, CheckpointConfig, ConfigError
from asyncckpt.sinks import BACKENDS

from .conftest import mount, run_bench

#: a llama3-8b workload run scaled down to seconds: one write, one read, no emulated compute
FAST_WORKLOAD = (
    *("--model", "llama3-8b", "--scale", "0.0001"),
    "++workload.checkpoint.time_between_checkpoints=0",
    "++workload.checkpoint.num_checkpoints_write=1",
    "++workload.checkpoint.num_checkpoints_read=1",
)


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[Path]:
    """An empty tmpfs mounted read-only (unmounted after the test)."""
    mnt = tmp_path / "ro"
    mnt.mkdir()
    if not mount(mnt, "tmpfs", "ro,size=1m"):
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=True)


def one_line_error(run: subprocess.CompletedProcess[str], *needles: str) -> str:
    """Exit 2, one line on stderr holding every needle, no traceback; returns the line."""
    assert run.returncode == 2, (run.returncode, run.stderr)
    assert "Traceback" not in run.stderr, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


# -- 3: an unknown backend -----------------------------------------------------------------------


def test_unknown_backend_is_a_config_error_naming_the_choices(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="nosuchbackend") as info:
        CheckpointConfig(backend="nosuchbackend")
    for name in BACKENDS:
        assert name in str(info.value)
    with pytest.raises(ConfigError, match="aiobotocore"):
        AsyncCheckpointer(backend="nosuchbackend")
    run = run_bench(str(tmp_path / "x.bin"), "--backend", "nosuchbackend", "--size", "1MiB", cwd=tmp_path)
    one_line_error(run, "nosuchbackend", "file", "aiobotocore")
    assert list(tmp_path.iterdir()) == []

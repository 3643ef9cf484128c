"""SIGTERM (what schedulers send) and SIGINT end a bench run the same way: everything the run
wrote is removed, one line on stderr, rc 128 + the signal. Real child processes, real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from asyncckpt.owner import owned_dir_prefix

from .conftest import ROOT

PLAIN = ["--size", "256MiB", "--chunk-size", "8MiB", "--num-buffers", "2", "--repeat", "100"]
WORKLOAD = [
    *("--model", "llama3-8b", "--scale", "0.01", "--chunk-size", "8MiB", "--num-buffers", "2"),
    "++workload.checkpoint.time_between_checkpoints=0",
    "++workload.checkpoint.num_checkpoints_write=50",
    "++workload.checkpoint.num_checkpoints_read=0",
]


def files_under(root: Path) -> list[str]:
    return [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs]


def _sigint_as_at_a_terminal() -> None:
    """SIGINT back to its default in the child: a suite started as a background job (``cmd &``
    in a script) has SIGINT ignored, the child inherits that, and the bench rightly leaves an
    ignored SIGINT ignored; these tests are about a user's Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(args: list[str], tmp: Path) -> subprocess.Popen[str]:
    """The real CLI with its temporary directory (``TMPDIR``) in ``tmp``."""
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "asyncckpt.bench", *args, "-q"],
        cwd=tmp.parent,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_sigint_as_at_a_terminal,
    )


def wait_until_writing(proc: subprocess.Popen[str], tmp: Path, deadline_s: float = 60) -> None:
    """Poll until the run has a file in a folder of its own under ``tmp`` (it is writing
    checkpoints). A file directly in ``tmp`` is not the run's: Python's ``tempfile`` creates and
    unlinks one there to find a writable temporary directory, before the run's folder exists."""
    end = time.monotonic() + deadline_s
    while not [f for f in files_under(tmp) if Path(f).parent != tmp]:
        assert proc.poll() is None, f"the run ended before writing: rc {proc.returncode}"
        assert time.monotonic() < end, "no file written in time"
        time.sleep(0.02)  # polling interval, not synchronisation: the condition is the file


@pytest.mark.parametrize("kind", ["plain", "workload"])
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_mid_run_removes_everything_the_run_wrote(
    tmp_path: Path, kind: str, sig: signal.Signals, code: int
) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = start(PLAIN if kind == "plain" else WORKLOAD, tmp)
    try:
        wait_until_writing(proc, tmp)
        proc.send_signal(sig)
        err = proc.communicate(timeout=60)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == code, err
    assert os.listdir(tmp) == [], files_under(tmp)  # no asyncckpt-bench-* / asyncckpt-dlio-* left
    assert "Traceback" not in err
    said = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("[asyncckpt]")]
    assert len(said) == 1 and said[0].startswith("asyncckpt.bench: "), err
    assert ("terminated" if sig == signal.SIGTERM else "interrupted") in said[0]


@pytest.mark.parametrize("kind", ["plain", "workload"])
def test_a_run_removes_what_a_killed_run_left_in_its_temporary_folder(tmp_path: Path, kind: str) -> None:
    """SIGKILL (the OOM killer, a scheduler's last resort) lets no ``finally`` run: the killed
    run's folder stayed in TMPDIR with its partial checkpoint (1 GiB for the default run) until
    the machine restarted. The next run of this host removes it; a folder whose run is alive,
    and one of another name, stay."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = start(PLAIN if kind == "plain" else WORKLOAD, tmp)
    try:
        wait_until_writing(proc, tmp)
    finally:
        proc.kill()
        proc.communicate()
    (killed,) = os.listdir(tmp)  # with its partial checkpoint
    assert files_under(tmp / killed)
    prefix = "asyncckpt-bench-" if kind == "plain" else "asyncckpt-dlio-"
    alive = tmp / f"{owned_dir_prefix(prefix)}live0001"  # this test's own pid: a run in progress
    alive.mkdir()
    (alive / "checkpoint.bin").write_bytes(b"in progress")
    users = tmp / f"{prefix}mine"
    users.mkdir()
    once = [*WORKLOAD[:-2], "++workload.checkpoint.num_checkpoints_write=1", WORKLOAD[-1]]
    second = start(["--size", "4MiB"] if kind == "plain" else once, tmp)
    err = second.communicate(timeout=120)[1]
    assert second.returncode == 0, err
    assert sorted(os.listdir(tmp)) == sorted([alive.name, users.name])
    assert (alive / "checkpoint.bin").read_bytes() == b"in progress"
    assert f"removed {tmp / killed}" in err and "left by a run that was killed" in err


INTERRUPT_DURING_IMPORT = """
import importlib.abc, os, runpy, signal, sys


AT = sys.argv[1]


class SigintOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == AT:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while the CLI's modules load
        return None


sys.meta_path.insert(0, SigintOnImport())
sys.argv = ["asyncckpt.bench", "--help"]
runpy.run_module("asyncckpt.bench", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("module", ["asyncckpt.bench.cli", "asyncckpt.engine", "numpy"])
def test_ctrl_c_while_the_cli_starts_is_one_line(tmp_path: Path, module: str) -> None:
    """A SIGINT as the CLI imports ``module`` (a real signal, at that instant): rc 130 and one
    line on stderr, never a traceback (it printed one)."""
    done = subprocess.run(
        [sys.executable, "-c", INTERRUPT_DURING_IMPORT, module],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_sigint_as_at_a_terminal,
    )
    assert done.returncode == 130, (done.returncode, done.stderr)
    assert done.stderr == "asyncckpt: interrupted (SIGINT) while starting; nothing was written\n"
    assert "usage" not in done.stdout

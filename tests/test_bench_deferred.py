"""``bench.signals.deferred`` holds SIGINT and SIGTERM back until its block ends, so a step
such as removing the run's directory is never stopped halfway (CI once found an empty
asyncckpt-bench-* directory left by a SIGTERM between the last file and the directory).
Real child processes that signal themselves while another thread runs, as in a bench run
(executor threads): the kernel may hand the signal to that thread. A control without the
block shows that the signal does end the child at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from .conftest import ROOT

CHILD = """
import contextlib, os, signal, sys, threading
from asyncckpt.bench.signals import deferred
mode, signum, handler = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if handler == "python":
    signal.signal(signum, lambda s, f: sys.exit(100))
else:
    signal.signal(signum, signal.SIG_DFL)
parked = threading.Event()
threading.Thread(target=parked.wait, daemon=True).start()  # a second thread, as in a bench run
block = deferred() if mode == "deferred" else contextlib.nullcontext()
with block:
    os.kill(os.getpid(), signum)
    for _ in range(100_000):  # bytecodes, where a Python handler would run
        pass
    print("inside, after the signal", flush=True)
print("after the block", flush=True)
"""
EXIT = {"python": 100, "default": None}  # None: killed by the signal itself


def python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=60
    )


def run(mode: str, signum: int, handler: str) -> subprocess.CompletedProcess[str]:
    return python(CHILD, mode, str(signum), handler)


def expected_rc(signum: int, handler: str) -> int:
    code = EXIT[handler]
    return -signum if code is None else code


@pytest.mark.parametrize("handler", ["default", "python"])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_inside_the_block_waits_for_its_end(signum: int, handler: str) -> None:
    done = run("deferred", signum, handler)
    assert done.stdout.splitlines() == ["inside, after the signal"], done.stderr
    assert done.returncode == expected_rc(signum, handler)  # delivered on the way out


@pytest.mark.parametrize("handler", ["default", "python"])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_control_without_the_block_the_signal_ends_the_child_at_once(signum: int, handler: str) -> None:
    done = run("plain", signum, handler)
    assert done.stdout == "", done.stdout
    assert done.returncode == expected_rc(signum, handler)


def test_an_ignored_signal_stays_ignored() -> None:
    code = (
        "import os, signal\n"
        "from asyncckpt.bench.signals import deferred\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "with deferred():\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "print('still here', signal.getsignal(signal.SIGTERM) is signal.SIG_IGN)\n"
    )
    done = python(code)
    assert (done.returncode, done.stdout) == (0, "still here True\n"), done.stderr

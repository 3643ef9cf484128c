"""The loop guard of ``conftest.py`` fails a test that blocks its event loop (it read only
the teardown phase's log records once, and so never failed one)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .conftest import ROOT


def run_guarded(tmp_path: Path, name: str, source: str) -> str:
    """The test module ``source`` run by pytest in a child, under the suite's loop guard; its output."""
    (tmp_path / "conftest.py").write_text("from tests.conftest import _no_blocking_in_loop  # noqa: F401\n")
    (tmp_path / name).write_text(source)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "asyncio_mode=auto", "-rE"],
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    return run.stdout + run.stderr


BLOCKING = """
import threading
import time


async def test_blocks() -> None:
    time.sleep(0.3)


async def test_computes() -> None:
    start = time.thread_time()
    while time.thread_time() - start < 0.3:  # 0.3 s of this thread's own CPU: never sleeps
        pass


async def test_yields() -> None:
    import asyncio

    await asyncio.sleep(0.3)


class LateThread(threading.Thread):
    def _bootstrap_inner(self) -> None:  # as a thread the machine schedules 0.3 s late
        time.sleep(0.3)
        super()._bootstrap_inner()


async def test_starts_a_thread_that_runs_late() -> None:
    thread = LateThread(target=lambda: None)
    thread.start()  # waits until the new thread runs: the loop's thread did not block
    thread.join(0)


async def test_starts_a_thread_then_blocks() -> None:
    thread = LateThread(target=lambda: None)
    thread.start()
    time.sleep(0.3)
"""


def test_a_test_that_blocks_its_loop_fails(tmp_path: Path) -> None:
    out = run_guarded(tmp_path, "test_guarded.py", BLOCKING)
    assert "ERROR test_guarded.py::test_blocks - AssertionError: event loop was blocked" in out, out
    assert "ERROR test_guarded.py::test_computes - AssertionError: event loop was blocked" in out, out
    assert "ERROR test_guarded.py::test_starts_a_thread_then_blocks - AssertionError: eve" in out, out
    assert "5 passed, 3 errors" in out, out  # test_starts_a_thread_that_runs_late has none


GIL = """
import ctypes
import threading
import time

import pytest

LIBC = ctypes.PyDLL(None)  # a PyDLL's calls keep the GIL


def hold_the_gil(started: threading.Event) -> None:
    started.set()
    LIBC.usleep(300_000)  # 0.3 s holding the GIL


def another_thread_holds_it() -> None:
    started = threading.Event()
    threading.Thread(target=hold_the_gil, args=(started,)).start()
    started.wait()  # the loop's thread lets go of the GIL here and waits 0.3 s to get it back


@pytest.mark.gil_waits
async def test_waits_marked() -> None:
    another_thread_holds_it()


async def test_waits_unmarked() -> None:
    another_thread_holds_it()


class LateThread(threading.Thread):
    def _bootstrap_inner(self) -> None:  # scheduled 0.1 s late: the sampler sees Thread.start
        time.sleep(0.1)
        super()._bootstrap_inner()


@pytest.mark.gil_waits
async def test_waits_marked_after_a_late_start() -> None:
    started = threading.Event()
    LateThread(target=hold_the_gil, args=(started,)).start()  # as CI once ran it
    started.wait()


@pytest.mark.gil_waits
async def test_holds_it_itself_marked() -> None:
    LIBC.usleep(300_000)  # the loop's own blocking call, the GIL held: one sleep
"""


def test_a_wait_for_the_gil_another_thread_holds_is_left_out_only_where_marked(tmp_path: Path) -> None:
    out = run_guarded(tmp_path, "test_gil.py", GIL)
    for name in ("test_waits_unmarked", "test_holds_it_itself_marked"):
        assert f"ERROR test_gil.py::{name} - AssertionError: event loop w" in out, out
    # test_waits_marked and test_waits_marked_after_a_late_start among the passed
    assert "4 passed" in out and "2 errors" in out, out

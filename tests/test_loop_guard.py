"""The loop guard of ``conftest.py`` fails a test that blocks its event loop (it read only
the teardown phase's log records once, and so never failed one)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .conftest import ROOT

BLOCKING = """
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
"""


def test_a_test_that_blocks_its_loop_fails(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text("from tests.conftest import _no_blocking_in_loop  # noqa: F401\n")
    (tmp_path / "test_guarded.py").write_text(BLOCKING)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "asyncio_mode=auto", "-rE"],
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    out = run.stdout + run.stderr
    assert "ERROR test_guarded.py::test_blocks - AssertionError: event loop was blocked" in out, out
    assert "ERROR test_guarded.py::test_computes - AssertionError: event loop was blocked" in out, out
    assert "3 passed, 2 errors" in out, out

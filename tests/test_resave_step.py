"""Saving a step number that is already committed (a run rolled back to an earlier step and
trains through it again). A crash after the new object replaced the old one, before the new
commit, left the old commit record naming an object it never committed, and loads returned
the uncommitted state as step 5. Now the old record is withdrawn before any object is
replaced, so the step is uncommitted until the new commit; a real SIGKILL at that instant."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from asyncckpt import AsyncCheckpointer, IntegrityError, StepNotCommittedError
from asyncckpt.steps import COMMIT

from .conftest import ROOT

OPTIONS = {"chunk_size": 1 << 20, "num_buffers": 4}

#: re-saves step 5 with another state and SIGKILLs itself as the step index is published:
#: every object of the step is durable, its commit is not written yet
CHILD = """
import asyncio, os, signal, sys
import numpy as np
from asyncckpt import AsyncCheckpointer
real = os.replace
def replace(src, dst, *a, **k):
    if str(dst).endswith("asyncckpt-index.json"):
        os.kill(os.getpid(), signal.SIGKILL)
    return real(src, dst, *a, **k)
os.replace = replace
async def main():
    async with AsyncCheckpointer(chunk_size=1 << 20, num_buffers=4) as ckpt:
        await ckpt.save_step(sys.argv[1], 5, {"w": np.full(6, 2.0, np.float32), "extra": np.zeros(3)})
asyncio.run(main())
"""


def resave_and_crash(root: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", CHILD, str(root)], env=env, capture_output=True, timeout=60)
    assert done.returncode == -9, done.stderr  # killed at the chosen instant


async def test_a_crash_while_a_committed_step_is_saved_again_leaves_it_uncommitted(tmp_path: Path) -> None:
    async with AsyncCheckpointer(**OPTIONS) as ckpt:
        await ckpt.save_step(tmp_path, 4, {"w": np.full(4, 0.5, np.float32)})
        await ckpt.save_step(tmp_path, 5, {"w": np.full(4, 1.0, np.float32)})
    await asyncio.to_thread(resave_and_crash, tmp_path)
    async with AsyncCheckpointer(**OPTIONS) as ckpt:
        assert await ckpt.latest_step(tmp_path) == 4
        with pytest.raises(StepNotCommittedError, match="step 5"):
            await ckpt.load_step(tmp_path, 5)
        loaded = await ckpt.load_step(tmp_path)
    assert loaded.step == 4 and np.array_equal(loaded.state["w"], np.full(4, 0.5, np.float32))


async def test_control_a_finished_save_again_commits_the_new_state(tmp_path: Path) -> None:
    async with AsyncCheckpointer(**OPTIONS) as ckpt:
        await ckpt.save_step(tmp_path, 5, {"w": np.full(4, 1.0, np.float32)})
        await ckpt.save_step(tmp_path, 5, {"w": np.full(6, 2.0, np.float32)})
        loaded = await ckpt.load_step(tmp_path, 5)
    assert np.array_equal(loaded.state["w"], np.full(6, 2.0, np.float32))


async def test_a_record_over_another_object_is_refused_before_any_byte_is_loaded(tmp_path: Path) -> None:
    """A commit record put back by hand over other objects: the size it names differs."""
    async with AsyncCheckpointer(**OPTIONS) as ckpt:
        await ckpt.save_step(tmp_path, 5, {"w": np.full(4, 1.0, np.float32)})
        record = (tmp_path / "step-5" / COMMIT).read_text()
        await ckpt.save_step(tmp_path, 5, {"w": np.full(6, 2.0, np.float32)})
        (tmp_path / "step-5" / COMMIT).write_text(record)
        into = {"w": np.zeros(4, np.float32)}
        with pytest.raises(IntegrityError, match="not the object that was committed"):
            await ckpt.load_step(tmp_path, 5, into=into)
    assert not into["w"].any()
    assert json.loads(record)["sizes"][0] != (tmp_path / "step-5" / "rank-0-of-1.safetensors").stat().st_size

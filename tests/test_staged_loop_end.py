"""A ``staging="host"`` save whose event loop ends first (issue 25 item 11).

Before the fix such a save was lost silently: ``asyncio.run`` cancelled its background write,
nothing was logged, and awaiting the handle later raised ``CancelledError``; a loop closed
without cancelling it left ``aclose()`` waiting forever. Now the dropped save logs an error
naming its URI, awaiting it raises ``SaveAbandonedError``, ``aclose()`` (checkpointer and
manager) waits for a save that can still finish and says which were abandoned, and nothing
half-written is visible. The tests are plain functions that run their own loops.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors.numpy

from asyncckpt import AsyncCheckpointer, CheckpointManager, SaveAbandonedError
from asyncckpt.state.results import StagedSave
from asyncckpt.steps import latest_step
from asyncckpt.units import MiB

CHUNKS = 32  # the write needs many loop iterations: the loop cannot end after it


def _state() -> dict[str, Any]:
    """Built by the sync test, not on a loop: 32 MiB of arange took 0.13 s on a busy machine,
    which the loop guard (tests/loop_guard.py) counts as a blocked loop."""
    return {"w": np.arange(CHUNKS * MiB // 4, dtype=np.float32)}


def _ckpt() -> AsyncCheckpointer:
    return AsyncCheckpointer(chunk_size=MiB, num_buffers=4)


def _errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


async def _start_writing(ckpt: AsyncCheckpointer, uri: str, state: dict[str, Any]) -> StagedSave:
    """A staged save whose background write has written its first chunk."""
    first = asyncio.Event()
    staged = await ckpt.save_state(uri, state, staging="host", progress=lambda n: first.set())
    await first.wait()
    return staged


def test_a_staged_save_dropped_by_its_loop_is_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    uri = str(tmp_path / "dropped.safetensors")
    ckpt = _ckpt()
    state = _state()
    staged = asyncio.run(_start_writing(ckpt, uri, state))  # returns mid-write: the loop cancels it
    assert any(uri in e and "abandoned" in e for e in _errors(caplog)), _errors(caplog)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing half-written, no temp file
    with pytest.raises(SaveAbandonedError, match=r"dropped\.safetensors"):
        asyncio.run(staged.wait())  # not CancelledError
    assert staged.done() and staged.abandoned()

    async def next_loop() -> None:  # the area is usable again, and aclose waits for its save
        await ckpt.save_state(str(tmp_path / "next.safetensors"), state, staging="host")
        await ckpt.aclose()

    asyncio.run(next_loop())
    np.testing.assert_array_equal(safetensors.numpy.load_file(tmp_path / "next.safetensors")["w"], state["w"])


@pytest.mark.timeout(30)
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.filterwarnings("ignore:coroutine .* was never awaited:RuntimeWarning")
def test_aclose_after_a_loop_closed_without_cancelling_its_save(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``loop.close()`` after ``run_until_complete`` leaves the write pending on a dead loop:
    it can never finish, so ``aclose()`` must say so instead of waiting for it (it hung)."""
    uri = str(tmp_path / "orphan.safetensors")
    ckpt = _ckpt()
    loop = asyncio.new_event_loop()
    try:
        staged = loop.run_until_complete(_start_writing(ckpt, uri, _state()))
    finally:
        loop.close()
    asyncio.run(ckpt.aclose())
    assert any(uri in e and "abandoned" in e for e in _errors(caplog)), _errors(caplog)
    assert not Path(uri).exists()
    assert not staged.cancelled() and staged.abandoned() and staged.done()
    # the dead loop's pending tasks (the write's and the pipeline's) are reported by Python when
    # collected, as for any loop closed with tasks pending: collected here, under this filter
    del staged, loop
    gc.collect()


def test_a_manager_save_dropped_by_its_loop_is_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    mgr = CheckpointManager(tmp_path, staging="host", chunk_size=MiB, num_buffers=4)
    state = _state()

    async def main() -> None:
        assert await mgr.maybe_save(1, state)  # returns after the copy: the write is pending

    asyncio.run(main())
    errors = _errors(caplog)
    assert any("step 1" in e and "abandoned" in e for e in errors), errors
    assert any("step-1" in e and "abandoned" in e for e in errors), errors  # the object's URI
    assert mgr.stats.abandoned == [1] and mgr.stats.saved == []

    async def later() -> int | None:
        await mgr.aclose()  # nothing left to wait for: returns
        async with _ckpt() as fresh:
            return await latest_step(fresh, tmp_path)

    assert asyncio.run(later()) is None  # step 1 was never committed


def test_manager_aclose_waits_for_its_pending_save(tmp_path: Path) -> None:
    state = _state()

    async def main() -> None:
        mgr = CheckpointManager(tmp_path, staging="host", chunk_size=MiB, num_buffers=4)
        assert await mgr.maybe_save(1, state)
        await mgr.aclose()  # waits: the step commits before the loop ends
        assert mgr.stats.saved == [1]

    asyncio.run(main())

    async def check() -> int | None:
        async with _ckpt() as fresh:
            return await latest_step(fresh, tmp_path)

    assert asyncio.run(check()) == 1

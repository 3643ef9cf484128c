"""The checkpointer's own loop thread (synchronous callers, the PyTorch DCP integration).

anyio stops its worker threads when the task it takes for the loop's root finishes. Under
``run_forever`` each call was its own root, so every save started new worker threads and the
staged copy's second thread started milliseconds late; the loop now runs one root task until
``close()``.
"""

from __future__ import annotations

import threading

from asyncckpt.blocking import run_blocking
from asyncckpt.checkpointer import AsyncCheckpointer
from asyncckpt.config import CheckpointConfig
from asyncckpt.integrations.loop_thread import CheckpointerThread


async def _worker_id(ckpt: AsyncCheckpointer) -> int:
    return await run_blocking(ckpt.runtime.executor(), threading.get_native_id)


def test_worker_threads_outlive_each_call_and_end_with_close() -> None:
    owner = CheckpointerThread(CheckpointConfig(), "test-loop-thread")
    try:
        first = owner.run(_worker_id)
        assert owner.run(_worker_id) == first  # the same idle worker, not a new thread
        worker = next(t for t in threading.enumerate() if t.native_id == first)
    finally:
        owner.close()
    worker.join(timeout=30)  # close() ends the root task, and anyio stops its workers with it
    assert not worker.is_alive()
    assert not any(t.native_id == first for t in threading.enumerate())

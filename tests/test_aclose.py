"""aclose() never blocks the event loop: thread-budget shutdown and pool unmapping run off it."""

from __future__ import annotations

import threading

from asyncckpt import AsyncCheckpointer
from asyncckpt._blocking import Offload
from asyncckpt.pool import BufferPool
from asyncckpt.units import MiB


class RecordingOffload(Offload):
    def __init__(self, threads: int, seen: dict[str, int]) -> None:
        super().__init__(threads)
        self.seen = seen

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self.seen["shutdown"] = threading.get_ident()
        super().shutdown(wait, cancel_futures=cancel_futures)


class RecordingPool(BufferPool):
    def __init__(self, chunk_size: int, num_buffers: int, seen: dict[str, int]) -> None:
        super().__init__(chunk_size, num_buffers)
        self.seen = seen

    def close(self) -> None:
        self.seen["unmap"] = threading.get_ident()
        super().close()


class RecordingCheckpointer(AsyncCheckpointer):
    """Where the executor is shut down and the pool unmapped, by thread."""

    seen: dict[str, int]

    def _new_executor(self) -> Offload:
        return RecordingOffload(self.config.num_buffers + 2, self.seen)

    def _new_pool(self, shared: bool) -> BufferPool:
        assert not shared
        return RecordingPool(self.config.chunk_size, self.config.num_buffers, self.seen)


async def test_aclose_shuts_down_and_unmaps_off_the_loop_thread() -> None:
    ckpt = RecordingCheckpointer(chunk_size=1 * MiB, num_buffers=2)
    ckpt.seen = {}
    await ckpt.save("null://aclose", 4 * MiB)
    await ckpt.aclose()
    loop_thread = threading.get_ident()
    assert set(ckpt.seen) == {"shutdown", "unmap"}
    on_loop = sorted(what for what, thread in ckpt.seen.items() if thread == loop_thread)
    assert on_loop == [], f"ran on the event-loop thread: {on_loop}"

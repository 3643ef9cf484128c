"""aclose() never blocks the event loop: thread-budget shutdown and pool unmapping run off it."""

from __future__ import annotations

import asyncio
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from asyncckpt import AsyncCheckpointer
from asyncckpt.blocking import Offload
from asyncckpt.engine.runtime import Runtime
from asyncckpt.pool import BufferPool
from asyncckpt.sinks.base import SinkOptions
from asyncckpt.sinks.file import FileSink
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


class RecordingRuntime(Runtime):
    """Where the executor is shut down and the pool unmapped, by thread."""

    seen: dict[str, int]

    def new_executor(self) -> Offload:
        return RecordingOffload(self.config.num_buffers + 2, self.seen)

    def new_pool(self, shared: bool) -> BufferPool:
        assert not shared
        return RecordingPool(self.config.chunk_size, self.config.num_buffers, self.seen)


def RecordingCheckpointer(**options: object) -> AsyncCheckpointer:
    """A checkpointer whose runtime records where it shuts down and unmaps (its public
    factories, ``Runtime.new_executor`` / ``new_pool``, overridden)."""
    ckpt = AsyncCheckpointer(**options)
    ckpt.runtime.__class__ = RecordingRuntime  # before any use: nothing built yet
    return ckpt


async def test_aclose_shuts_down_and_unmaps_off_the_loop_thread() -> None:
    ckpt = RecordingCheckpointer(chunk_size=1 * MiB, num_buffers=2)
    ckpt.runtime.seen = {}  # type: ignore[attr-defined]
    await ckpt.save("null://aclose", 4 * MiB)
    await ckpt.aclose()
    loop_thread = threading.get_ident()
    assert set(ckpt.runtime.seen) == {"shutdown", "unmap"}
    on_loop = sorted(what for what, thread in ckpt.runtime.seen.items() if thread == loop_thread)
    assert on_loop == [], f"ran on the event-loop thread: {on_loop}"


class CountingExecutor(ThreadPoolExecutor):
    def __init__(self) -> None:
        super().__init__(1)
        self.calls = 0

    def submit(self, fn, /, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.calls += 1
        return super().submit(fn, *args, **kwargs)


async def test_a_file_sink_that_holds_nothing_closes_without_a_thread_hop(tmp_path: Path) -> None:
    """A staged save checks its target with a sink it then closes, while the caller is
    blocked: that close costs no thread hop (each was about 1 ms); one that holds a
    temporary still removes it in a thread."""
    executor = CountingExecutor()
    try:
        checked = FileSink(str(tmp_path / "ck"), executor=executor, options=SinkOptions())
        checked.check()
        await checked.aclose()
        assert executor.calls == 0
        opened = FileSink(str(tmp_path / "ck"), executor=executor, options=SinkOptions())
        await opened.open(MiB)
        assert opened.temp_path is not None and opened.temp_path.exists()
        before = executor.calls
        await opened.aclose()
        assert executor.calls > before
        assert await asyncio.to_thread(os.listdir, tmp_path) == []
    finally:
        executor.shutdown()

"""The stall watchdog with a storage call that never returns (a thread stuck in a library).

``HangSink`` blocks one call in a real executor thread until the test releases it, like a
client library waiting on a server that stopped answering. The watchdog must hand control
back within its deadline anyway, name the stuck stage, keep the first error over a stalled
abort, and never hand out again a buffer the stuck thread may still read.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from asyncckpt import AsyncCheckpointer, CheckpointConfig, ConfigError, StallError
from asyncckpt.blocking import run_blocking
from asyncckpt.sinks import BACKENDS, SCHEMES, register_backend
from asyncckpt.sinks.memory import MemorySink
from asyncckpt.units import MiB

CHUNK = 1 * MiB
STALL_S = 0.5


class HangSink(MemorySink):
    """A memory sink whose ``hang_in`` call blocks a worker thread until ``release`` is set."""

    backend = "hang"
    default_in_flight = 2
    in_process_memory = False  # its calls block like a client library's: watched
    hang_in = "write_part"
    hang_at = CHUNK  # the offset of the write (or read) that hangs
    release = threading.Event()
    stuck: list[memoryview] = []  # noqa: RUF012 - buffers held by stuck threads, per test

    async def _maybe_hang(self, call: str, view: memoryview | None = None, offset: int = -1) -> None:
        if call == HangSink.hang_in and offset in (-1, HangSink.hang_at):
            if view is not None:
                HangSink.stuck.append(view)
            await run_blocking(self.executor, HangSink.release.wait)

    async def write_part(self, offset: int, data: memoryview) -> float | None:
        await self._maybe_hang("write_part", data, offset)
        return await super().write_part(offset, data)

    async def complete(self) -> dict[str, float]:
        await self._maybe_hang("complete")
        return await super().complete()

    async def abort(self) -> None:
        await self._maybe_hang("abort")
        await super().abort()

    async def read_into(self, offset: int, buf: memoryview) -> int:
        await self._maybe_hang("read_into", buf, offset)
        return await super().read_into(offset, buf)


@pytest.fixture
def hang() -> Iterator[type[HangSink]]:
    saved_b, saved_s = dict(BACKENDS), dict(SCHEMES)
    register_backend("hang", HangSink, scheme="hang")
    HangSink.release = threading.Event()
    HangSink.stuck = []
    HangSink.hang_in, HangSink.hang_at = "write_part", CHUNK
    yield HangSink
    HangSink.release.set()  # the stuck thread finishes (its executor was retired)
    BACKENDS.clear(), BACKENDS.update(saved_b)
    SCHEMES.clear(), SCHEMES.update(saved_s)


def checkpointer(**kw: Any) -> AsyncCheckpointer:
    return AsyncCheckpointer(chunk_size=CHUNK, num_buffers=3, stall_timeout=STALL_S, **kw)


async def test_stuck_write_fails_in_time_and_its_buffer_is_never_reused(hang: type[HangSink]) -> None:
    async with checkpointer() as ckpt:
        started = time.monotonic()
        with pytest.raises(StallError) as info:
            await ckpt.save("hang://a", 6 * CHUNK)
        took = time.monotonic() - started
        stuck = hang.stuck[0]
        before = bytes(stuck)  # what the stuck thread is (still) sending
        assert info.value.stage == f"write part 2 (offset {CHUNK}, {CHUNK} bytes)"
        assert "hang://a (hang)" in str(info.value) and "stall_timeout=0.5 s" in str(info.value)
        assert isinstance(info.value, TimeoutError)
        old_pool = ckpt.runtime.pool_now
        # the checkpointer stays usable, with a fresh pool: were the old one reused, this
        # save's bytes would overwrite the buffer the stuck thread is still reading
        await ckpt.save("memory://b", 4 * CHUNK, data=b"\xab" * (4 * CHUNK))
        assert ckpt.runtime.pool_now is not old_pool
        assert bytes(stuck) == before
    assert took < STALL_S * 1.5 + 1.0, took
    hang.release.set()


async def test_stuck_complete_is_named(hang: type[HangSink]) -> None:
    hang.hang_in = "complete"
    async with checkpointer() as ckpt:
        with pytest.raises(StallError) as info:
            await ckpt.save("hang://c", 2 * CHUNK)
    assert info.value.stage == "complete"


async def test_stuck_abort_keeps_the_first_error(hang: type[HangSink]) -> None:
    hang.hang_in = "abort"

    def fail(nbytes: int) -> None:
        raise RuntimeError("training step failed")

    async with checkpointer() as ckpt:
        started = time.monotonic()
        with pytest.raises(RuntimeError, match="training step failed"):
            await ckpt.save("hang://d", 4 * CHUNK, progress=fail)
    assert time.monotonic() - started < STALL_S + 1.0  # the abort got half the budget


async def test_stuck_read_fails_the_load(hang: type[HangSink]) -> None:
    hang.hang_in = "read_into"
    async with checkpointer() as ckpt:
        await ckpt.save("hang://r", 4 * CHUNK)
        with pytest.raises(StallError) as info:
            await ckpt.load("hang://r")
    assert info.value.stage.startswith("read at offset")


async def test_slow_but_moving_storage_is_not_a_stall(hang: type[HangSink]) -> None:
    """Each write takes 0.3 s, two in flight, 0.5 s watchdog: progress keeps coming."""

    class Slow(HangSink):
        async def write_part(self, offset: int, data: memoryview) -> float | None:
            await run_blocking(self.executor, time.sleep, 0.3)
            return await MemorySink.write_part(self, offset, data)

    register_backend("slowhang", Slow, scheme="slowhang")
    async with checkpointer() as ckpt:
        result = await ckpt.save("slowhang://s", 6 * CHUNK)
    assert result.size_bytes == 6 * CHUNK


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), "20", True, None])
def test_stall_timeout_is_validated(bad: object) -> None:
    with pytest.raises(ConfigError, match="stall_timeout"):
        CheckpointConfig(stall_timeout=bad)  # type: ignore[arg-type]


def test_defaults_fail_a_stalled_save_within_30_s() -> None:
    """The documented bound: stall_timeout, then half of it for the abort and close."""
    from asyncckpt.sinks.watchdog import CLEANUP_SHARE

    assert CheckpointConfig().stall_timeout * (1 + CLEANUP_SHARE) <= 30.0

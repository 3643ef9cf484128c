"""Caller-supplied data: real checkpoint state streamed through the same pipeline.

Chunks handed to sinks must be full (file offsets stay aligned for O_DIRECT), so items of
any size are packed into whole buffers here; the copy runs in the executor, off the loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from concurrent.futures import Executor
from typing import Any

from ..blocking import run_blocking
from ..cpu import thread_cpu_call
from ..errors import ConfigError, IntegrityError
from .base import Source

Buffer = bytes | bytearray | memoryview
#: pieces smaller than this are copied on the loop's thread (a thread hop costs more)
INLINE_COPY = 1 << 20
#: items packed into one buffer between turns of the loop (each costs a few microseconds)
_YIELD_EVERY = 256
CallerData = Buffer | Iterable[Buffer] | AsyncIterable[Buffer]


def as_bytes_view(item: object) -> memoryview:
    """``item``'s bytes, flat; ConfigError naming its type when it has none to give (a str, a
    torch tensor: save_state takes tensors) or they are not contiguous."""
    try:
        view = memoryview(item)  # type: ignore[arg-type]
    except TypeError:
        raise ConfigError(
            f"data must be bytes-like (bytes, bytearray, memoryview, a contiguous NumPy array) or "
            f"an iterable of such, got {type(item).__name__}; save tensors with save_state"
        ) from None
    if not view.c_contiguous:
        raise ConfigError(
            f"data of type {type(item).__name__} is not C-contiguous; copy it first "
            "(numpy.ascontiguousarray) or save it with save_state"
        )
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def is_buffer(data: object) -> bool:
    try:
        memoryview(data)  # type: ignore[arg-type]
    except TypeError:
        return False
    return True


class CallerSource(Source):
    """Copies caller data into pooled buffers; checks it is exactly ``total_size`` bytes."""

    kind = "caller"

    def __init__(self, data: CallerData, total_size: int) -> None:
        super().__init__(total_size)
        self._pending = memoryview(b"")
        self._sync: Iterator[object] | None = None
        self._async: AsyncIterator[object] | None = None
        if is_buffer(data):
            self._pending = as_bytes_view(data)
            self._sync = iter(())
        elif isinstance(data, AsyncIterable):
            self._async = aiter(data)
        elif isinstance(data, Iterable):
            self._sync = iter(data)
        else:
            raise ConfigError(
                f"data must be bytes-like or a (sync/async) iterable of buffers, got {type(data).__name__}"
            )

    async def _next_item(self) -> memoryview | None:
        if self._async is not None:
            try:
                return as_bytes_view(await anext(self._async))
            except StopAsyncIteration:
                return None
        assert self._sync is not None
        try:
            return as_bytes_view(next(self._sync))
        except StopIteration:
            return None

    async def fill(self, buf: memoryview, executor: Executor) -> tuple[int, float]:
        start = time.perf_counter()
        want = min(len(buf), self.total_size - self.position)
        filled = items = 0
        while filled < want:
            if not self._pending:
                items += 1
                if items % _YIELD_EVERY == 0:  # thousands of small tensors in one chunk
                    await asyncio.sleep(0)
                item = await self._next_item()
                if item is None:
                    raise IntegrityError(
                        f"data ended after {self.position + filled} bytes, "
                        f"but size={self.total_size} was given"
                    )
                self._pending = item
            take = min(want - filled, len(self._pending))
            dst, src = buf[filled : filled + take], self._pending[:take]
            if take < INLINE_COPY:
                dst[:] = src  # tens of microseconds: cheaper than a thread hop
            else:
                _, cpu = await run_blocking(executor, thread_cpu_call, _copy, dst, src)
                self.cpu_s += cpu
            self._pending = self._pending[take:]
            filled += take
        self.position += filled
        if self.position == self.total_size and (self._pending or await self._next_item()):
            raise IntegrityError(f"data is longer than size={self.total_size}")
        return filled, time.perf_counter() - start

    def describe(self) -> dict[str, Any]:
        return {"generator": self.kind, "seed": None, "gen_threads": None}


def _copy(dst: memoryview, src: memoryview) -> None:
    dst[:] = src

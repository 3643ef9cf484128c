"""Bytes read from storage straight into the pipeline's buffers: the source of a drain.

A drain copies one tier's object to another. Handed over as caller data, each piece was read
into a buffer of its own and then copied into a pooled one, and only one read was ever
outstanding while the source waited for it: a memory copy and a serial read more than a save
from memory pays. :class:`ReadFrom` names the reading function instead, and the pipeline's
producer reads each chunk into the pooled, page-aligned buffer it will write from (so an
O_DIRECT read lands where the write takes it). The fill is storage I/O, not CPU work, so it
does not hold the CPU lane the checksums need (``Source.uses_cpu``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from ..blocking import read_full
from ..errors import IntegrityError
from .base import Source


@dataclass(frozen=True)
class ReadFrom:
    """Data to save read from storage: ``read_into(offset, view)`` fills ``view`` from
    ``offset`` and returns the bytes read (0 at the end). ``name`` says where the bytes come
    from, in errors; ``bandwidth``: at most this many bytes per second (None: uncapped)."""

    read_into: Callable[[int, memoryview], Awaitable[int]]
    name: str
    bandwidth: float | None = None


class ReaderSource(Source):
    """Fills each buffer by reading ``total_size`` bytes in order through a :class:`ReadFrom`."""

    kind = "reader"
    uses_cpu = False

    def __init__(self, spec: ReadFrom, total_size: int) -> None:
        super().__init__(total_size)
        self._spec = spec
        self._t0: float | None = None

    async def fill(self, buf: memoryview, executor: Executor) -> tuple[int, float]:
        start = time.perf_counter()
        if self._t0 is None:
            self._t0 = start
        want = min(len(buf), self.total_size - self.position)
        got = await read_full(self._spec.read_into, self.position, buf[:want])
        if got < want:
            raise IntegrityError(
                f"{self._spec.name!r} ended at offset {self.position + got} of {self.total_size}"
            )
        self.position += got
        seconds = time.perf_counter() - start
        cap = self._spec.bandwidth
        if cap is not None:  # rate limiting, not synchronisation: ahead of the cap, pause
            ahead = self.position / cap - (time.perf_counter() - self._t0)
            if ahead > 0:
                await asyncio.sleep(ahead)
        return got, seconds

    def describe(self) -> dict[str, Any]:
        return {"generator": self.kind, "seed": None, "gen_threads": None, "read_from": self._spec.name}

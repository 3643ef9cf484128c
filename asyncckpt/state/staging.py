"""The host staging area of ``staging="host"``: one reusable page-aligned mapping.

It holds a whole object (header + tensors, laid out exactly as in the file), so the write
that follows in the background reads one contiguous buffer. It is kept between saves (a
training loop checkpoints the same state size again and again: no allocation or page
faults after the first), grows when a larger state comes, and is freed by ``aclose``.
The copy into it is split into pieces spread over worker threads (NumPy and torch copies
release the GIL), so the caller is blocked for about one memcpy of the state.
"""

from __future__ import annotations

import asyncio
import mmap
from concurrent.futures import Executor
from typing import Any

import numpy as np

from .._blocking import run_blocking
from ..pipeline import unwrap_group
from ..pool import PAGE, close_mapping, private_mapping
from .arrays import SaveTensor

PIECE = 64 << 20  # copy granularity: small enough to balance threads, large enough to amortise a hop


class StagingArea:
    def __init__(self) -> None:
        self._map: mmap.mmap | None = None
        self.pending: asyncio.Task[Any] | None = None  # the background write using the area
        self.lock = asyncio.Lock()  # held while a save copies into the area

    @property
    def capacity(self) -> int:
        return len(self._map) if self._map is not None else 0

    def ensure(self, size: int) -> memoryview:
        """A view of ``size`` bytes (the mapping is replaced only when it is too small)."""
        if self.capacity < size:
            self.close()
            self._map = private_mapping(max(PAGE, -(-size // PAGE) * PAGE))
        assert self._map is not None
        return memoryview(self._map)[:size]

    def close(self) -> None:
        if self._map is not None:
            close_mapping(self._map)
            self._map = None


def _copy_bytes(dst: memoryview, src: memoryview) -> None:
    np.copyto(np.frombuffer(dst, np.uint8), np.frombuffer(src, np.uint8))  # releases the GIL


def _run(pieces: list[tuple[Any, ...]]) -> None:
    for fn, *args in pieces:
        fn(*args)


async def stage(
    tensors: list[SaveTensor], offsets: list[int], area: memoryview, executor: Executor, threads: int
) -> None:
    """Copy every tensor to ``area[offset:]`` using up to ``threads`` worker threads."""
    pieces: list[tuple[Any, ...]] = []
    for t, offset in zip(tensors, offsets, strict=True):
        dst = area[offset : offset + t.nbytes]
        if not t.contiguous:
            pieces.append((t.copy_into, dst))
            continue
        src = t.byte_view()
        for at in range(0, t.nbytes, PIECE):
            pieces.append((_copy_bytes, dst[at : at + PIECE], src[at : at + PIECE]))
    bins: list[list[tuple[Any, ...]]] = [[] for _ in range(max(1, threads))]
    for i, piece in enumerate(pieces):
        bins[i % len(bins)].append(piece)
    try:  # a failure cancels the rest, and each cancelled copy still waits for its thread
        async with asyncio.TaskGroup() as tg:
            for b in bins:
                if b:
                    tg.create_task(run_blocking(executor, _run, b))
    except BaseExceptionGroup as group:
        raise unwrap_group(group) from None

"""The host staging area of ``staging="host"``: one reusable page-aligned mapping.

It holds a whole object (header + tensors, laid out exactly as in the file), so the write
that follows in the background reads one contiguous buffer. It is kept between saves (a
training loop checkpoints the same state size again and again: no allocation or page
faults after the first), grows when a larger state comes, and is freed by ``aclose``. The
first staged save pays for the mapping and its page faults (a 1 GiB state: blocked 0.2-1.3 s,
against about 0.1 s after) unless ``reserve_staging`` made the area beforehand.
The copy into it is split into equal shares of pieces, one per worker thread (NumPy and torch
copies release the GIL), so the caller is blocked for about one memcpy of the state; a thread
done with its share takes over pieces of a slower one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import mmap
from collections import deque
from collections.abc import AsyncIterator
from concurrent.futures import Executor
from typing import Any

import numpy as np

from ..blocking import LoopLocks, run_blocking
from ..engine.pipeline import unwrap_group
from ..pool import PAGE, close_mapping, private_mapping
from .arrays import SaveTensor
from .results import StagedSave

log = logging.getLogger("asyncckpt")

ALIGN = 64 << 10  # where a tensor's copy may be cut between threads (whole pages, either size)
INLINE_COPY = 16 << 20  # a state this small is copied by the thread that laid it out
PIECE = 8 << 20  # the largest piece of a contiguous tensor's copy (a multiple of ALIGN)


class StagingArea:
    def __init__(self) -> None:
        self._map: mmap.mmap | None = None
        self.pending: StagedSave | None = None  # the background write using the area
        self._locks = LoopLocks()

    @property
    def lock(self) -> asyncio.Lock:
        """Held while a save copies into the area; one per event loop (a lock is bound to the
        loop that first waited on it, and sync code may call ``asyncio.run`` more than once)."""
        return self._locks.current()

    @contextlib.asynccontextmanager
    async def claimed(self) -> AsyncIterator[None]:
        """Held while a save copies into the area or a reservation remaps it: one at a time,
        and only once the background write from the area is over (never remapped under it)."""
        async with self.lock:
            await self.settle()
            yield

    async def settle(self) -> None:
        """Until the background write from the area is over. One that an ended event loop left
        pending is reported (with its URI) and forgotten: it can never finish, and waiting for
        it would hang; one cancelled as its loop ended was reported then."""
        staged = self.pending
        if staged is None:
            return
        if staged.abandoned() and not staged.cancelled():  # like a crash: a temporary may remain
            log.error("%s (the loop was closed with it pending)", staged.abandoned_text())
        await staged.settled()
        if self.pending is staged:  # a cancelled wait leaves it pending: never remapped under it
            self.pending = None

    @property
    def mapping(self) -> mmap.mmap | None:
        """The current mapping (replaced only when a larger state needs more room)."""
        return self._map

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

    def reserve(self, size: int) -> int:
        """Make the area hold ``size`` bytes, its pages faulted in now (a thread's work, with no
        write using the area); its capacity. A mapping already big enough was touched by the
        copies of earlier saves and is left alone."""
        if self.capacity < size:
            view = self.ensure(size)
            np.frombuffer(view, np.uint8)[::PAGE] = 0  # one write per page: the kernel maps it
        return self.capacity

    def close(self) -> None:
        if self._map is not None:
            close_mapping(self._map)
            self._map = None


def copy_bytes(dst: memoryview, src: memoryview) -> None:
    """``dst[:] = src`` in a worker thread: NumPy releases the GIL (a memoryview copy does not)."""
    np.copyto(np.frombuffer(dst, np.uint8), np.frombuffer(src, np.uint8))


def run_pieces(pieces: list[tuple[Any, ...]]) -> None:
    for fn, *args in pieces:
        fn(*args)


def _nbytes(piece: tuple[Any, ...]) -> int:
    return len(piece[1])  # the destination view


def split_copies(
    tensors: list[SaveTensor], offsets: list[int], area: memoryview, threads: int
) -> list[list[tuple[Any, ...]]]:
    """The copies of every tensor to ``area[offset:]``, as one list per thread of equal bytes.

    Why not whole tensors dealt round-robin: a state dict alternates large and small tensors
    (a weight, then its bias), so one thread got every weight and the caller waited for it.
    Contiguous tensors are cut at ``ALIGN`` boundaries to even the threads out; a
    non-contiguous one is copied whole (by its own strides), the largest first to the least
    loaded thread.
    """
    bins: list[list[tuple[Any, ...]]] = [[] for _ in range(max(1, threads))]
    load = [0] * len(bins)
    runs: list[tuple[memoryview, memoryview]] = []  # contiguous (dst, src), in area order
    whole: list[tuple[Any, ...]] = []
    for t, offset in zip(tensors, offsets, strict=True):
        if t.nbytes == 0:
            continue
        dst = area[offset : offset + t.nbytes]
        if t.contiguous:
            runs.append((dst, t.byte_view()))
        else:
            whole.append((t.copy_into, dst))
    for piece in sorted(whole, key=_nbytes, reverse=True):
        i = load.index(min(load))
        bins[i].append(piece)
        load[i] += _nbytes(piece)
    remaining = sum(len(dst) for dst, _ in runs)
    target = -(-(sum(load) + remaining) // len(bins))
    r, at = 0, 0  # runs[r] is next, ``at`` bytes of it already given to a thread
    for i, b in enumerate(bins):
        need = remaining if i == len(bins) - 1 else min(remaining, max(0, target - load[i]))
        while need > 0:
            dst, src = runs[r]
            # a cut falls on an ALIGN boundary; pieces of at most PIECE let a thread take over
            # the rest of another's list (``drain``)
            take = min(len(dst) - at, -(-need // ALIGN) * ALIGN, PIECE)
            if take == len(dst):  # a whole tensor (most of a state of many): no new views
                b.append((copy_bytes, dst, src))
            else:
                b.append((copy_bytes, dst[at : at + take], src[at : at + take]))
            load[i] += take
            need -= take
            remaining -= take
            at += take
            if at == len(dst):  # the next run (not ``pop(0)``: quadratic in the tensors)
                r, at = r + 1, 0
    return bins


def share_copies(
    tensors: list[SaveTensor], offsets: list[int], area: memoryview, threads: int
) -> list[list[tuple[Any, ...]]]:
    """The copies of every tensor into ``area``, one list per thread (blocking: 10 000 tensors
    take tens of milliseconds to share out). A state of at most ``INLINE_COPY`` bytes is
    copied right here instead, and no lists are returned: handing a copy to other threads
    costs more than making it (a hop took 0.2-1.5 ms on the reference VM; one thread copies
    16 MiB in about 2 ms)."""
    if sum(t.nbytes for t in tensors) <= INLINE_COPY:
        for b in split_copies(tensors, offsets, area, 1):
            run_pieces(b)
        return []
    return split_copies(tensors, offsets, area, threads)


def drain(mine: int, queues: list[deque[tuple[Any, ...]]]) -> None:
    """Copy the pieces of ``queues[mine]`` from its front, then take the others' from their
    backs until none is left: a worker thread that starts late (waking an idle thread took up
    to 4 ms on the reference VM, 5 % of a 1 GiB copy) leaves its share to the one running."""
    try:
        while True:
            try:
                fn, *args = queues[mine].popleft()
            except IndexError:
                longest = max(queues, key=len)
                try:
                    fn, *args = longest.pop()
                except IndexError:
                    return
            fn(*args)
    except BaseException:
        for q in queues:  # the save fails: the other threads stop after their current piece
            q.clear()
        raise


async def copy_shared(bins: list[list[tuple[Any, ...]]], executor: Executor) -> None:
    """Copy each thread's list (:func:`share_copies`) on a worker thread of its own; a thread
    done with its list takes over pieces of the others (:func:`drain`)."""
    queues = [deque(b) for b in bins if b]
    try:  # a failure cancels the rest, and each cancelled copy still waits for its thread
        async with asyncio.TaskGroup() as tg:
            for i in range(len(queues)):
                tg.create_task(run_blocking(executor, drain, i, queues))
    except BaseExceptionGroup as group:
        raise unwrap_group(group) from None

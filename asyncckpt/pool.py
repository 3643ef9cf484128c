"""A fixed pool of page-aligned buffers handed out from a free list.

Peak memory is bounded by ``chunk_size * num_buffers`` whatever the checkpoint size. A buffer
is given back only by the consumer once its write has completed: the pool refuses a release
of a buffer that is not checked out, so a double release (the reuse race in the designs this
library replaces) fails loudly instead of corrupting data.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import mmap
import threading
from collections import deque
from concurrent.futures import Executor
from typing import NamedTuple

from .blocking import run_blocking

PAGE = mmap.PAGESIZE
_TOUCH_STEP = 8 << 20


class PoolStats(NamedTuple):
    """Pool counters, for the result and for tests."""

    num_buffers: int
    chunk_size: int
    free: int
    in_use: int
    peak_in_use: int
    acquires: int
    waits: int  # acquires that found the free list empty (back-pressure)


class PoolBuffer:
    """One pooled buffer. ``view`` is the whole buffer; callers slice it."""

    __slots__ = ("checked_out", "index", "view")

    def __init__(self, index: int, view: memoryview) -> None:
        self.index = index
        self.view = view
        self.checked_out = False


def buffer_address(view: memoryview) -> int:
    """Address of a writable buffer's first byte (used to check alignment)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


def touch_view(view: memoryview) -> None:
    """Write zeros over ``view`` so the kernel maps its pages now (``ctypes.memset``
    releases the GIL)."""
    base = buffer_address(view)
    for start in range(0, len(view), _TOUCH_STEP):
        ctypes.memset(base + start, 0, min(_TOUCH_STEP, len(view) - start))


def _retrieve(future: asyncio.Future[None]) -> None:
    """A failed fault-in is not an error anyone awaits: read it so asyncio does not log it."""
    if not future.cancelled():
        future.exception()


def close_mapping(mapping: mmap.mmap) -> None:
    """Unmap now if no slice of it is alive; otherwise when the last one is collected.

    A slice can outlive its buffer's use: an executor thread drops its job's arguments only
    after the awaiting coroutine resumed, and a caller may keep a traceback. Neither may turn
    a clean shutdown into an error.
    """
    try:
        mapping.close()
    except BufferError:
        gc.collect()  # slices in reference cycles (finished task frames) go now
        with contextlib.suppress(BufferError):
            mapping.close()


def private_mapping(nbytes: int) -> mmap.mmap:
    """Anonymous memory only this process uses, on transparent huge pages where the kernel
    offers them on request (``madvise`` mode, the usual default): 2 MiB pages mean 512 times
    fewer page faults on first touch, TLB misses in copies and checksums, and pages for
    O_DIRECT to pin per request. Memory a writer process must see is shared instead
    (``asyncckpt.sinks.isolation``); a kernel without THP just ignores the advice."""
    mapping = mmap.mmap(-1, max(nbytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is not None:
        with contextlib.suppress(OSError):
            mapping.madvise(advice)
    return mapping


class BufferPool:
    """``num_buffers`` buffers of ``chunk_size`` bytes carved out of one anonymous mapping."""

    def __init__(self, chunk_size: int, num_buffers: int, *, arena: mmap.mmap | None = None) -> None:
        if chunk_size % PAGE:
            raise ValueError(f"chunk_size {chunk_size} is not a multiple of the page size {PAGE}")
        self.chunk_size = chunk_size
        self.num_buffers = num_buffers
        self.nbytes = chunk_size * num_buffers
        self._mmap = arena if arena is not None else private_mapping(self.nbytes)
        self._view = memoryview(self._mmap)
        self._buffers = [
            PoolBuffer(i, self._view[i * chunk_size : (i + 1) * chunk_size]) for i in range(num_buffers)
        ]
        self._free: deque[PoolBuffer] = deque(self._buffers)
        self._free_waiters: deque[asyncio.Future[None]] = deque()
        self._peak = 0
        self._acquires = 0
        self._waits = 0
        self._closed = False
        self._faulting: asyncio.Task[None] | None = None
        self._unfaulted: deque[PoolBuffer] = deque()  # held by the fault-in, not yet free
        self._fault_lock = threading.Lock()  # held by the thread faulting a buffer in
        self._fault_epoch = 0  # bumped when another event loop takes the fault-in over
        self._executor: Executor | None = None

    def touch(self) -> None:
        """Fault every page in now, so first-touch page faults never count as generation.

        Blocking (run it in an executor); ``ctypes.memset`` releases the GIL, so the event
        loop keeps running while the kernel maps the pages.
        """
        for buf in self._buffers:
            touch_view(buf.view)

    def fault_in(self, executor: Executor) -> None:
        """Fault the pages in buffer by buffer, each handed out as soon as it is ready.

        With transparent huge pages the kernel may compact memory to build each 2 MiB page
        (``defrag=madvise``): touching a 256 MiB pool took 0.03-0.52 s here, all of it on a
        first save's critical path when done up front. Buffer by buffer, the first fill waits
        for one buffer only and the rest overlap the writes (the wait shows as that chunk's
        ``wait_free_s``). Not cancellable: a thread in ``memset`` cannot be stopped, and the
        pool must not be unmapped under it (:meth:`faulted` is awaited before ``close``).
        """
        self._executor = executor
        self._unfaulted.extend(self._free)
        self._free.clear()
        self._faulting = asyncio.ensure_future(self._fault(executor, self._fault_epoch))
        self._faulting.add_done_callback(_retrieve)

    def _touch(self, buf: PoolBuffer, epoch: int) -> None:
        """Blocking: fault ``buf`` in unless another loop took the fault-in over meanwhile
        (a job queued before its loop closed may still start later)."""
        with self._fault_lock:
            if epoch == self._fault_epoch:
                touch_view(buf.view)

    async def _fault(self, executor: Executor, epoch: int) -> None:
        try:
            while self._unfaulted and epoch == self._fault_epoch:
                buf = self._unfaulted[0]
                try:
                    await run_blocking(executor, self._touch, buf, epoch)
                except BaseException:
                    if epoch == self._fault_epoch:  # untouched: first use faults them in
                        self._free.extend(self._unfaulted)
                        self._unfaulted.clear()
                    raise
                if epoch != self._fault_epoch:
                    return
                self._unfaulted.popleft()
                self._free.append(buf)
                self._wake_one()
        finally:
            if epoch == self._fault_epoch:
                self._wake_one()

    async def _adopt(self) -> None:
        """The fault-in runs in an event loop that is gone (closed, or not running): wait for
        its thread to leave ``memset``, then free its buffers untouched (first use faults them)."""
        assert self._executor is not None
        await run_blocking(self._executor, self._fault_lock.acquire)
        try:
            self._fault_epoch += 1
            self._free.extend(self._unfaulted)
            self._unfaulted.clear()
            self._faulting = None
        finally:
            self._fault_lock.release()

    def _foreign_fault(self) -> bool:
        task = self._faulting
        return task is not None and not task.done() and task.get_loop() is not asyncio.get_running_loop()

    async def faulted(self) -> None:
        """Wait until :meth:`fault_in` is done with every buffer (its errors are not raised:
        an untouched buffer is only slower)."""
        if self._foreign_fault():
            await self._adopt()
        elif self._faulting is not None and not self._faulting.done():
            await asyncio.wait([self._faulting])

    @property
    def buffers(self) -> list[PoolBuffer]:
        return list(self._buffers)

    def stats(self) -> PoolStats:
        in_use = self.num_buffers - len(self._free)
        return PoolStats(
            self.num_buffers,
            self.chunk_size,
            len(self._free),
            in_use,
            self._peak,
            self._acquires,
            self._waits,
        )

    def reset_stats(self) -> None:
        self._peak = self.num_buffers - len(self._free)
        self._acquires = self._waits = 0

    async def acquire(self) -> PoolBuffer:
        """Take a free buffer, waiting (back-pressure) while all are in use."""
        if self._closed:
            raise RuntimeError("buffer pool is closed")
        if self._foreign_fault():
            await self._adopt()
        self._acquires += 1
        if not self._free:
            self._waits += 1
        while not self._free:
            waiter = asyncio.get_running_loop().create_future()
            self._free_waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter in self._free_waiters:
                    self._free_waiters.remove(waiter)
                elif self._free:
                    self._wake_one()  # pass the wake-up on rather than lose it
                raise
        buf = self._free.popleft()
        buf.checked_out = True
        self._peak = max(self._peak, self.num_buffers - len(self._free))
        return buf

    def release(self, buf: PoolBuffer) -> None:
        """Return a buffer whose last user (the writer) is done with it."""
        if not buf.checked_out:
            raise RuntimeError(f"buffer {buf.index} released twice (it is already free)")
        buf.checked_out = False
        self._free.append(buf)
        self._wake_one()

    def _wake_one(self) -> None:
        while self._free_waiters:
            waiter = self._free_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def reclaim(self, bufs: list[PoolBuffer]) -> None:
        """Return buffers stranded by a failed or cancelled save (no thread uses them)."""
        for buf in bufs:
            if buf.checked_out:
                self.release(buf)

    def close(self) -> None:
        """Unmap the pool; idempotent. Every buffer must be free."""
        if self._closed:
            return
        self._closed = True
        for buf in self._buffers:
            buf.view.release()
        self._view.release()
        close_mapping(self._mmap)

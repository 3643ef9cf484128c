"""The stall watchdog: storage that makes no progress for ``stall_timeout`` seconds fails fast.

Request timeouts live in each client library and differ (botocore waits per socket read, s3dlio
per request, Mountpoint has none, a hung NFS ``pwrite`` has none at all) and retries multiply
them: a stopped server held a save for minutes. :class:`WatchedSink` wraps any sink, in-process
or isolated, and times the one thing they share: calls finishing. While at least one call is
in flight, a call finishing (successfully or not) is progress; when none finishes for
``stall_timeout`` s, every call in flight fails with :class:`StallError` naming the oldest
stuck stage. Clean-up (``abort``, ``aclose``) is watched too, with half the budget, shared
after a stall, so a stalled save fails within 1.5 × ``stall_timeout``.

A library that uploads in the background (s3dlio: ``Sink.write_behind`` bytes taken into its
memory before a write call blocks) returns write calls the server never saw: counted as
progress, they kept a stalled save going until the library's window was full, and an object
that fit in it was reported as a stalled ``complete`` 10 s late. Such a write is progress only
when it proves an earlier part acknowledged (more bytes handed over than the window holds);
parts handed over and not proven keep the clock running between calls, and a stall names the
oldest of them.

A thread blocked inside a client library cannot be interrupted. The watchdog abandons it:
control returns to the caller, the thread finishes when its library gives up (its request
timeout), and whatever buffer it holds must never be handed out again — ``on_stall`` tells
the owner to replace its pool and executor. An isolated writer process is simply killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ..cpu import CpuCounters
from ..errors import StallError
from ..sources.base import GenSpec
from .base import AfterRead, InPlaceWrite, ReadBatch, Sink
from .shm import SharedArena

T = TypeVar("T")
log = logging.getLogger("asyncckpt")
CLEANUP_SHARE = 0.5  # of stall_timeout, for abort/aclose (together, after a stall)
_CLEANUP = frozenset({"abort", "close"})


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Done callback of an abandoned call: its outcome no longer matters, but is not 'lost'."""
    if not task.cancelled():
        exc = task.exception()
        if exc is not None:
            log.debug("abandoned storage call ended later with %s: %s", type(exc).__name__, exc)


class Watchdog:
    """Progress clock for one sink's calls; see the module docstring."""

    def __init__(
        self,
        timeout: float,
        what: str,
        on_stall: Callable[[], None] | None = None,
        *,
        write_behind: Callable[[], int] = lambda: 0,
        unacknowledged_stage: Callable[[int], str] = lambda offset: f"write at offset {offset}",
    ) -> None:
        self.timeout = timeout
        self.what = what
        self.on_stall = on_stall
        self._write_behind = write_behind  # the sink's window, asked after open
        self._unacknowledged_stage = unacknowledged_stage
        self._handed = 0  # bytes of returned writes a write-behind library took
        self._acked = 0  # of those, bytes proven acknowledged by the storage
        self.stalled: StallError | None = None
        self.abandoned = 0  # calls given up on (their threads may still run)
        self._ids = itertools.count()
        self._active: dict[int, tuple[str, float]] = {}  # call → (stage, started)
        self._since = 0.0  # start of the current interval without progress
        self._trip: asyncio.Future[None] | None = None  # resolved when active calls must give up
        self._cleanup_until: float | None = None  # after a stall: abort + aclose share one budget

    def new_object(self) -> None:
        """A new object is opened: nothing of it was handed over yet."""
        self._handed = self._acked = 0

    def _progress(self, stage: str, handed: int, inner: asyncio.Future[Any]) -> bool:
        """Whether ``inner``, finished, shows the storage made progress (``handed``: the bytes
        of a write call, 0 for other calls)."""
        if inner.cancelled() or inner.exception() is not None:
            return True  # an answer, if only an error
        if not handed:
            if stage == "complete":
                self._acked = self._handed  # the library waited for every part
            return True
        behind = self._write_behind()
        if not behind:
            return True
        self._handed += handed
        proven = self._handed - behind  # the library holds at most ``behind`` unacknowledged
        if proven <= self._acked:
            return False
        self._acked = proven
        return True

    def _deadline(self, stage: str) -> float:
        if stage in _CLEANUP:
            end = self._since + self.timeout * CLEANUP_SHARE
            return min(end, self._cleanup_until) if self._cleanup_until is not None else end
        return self._since + self.timeout

    async def run(self, stage: str, fn: Callable[[], Awaitable[T]], handed: int = 0) -> T:
        """``await fn()``, failing with StallError when the sink stops making progress;
        ``handed``: the bytes a write call hands to the library."""
        loop = asyncio.get_running_loop()
        if not self._active and self._handed <= self._acked:  # idle, nothing left unacknowledged
            self._since = loop.time()
        cid = next(self._ids)
        self._active[cid] = (stage, loop.time())
        if self._trip is None or self._trip.done():
            self._trip = loop.create_future()
        trip: asyncio.Future[Any] = self._trip
        inner: asyncio.Future[T] = asyncio.ensure_future(fn())
        cancelled = False
        try:
            while True:
                remaining = self._deadline(stage) - loop.time()
                if remaining > 0 and not trip.done():
                    try:
                        await asyncio.wait(
                            {inner, trip}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
                        )
                    except asyncio.CancelledError:
                        # like run_blocking: the call may still use the caller's buffer, so wait
                        # for it, but never past the stall deadline
                        cancelled = True
                        inner.cancel()
                        continue
                    if inner.done():
                        if self._progress(stage, handed, inner):
                            self._since = loop.time()
                        if cancelled:
                            raise asyncio.CancelledError
                        return inner.result()
                    continue  # woken early, or another call made progress: re-check
                error = await self._stalled(stage, inner, trip)
                if cancelled:
                    raise asyncio.CancelledError
                raise error
        finally:
            del self._active[cid]

    async def _stalled(
        self, stage: str, inner: asyncio.Future[Any], trip: asyncio.Future[None]
    ) -> StallError:
        """Give up on ``inner``; the first call to get here reports and trips the others."""
        self.abandoned += 1
        if stage != "close":  # a closing client is left to finish on its own
            inner.cancel()
        inner.add_done_callback(_retrieve)
        if not trip.done():
            loop = asyncio.get_running_loop()
            oldest = min(self._active.values(), key=lambda v: v[1])[0]
            if self._handed > self._acked and oldest not in _CLEANUP:  # the part the calls wait behind
                oldest = self._unacknowledged_stage(self._acked)
            budget = self.timeout * (CLEANUP_SHARE if oldest in _CLEANUP else 1)
            self.stalled = StallError(
                f"{self.what}: {oldest} stalled: no storage call finished for {budget:g} s "
                f"(stall_timeout={self.timeout:g} s); gave up on it",
                stage=oldest,
            )
            log.error("%s", self.stalled)
            self._since = loop.time()  # calls made from now on (the abort) get a fresh window...
            self._cleanup_until = self._since + self.timeout * CLEANUP_SHARE  # ...but one for all
            trip.set_result(None)
            if self.on_stall is not None:
                self.on_stall()
        assert self.stalled is not None
        error = StallError(str(self.stalled), stage=self.stalled.stage)  # each raise its own
        return error


class WatchedSink(Sink):
    """A sink whose every storage call runs under a :class:`Watchdog`; the rest is delegated."""

    def __init__(self, inner: Sink, stall_timeout: float, on_stall: Callable[[], None] | None = None) -> None:
        super().__init__(inner.uri, executor=inner.executor, options=inner.options)
        self.inner = inner
        setattr(self, "backend", inner.backend)  # noqa: B010 - instance value shadows the class default
        setattr(self, "default_in_flight", inner.default_in_flight)  # noqa: B010
        # capabilities are the watched handle's: asked of the wrapper, answered for it
        setattr(self, "uses_shared_arena", inner.uses_shared_arena)  # noqa: B010
        setattr(self, "stoppable", inner.stoppable)  # noqa: B010
        setattr(self, "has_directories", inner.has_directories)  # noqa: B010
        setattr(self, "reads_in_batches", inner.reads_in_batches)  # noqa: B010
        self.watchdog = Watchdog(
            stall_timeout,
            f"{inner.uri} ({inner.backend})",
            self._on_stall,
            write_behind=inner.write_behind,
            unacknowledged_stage=self._unacknowledged_stage,
        )
        self._owner_on_stall = on_stall

    def _on_stall(self) -> None:
        if self.inner.stoppable:  # a process, unlike a thread, can be stopped
            task = asyncio.ensure_future(self.inner.kill("the stall watchdog gave up on it"))
            task.add_done_callback(_retrieve)
        if self._owner_on_stall is not None:
            self._owner_on_stall()

    def attach_arena(self, arena: SharedArena) -> None:
        self.inner.attach_arena(arena)

    async def kill(self, why: str) -> None:
        await self.inner.kill(why)

    def _unacknowledged_stage(self, offset: int) -> str:
        part = offset // (self.options.chunk_size or 1) + 1
        return f"write part {part} (offset {offset}; taken by {self.backend}, not acknowledged by storage)"

    def write_behind(self) -> int:
        return self.inner.write_behind()

    def writes_in_flight(self) -> int:
        return self.inner.writes_in_flight()

    def check(self) -> None:
        self.inner.check()

    async def start(self) -> None:
        await self.inner.start()  # not storage I/O: never a stall

    async def open(self, size: int) -> None:
        await self.inner.start()
        self.watchdog.new_object()
        await self.watchdog.run("open", lambda: self.inner.open(size))

    async def write_part(self, offset: int, data: memoryview) -> float | None:
        part = offset // (self.options.chunk_size or max(len(data), 1)) + 1
        stage = f"write part {part} (offset {offset}, {len(data)} bytes)"
        return await self.watchdog.run(stage, lambda: self.inner.write_part(offset, data), len(data))

    async def begin_generation(self, spec: GenSpec) -> bool:
        return await self.watchdog.run("start generating", lambda: self.inner.begin_generation(spec))

    async def write_generated(self, offset: int, nbytes: int) -> InPlaceWrite:
        part = offset // (self.options.chunk_size or max(nbytes, 1)) + 1
        stage = f"write part {part} (offset {offset}, {nbytes} bytes, generated in place)"
        return await self.watchdog.run(stage, lambda: self.inner.write_generated(offset, nbytes), nbytes)

    async def complete(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        return await self.watchdog.run("complete", lambda: self.inner.complete(*args, **kwargs))

    async def abort(self) -> None:
        """Never raises (a stall included): the error that caused the abort is the one to report."""
        try:
            await self.watchdog.run("abort", self.inner.abort)
        except Exception as exc:
            log.warning("abort failed (an upload or temporary file may be left for cleanup): %s", exc)

    async def open_read(self, *, defeat_cache: bool = True) -> None:
        await self.inner.start()
        await self.watchdog.run("open for reading", lambda: self.inner.open_read(defeat_cache=defeat_cache))

    async def read_into(self, offset: int, buf: memoryview) -> int:
        stage = f"read at offset {offset} ({len(buf)} bytes)"
        return await self.watchdog.run(stage, lambda: self.inner.read_into(offset, buf))

    async def read_batch(self, reads: ReadBatch, after: AfterRead) -> None:
        if not self.inner.reads_in_batches:  # read by read, each through this wrapper's watch
            await super().read_batch(reads, after)
            return
        total = sum(len(view) for _, view in reads)
        stage = f"read at offset {reads[0][0] if reads else 0} ({len(reads)} reads, {total} bytes)"
        await self.watchdog.run(stage, lambda: self.inner.read_batch(reads, after))

    async def size(self) -> int:
        await self.inner.start()
        return await self.watchdog.run("stat", self.inner.size)

    async def check_unchanged(self) -> None:
        await self.watchdog.run("stat again", self.inner.check_unchanged)

    async def delete(self) -> None:
        await self.inner.start()
        await self.watchdog.run("delete", self.inner.delete)

    async def make_directory(self) -> None:
        await self.inner.start()
        await self.watchdog.run("make directory", self.inner.make_directory)

    async def list_names(self) -> list[str]:
        await self.inner.start()
        return await self.watchdog.run("list", self.inner.list_names)

    async def aclose(self) -> None:
        with contextlib.suppress(StallError):  # logged by the watchdog; the client closes later
            await self.watchdog.run("close", self.inner.aclose)

    async def cpu_counters(self) -> CpuCounters:
        await self.inner.start()  # a writer process is started before its CPU is first read
        return await self.watchdog.run("read CPU counters", self.inner.cpu_counters)

    def describe(self) -> dict[str, Any]:
        return self.inner.describe()


def watch(sink: Sink, stall_timeout: float, on_stall: Callable[[], None] | None = None) -> Sink:
    """``sink`` under a watchdog, unless it keeps bytes in this process's memory (cannot stall;
    a watched call yields to the loop, which would let other work into its timed interval)."""
    if sink.in_process_memory:
        return sink
    return WatchedSink(sink, stall_timeout, on_stall)


def unwrap(sink: Sink) -> Sink:
    """The sink a :class:`WatchedSink` watches (or ``sink`` itself)."""
    return sink.inner if isinstance(sink, WatchedSink) else sink

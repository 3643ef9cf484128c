"""Watching the process while a save runs: event-loop lag, resident memory, CPU time.

A ticker coroutine asks to wake every ``interval`` seconds; how late it wakes is the lag a
training loop sharing this event loop would feel. It also samples RSS, so the reported peak
is the peak *during this save*, not the process lifetime maximum. Given the sink, it also
reads the CPU time of this process, of the writer process and of the storage calls from its
start to its end (:mod:`asyncckpt.cpu`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..cpu import CpuCounters, CpuMeter
from ..results.metrics import Percentiles, percentiles

if TYPE_CHECKING:
    from ..sinks.base import Sink

_PAGE = os.sysconf("SC_PAGE_SIZE")
#: a tick this late is reported to ``on_late``: well above what a quiet save showed (max 4-5 ms
#: on the 2-core VM, a scheduler tick) and below what a starved, pinned lane caused (16-24 ms p99)
LATE_S = 0.010


_statm: dict[int, int] = {}  # pid → its /proc/self/statm descriptor (a forked child opens its own)


def current_rss() -> int:
    """Resident set size in bytes (Linux /proc; 0 where unavailable).

    Read on the loop every tick: a kept descriptor and ``pread`` cost a few microseconds where
    open/read/close cost about a tenth of a millisecond per tick (measured: 18 % of the loop's
    own CPU during a save with a 1 ms ticker).
    """
    try:
        return int(os.pread(_statm_fd(), 128, 0).split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):  # pragma: no cover - non-Linux
        return 0


def _statm_fd() -> int:
    pid = os.getpid()
    fd = _statm.get(pid)
    if fd is None:
        fd = _statm[pid] = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
    return fd


with contextlib.suppress(OSError):  # opened with the module: a process-lifetime descriptor,
    _statm_fd()  # not one that first appears inside a caller's save


class LoopMonitor:
    """Samples loop lag and RSS until stopped; use as ``async with``."""

    def __init__(
        self,
        interval: float = 0.005,
        *,
        sink: Sink | None = None,
        on_late: Callable[[float], None] | None = None,
    ) -> None:
        self.interval = interval
        self.sink = sink  # whose CPU counters (writer process, storage calls) to read
        self.on_late = on_late  # called on the loop with each tick at least LATE_S late
        self.cpu = CpuMeter()
        self.lags: list[float] = []
        self.baseline_rss = 0
        self.peak_rss = 0
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        # perf_counter, not loop.time(): uvloop's clock has 1 ms resolution
        while True:
            expected = time.perf_counter() + self.interval
            await asyncio.sleep(self.interval)
            lag = max(0.0, time.perf_counter() - expected)
            self.lags.append(lag)
            if lag >= LATE_S and self.on_late is not None:
                self.on_late(lag)
            self.peak_rss = max(self.peak_rss, current_rss())

    async def __aenter__(self) -> LoopMonitor:
        self.cpu.start(await self.sink.cpu_counters() if self.sink is not None else CpuCounters())
        self.baseline_rss = self.peak_rss = current_rss()
        self._task = asyncio.create_task(self._tick(), name="asyncckpt-loop-monitor")
        await asyncio.sleep(0)
        return self

    async def __aexit__(self, exc_type: object, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.wait([self._task])
        self.peak_rss = max(self.peak_rss, current_rss())
        counters = CpuCounters()
        if exc_type is None and self.sink is not None:  # after a failure nothing reads the
            counters = await self.sink.cpu_counters()  # figures: a failed writer is not asked
        self.cpu.stop(counters)

    def lag(self) -> Percentiles:
        return percentiles(self.lags)


def now() -> float:
    return time.perf_counter()

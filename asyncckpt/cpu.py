"""CPU time: what a save or a load costs per byte, in total and per stage.

Three clocks, each measured where the work happens:

- **the process** (``time.process_time``: user + system time of every thread of this process)
  from open to publish (saves) or to the last view consumed and the reader closed (loads);
- **the writer process**, when the sink runs in one (``isolation``): its own
  ``time.process_time`` over the same phase, reported by the child on request;
- **stages**: ``time.thread_time`` of the worker thread around one piece of work (a CRC, a
  ``pwrite``, a verification), plus, for work that a library hands to threads of its own
  (dgen-py's Rayon pool), the CPU time of those *helper threads* over the same call
  (``/proc/self/task/<tid>/schedstat``). A stage is the sum over its calls.

Limits, said where a result is read (docs/results.md): the process clock counts everything the
process did in that phase, including a caller's own work with a loaded view and other threads
(a training loop); helper-thread time is attributed to whichever call runs while it is busy,
so two generators filling at the same time in one process would each count the other's work.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

_helpers: set[int] = set()  # thread ids (tids) of library-owned worker threads in this process
_helpers_lock = threading.Lock()


def register_helper_threads(tids: Iterable[int]) -> None:
    """Count the CPU time of these threads (e.g. dgen-py's Rayon pool) in helper-using stages."""
    with _helpers_lock:
        _helpers.update(tids)


_schedstat_fds: dict[int, int] = {}  # tid → an open /proc schedstat descriptor (re-read with pread)


def _schedstat(tid: int, *, keep: bool = True) -> tuple[float, float] | None:
    """(seconds on a CPU, seconds runnable but waiting for one) of thread ``tid``, or None
    where the kernel has no schedstat or the thread has gone. ``keep``: the descriptor stays
    open for the next read (threads that live as long as the process only)."""
    try:
        fd = _schedstat_fds.get(tid)
        if fd is None:
            fd = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY | os.O_CLOEXEC)
            if keep:
                _schedstat_fds[tid] = fd
        try:
            on_cpu, waiting = os.pread(fd, 128, 0).split()[:2]  # nanoseconds
        finally:
            if tid not in _schedstat_fds:
                os.close(fd)
        return int(on_cpu) / 1e9, int(waiting) / 1e9
    except (OSError, ValueError):
        return None


def _thread_cpu(tid: int) -> float:
    """CPU seconds of thread ``tid`` of this process (0.0 once it has gone)."""
    stat = _schedstat(tid)
    if stat is not None:
        return stat[0]
    try:  # kernels without schedstat: utime + stime in clock ticks
        with open(f"/proc/self/task/{tid}/stat", "rb") as f:
            parts = f.read().rsplit(b")", 1)[1].split()
        return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def run_queue(tids: Iterable[int]) -> tuple[float, float]:
    """(CPU seconds, seconds waiting for a CPU) of these threads of this process, summed; the
    second is what a lower priority costs them when every CPU is busy (zeros without schedstat)."""
    stats = [s for s in (_schedstat(t, keep=False) for t in tids) if s is not None]
    return sum(s[0] for s in stats), sum(s[1] for s in stats)


def _forget_in_child() -> None:
    """A forked child has none of these threads: its reads must not see the parent's."""
    _helpers.clear()
    _schedstat_fds.clear()  # the descriptors stay open in the child, unused (few, and close-on-exec)


os.register_at_fork(after_in_child=_forget_in_child)


def helper_threads() -> tuple[int, ...]:
    """The registered helper threads (tids)."""
    with _helpers_lock:
        return tuple(_helpers)


def helper_cpu() -> float:
    """Cumulative CPU seconds of the registered helper threads."""
    with _helpers_lock:
        tids = tuple(_helpers)
    return sum(_thread_cpu(t) for t in tids)


def thread_cpu_call(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> tuple[T, float]:
    """``fn(*args)`` and the CPU seconds of the calling thread during it."""
    start = time.thread_time()
    out = fn(*args, **kwargs)
    return out, time.thread_time() - start


class CpuTally:
    """A thread-safe running sum of CPU seconds (calls in several worker threads add to it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.total = 0.0

    def add(self, seconds: float) -> None:
        with self._lock:
            self.total += seconds


@dataclass(frozen=True)
class CpuCounters:
    """Cumulative CPU counters of a sink, read at the start and at the end of a phase."""

    writer_process: float | None = None  # CPU seconds of the writer process, if one is used
    storage: float | None = None  # CPU seconds of storage calls, measured in their threads


@dataclass
class CpuMeter:
    """Process CPU (and the writer process's) between :meth:`start` and :meth:`stop`."""

    process_s: float = 0.0
    writer_s: float | None = None
    storage_s: float | None = None
    _start: CpuCounters = field(default_factory=CpuCounters)
    _process0: float = 0.0

    def start(self, counters: CpuCounters) -> None:
        self._start = counters
        self._process0 = time.process_time()

    def stop(self, counters: CpuCounters) -> None:
        self.process_s = time.process_time() - self._process0
        self.writer_s = _delta(self._start.writer_process, counters.writer_process)
        self.storage_s = _delta(self._start.storage, counters.storage)


def _delta(before: float | None, after: float | None) -> float | None:
    return None if before is None or after is None else max(0.0, after - before)


#: ``cpu_scope`` values: which processes ``cpu_s`` + ``writer_cpu_s`` cover
SCOPE_PROCESS = "process"
SCOPE_WITH_WRITER = "process+writer"

"""CPU priority of the library's own CPU work (generation, checksums), so the loop wakes on time.

On a node with few cores the event loop shares them with the generator and checksum threads.
When all are runnable the kernel's scheduler, not the GIL, decides who waits, and the loop
(a training loop, a progress callback) waited up to 4 ms for a core (``perf sched`` on the
2-core reference VM). Raising the *niceness* of the threads that only burn CPU lets the
loop's thread take a core as soon as it wakes, while an otherwise idle core still runs them
at full speed (no throughput cost when nothing else wants the CPU). Threads that wait on a
device or a socket (writes, uploads) keep the normal priority: their CPU is short and they
hold buffers.

Niceness can only be raised by an unprivileged process, so a thread is never "restored":
that is why this work runs on threads of its own (:class:`CpuThreads`) rather than on
anyio's shared worker threads, and why dgen-py's pool (process-global, owned by this
library) is lowered once and stays so.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

MAX_NICE = 19
BACKGROUND_NICE = 10  # the default under "leave_loop_core": loop p99 lag 1.5 ms, not 3.5 (null://)


def nice_of(tid: int) -> int:
    """The niceness of thread ``tid`` of this process (Linux: niceness is per thread)."""
    return os.getpriority(os.PRIO_PROCESS, tid)


def lower(tids: Iterable[int], nice: int) -> None:
    """Raise each thread's niceness to at least ``nice`` (never lowers it; gone threads skipped)."""
    for tid in tids:
        try:
            if nice_of(tid) < nice:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
        except (ProcessLookupError, PermissionError):  # exited meanwhile / not ours to change
            continue


def _lower_this_thread(nice: int) -> None:
    lower([threading.get_native_id()], nice)


class CpuThreads(ThreadPoolExecutor):
    """Worker threads for CPU-only calls, each started at niceness ``nice``."""

    def __init__(self, threads: int, nice: int) -> None:
        super().__init__(
            threads, thread_name_prefix="asyncckpt-cpu", initializer=_lower_this_thread, initargs=(nice,)
        )

"""CPU priority of the library's own CPU work (generation, checksums), so the loop wakes on time.

On a node with few cores the event loop shares them with the generator and checksum threads.
When all are runnable the kernel's scheduler, not the GIL, decides who waits, and the loop
(a training loop, a progress callback) waited up to 4 ms for a core (``perf sched`` on the
2-core reference VM). Raising the *niceness* of the threads that only burn CPU lets the
loop's thread take a core as soon as it wakes, while an otherwise idle core still runs them
at full speed (no throughput cost when nothing else wants the CPU). Threads that wait on a
device or a socket (writes, uploads) keep the normal priority: their CPU is short and they
hold buffers.

Niceness alone was not enough into a file: a timer wake-up of the loop lands on the core where
the loop last slept, and the kernel left it queued behind a niceness-10 fill or checksum until
the next scheduler tick (4 ms at HZ=250, ``perf sched timehist``) while the other core idled.
So under ``leave_loop_core`` these threads also run only on the CPUs *beside* the one the loop's
thread is on when a save starts (``cpu_pin``; :func:`pin`): the loop's core stays free for its
wake-ups, and the thread budget (one core fewer than the share) already fits on the others.
Loop p99 into a file 2.08-2.09 → 1.19-1.23 ms, at the same GB/s into a file and ``null://``
(alternating runs, docs/benchmarks.md). Unlike niceness, affinity can be given back: dgen-py's
process-global pool is re-pinned at each save, to every CPU under ``mlperf``. A loop that moves
to another core mid-save is followed only at the next save. The price shows when other
processes keep the lane's cores busy: pinned at niceness 10, its Python thread is preempted
holding the GIL and the loop sleeps on the GIL until it runs again (p99 16-24 ms with a busy
loop per core, 2.5-4.2 unpinned, where the kernel pulls that thread onto the loop's idle
core). So the checkpointer gives the pin back for the rest of a save once its loop monitor
sees the loop late (``AsyncCheckpointer._loop_late``).

A thread in the kernel's ``SCHED_IDLE`` class is preempted by any normal thread the moment it
wakes, so ``cpu_idle=True`` also puts these threads there: loop p99 into a file 2.06 → 1.08 ms
at the same GB/s on a quiet machine (measured with niceness alone; pinning gets as far by
default). It is opt-in, for two measured reasons. Such a thread gets only the CPU that normal
threads leave (with a busy loop on each core, 0.011-0.014 GB/s where niceness 10 gave 0.5-0.9;
a save that starved so logs a warning). And a starved one that holds the GIL stalls every
other Python thread, the event loop included: the GIL is handed to a waiting thread after the
switch interval, and the loop then waits until the kernel runs the idle one again (with CPU
burners beside it, a save in the test process stalled the test's own loop in 1 run of 3).
A tiered drain's checkpointer uses it by default (``drain_priority``,
:func:`asyncckpt.drain.drainer_config`): a drain is background work, and beside a training on
every core the training lost less with it (steps 0.8-2.7 % slower beside a capped drain,
4.7-10.3 % without, medians of five runs each).

Niceness can only be raised, and ``SCHED_IDLE`` only entered, by an unprivileged process, so a
thread is never "restored": that is why this work runs on threads of its own
(:class:`CpuThreads`) rather than on anyio's shared worker threads, and why dgen-py's pool
(process-global, owned by this library) is lowered once and stays so.
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


def is_idle_class(tid: int) -> bool:
    """Whether thread ``tid`` of this process is in the kernel's ``SCHED_IDLE`` class."""
    idle = getattr(os, "SCHED_IDLE", None)
    return idle is not None and os.sched_getscheduler(tid) == idle


def priorities(tids: Iterable[int]) -> list[tuple[int, bool]]:
    """(niceness, in SCHED_IDLE) of each of these threads still alive."""
    out = []
    for tid in tids:
        try:
            out.append((nice_of(tid), is_idle_class(tid)))
        except (ProcessLookupError, PermissionError):  # exited meanwhile
            continue
    return out


def lower(tids: Iterable[int], nice: int, *, idle: bool = False) -> None:
    """Raise each thread's niceness to at least ``nice`` and, with ``idle``, move it to
    ``SCHED_IDLE`` where the system has it (never the reverse; gone threads skipped)."""
    idle_class = getattr(os, "SCHED_IDLE", None) if idle else None
    for tid in tids:
        try:
            if nice_of(tid) < nice:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
            if idle_class is not None and os.sched_getscheduler(tid) != idle_class:
                os.sched_setscheduler(tid, idle_class, os.sched_param(0))
        except (ProcessLookupError, PermissionError):  # exited meanwhile / not ours to change
            continue


def current_cpu() -> int | None:
    """The CPU the calling thread runs on (Linux ``/proc/thread-self/stat``), else None."""
    try:
        with open("/proc/thread-self/stat", "rb") as f:
            after_name = f.read().rsplit(b")", 1)[1].split()
        return int(after_name[36])  # field 39, "processor"; the list starts at field 3
    except (OSError, IndexError, ValueError):
        return None


def cpus_beside(cpu: int | None) -> frozenset[int] | None:
    """The CPUs the calling thread may use, ``cpu`` left out; None when that leaves none (or
    ``cpu`` is unknown or not among them)."""
    allowed = os.sched_getaffinity(0)
    if cpu is None or cpu not in allowed or len(allowed) < 2:
        return None
    return frozenset(allowed - {cpu})


def pin(tids: Iterable[int], cpus: Iterable[int]) -> None:
    """Let each thread run only on ``cpus`` (gone threads skipped)."""
    mask = set(cpus)
    for tid in tids:
        try:
            os.sched_setaffinity(tid, mask)
        except OSError:  # exited meanwhile, not ours to change, or a CPU the cpuset took away:
            continue  # pinning only keeps the loop's core free, never worth failing a save


class CpuThreads(ThreadPoolExecutor):
    """Worker threads for CPU-only calls, each started at niceness ``nice`` (and in
    ``SCHED_IDLE`` with ``idle``) and, once :attr:`cpus` is set, only on those CPUs."""

    def __init__(self, threads: int, nice: int, *, idle: bool = False) -> None:
        self.cpus: frozenset[int] | None = None
        self._nice, self._idle = nice, idle
        super().__init__(threads, thread_name_prefix="asyncckpt-cpu", initializer=self._started)

    def _started(self) -> None:
        tid = threading.get_native_id()
        lower([tid], self._nice, idle=self._idle)
        if self.cpus is not None:
            pin([tid], self.cpus)

    def tids(self) -> tuple[int, ...]:
        """The native ids of its threads started so far."""
        return tuple(t.native_id for t in self._threads if t.native_id is not None)

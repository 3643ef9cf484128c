"""Catch a test's event loop being blocked: every callback of the loop's thread is timed, and
one that held the thread for ``SLOW_CALLBACK_S`` or more fails the test.

Why not asyncio's debug mode (``slow_callback_duration``): it times wall-clock, so on a busy
2-core machine a callback that merely waited for a CPU looks blocked; and its own bookkeeping
(a stack with an ``os.stat`` per frame for every handle) waits for the GIL at each of those
calls whenever a worker thread runs Python, which inflated the same callbacks 10-fold. Here
the time the thread spent runnable but waiting for a CPU (``/proc/thread-self/schedstat``,
second field) is taken out: what is left is the callback computing, sleeping or blocked in a
call, which is what "never block the loop" is about. A callback that never slept held the
thread only for its CPU time (first field): the rest of its wall time the virtual machine
was not running it (the hypervisor's steal; CI once saw a 0.41 s stall in a callback that
only sets a future's result). Time in the garbage collector (in
any thread: it holds the GIL) is taken out too: a full collection of a test process's heap
takes 0.1-0.15 s wherever allocations trigger it, whoever made the garbage.
"""

from __future__ import annotations

import asyncio
import gc
import os
import resource
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

SLOW_CALLBACK_S = 0.1
_SCHEDSTAT = "/proc/thread-self/schedstat"


class _GcClock:
    """Seconds spent in the garbage collector since the process started watching."""

    def __init__(self) -> None:
        self.total = 0.0
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.total += time.perf_counter() - self._start


def _runqueue_wait(fd: int) -> float:
    """Seconds this thread has spent runnable but not running (waiting for a CPU)."""
    return int(os.pread(fd, 96, 0).split()[1]) / 1e9


def _on_cpu(fd: int) -> float:
    """Seconds this thread has run on a CPU (without the hypervisor's steal, where the guest
    kernel accounts it: paravirtual steal time)."""
    return int(os.pread(fd, 96, 0).split()[0]) / 1e9


class _StartClock:
    """Seconds the loop's thread spent in ``Thread.start`` (which waits until the new thread
    has run its first Python: on a loaded machine, its wait for a CPU and the GIL), how many
    threads it started, and how much of that time it was off the CPU (``idle``: waiting for
    the new thread to be scheduled, which the guard takes out as it does a wait for a CPU)."""

    def __init__(self, thread: int) -> None:
        self.total = 0.0
        self.idle = 0.0
        self.count = 0
        self.inside = False  # the loop's thread is in Thread.start now
        self.original = original = threading.Thread.start
        clock = self

        def start(started: threading.Thread) -> None:
            if threading.get_ident() != thread:
                return original(started)
            ran = [0.0]  # when the new thread began: after that, the wait is for the GIL
            run = started.run

            def timed_run() -> None:
                ran[0] = time.perf_counter()
                run()

            started.run = timed_run  # type: ignore[method-assign]
            t0, c0 = time.perf_counter(), time.thread_time()
            clock.inside = True
            try:
                return original(started)
            finally:
                clock.inside = False
                took = time.perf_counter() - t0
                clock.total += took
                late = min(took, ran[0] - t0) if ran[0] else took
                clock.idle += max(0.0, late - (time.thread_time() - c0))
                clock.count += 1

        self.start = start


def _sleeps() -> int:
    """This thread's voluntary context switches (each a sleep: a lock, the GIL, a syscall)."""
    return resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw


def _waited_for_the_gil(idle: float, sleeps: int) -> bool:
    """``idle`` seconds off the CPU in ``sleeps`` sleeps look like waits for the GIL: a
    waiting thread wakes every switch interval (5 ms) to ask the holder to drop it."""
    return sleeps >= idle / (4 * sys.getswitchinterval())


def _describe(handle: asyncio.Handle) -> str:
    """The task a wake-up ran (its coroutine and where it stopped next), else the handle."""
    owner = getattr(getattr(handle, "_callback", None), "__self__", None)
    return f"{owner if isinstance(owner, asyncio.Task) else handle!r:.400}"


class _Sampler(threading.Thread):
    """Where the loop's thread is, sampled once a callback has run for ``SLOW_CALLBACK_S / 2``
    (the failure message then shows the line that held it, not only the task)."""

    def __init__(self, thread: int, starts: _StartClock) -> None:
        super().__init__(name="loop-guard-sampler", daemon=True)
        self.thread = thread
        self.starts = starts
        self.started_at = 0.0  # of the running callback; 0 between callbacks
        self.stack = ""
        self.in_start = False  # the stack was taken in Thread.start (waiting for a new thread)
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(SLOW_CALLBACK_S / 5):
            started = self.started_at
            if started and not self.stack and time.perf_counter() - started > SLOW_CALLBACK_S / 2:
                frame = sys._current_frames().get(self.thread)
                if frame is not None:
                    self.in_start = self.starts.inside
                    self.stack = "".join(traceback.format_stack(frame)[-14:])
                # a kept frame keeps its locals alive: a stream whose drop aborts an upload
                # (Mountpoint's) would then never be dropped
                del frame


@contextmanager
def guarded(slow: list[str], *, gil_waits: bool = False) -> Iterator[None]:
    """While active, append a description of each blocking callback run on this thread.

    ``gil_waits``: leave out a callback whose thread only waited for the GIL that another
    thread held: the sampler (which needs the GIL too) never ran, and the loop's thread slept
    about once per switch interval, as a thread waiting for the GIL does, while computing
    little. A callback that blocks in a call holding the GIL itself (one sleep) still counts."""
    thread = threading.get_ident()
    fd = os.open(_SCHEDSTAT, os.O_RDONLY | os.O_CLOEXEC)  # opened here: this thread's stats
    starts = _StartClock(thread)
    original = asyncio.events.Handle._run
    gc_clock = _GcClock()
    gc.callbacks.append(gc_clock)

    def timed(handle: asyncio.Handle) -> Any:
        if threading.get_ident() != thread:
            return original(handle)
        t0, w0, g0, c0 = time.perf_counter(), _runqueue_wait(fd), gc_clock.total, _on_cpu(fd)
        s0, n0, i0, v0 = starts.total, starts.count, starts.idle, _sleeps()
        sampler.stack, sampler.started_at = "", t0
        try:
            return original(handle)
        finally:
            sampler.started_at = 0.0
            took = time.perf_counter() - t0
            if took >= SLOW_CALLBACK_S:
                waited = _runqueue_wait(fd) - w0 + gc_clock.total - g0
                cpu = _on_cpu(fd) - c0 - (gc_clock.total - g0)
                # never blocked, or (marked) only waiting for a GIL held elsewhere: what it held
                # the thread for is its CPU time
                # a stack taken in Thread.start (the new thread not yet run) is no sign of blocking
                unsampled = not sampler.stack or sampler.in_start
                only_gil = gil_waits and unsampled and _waited_for_the_gil(took - cpu, _sleeps() - v0)
                if _sleeps() == v0 or only_gil:
                    waited = max(waited, took - cpu)
                waited += starts.idle - i0  # a new thread's wait to run (CI: 0.1 s on a busy machine)
                if took - waited >= SLOW_CALLBACK_S:
                    slow.append(
                        f"{_describe(handle)} took {took:.3f} s ({waited:.3f} s of it for a CPU or in GC; "
                        f"{starts.total - s0:.3f} s starting {starts.count - n0} thread(s); "
                        f"{_sleeps() - v0} sleep(s)); the loop's thread was at:\n"
                        f"{sampler.stack or '(not sampled)'}"
                    )

    sampler = _Sampler(thread, starts)
    sampler.start()
    asyncio.events.Handle._run = timed  # type: ignore[method-assign]
    threading.Thread.start = starts.start  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        asyncio.events.Handle._run = original  # type: ignore[method-assign]
        threading.Thread.start = starts.original  # type: ignore[method-assign]
        gc.callbacks.remove(gc_clock)
        sampler.stop.set()
        sampler.join()
        os.close(fd)

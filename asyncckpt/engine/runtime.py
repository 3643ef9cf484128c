"""The runtime every save and load of one checkpointer shares: the thread budget, the buffer
pool, the executor of blocking calls, the CPU lane and the lock that serialises their use.

It is built lazily (nothing is allocated until the first save) and rebuilt after a stall,
whose abandoned threads may still hold buffers. Composed into
:class:`~asyncckpt.checkpointer.AsyncCheckpointer` (``ckpt.runtime``) beside the storage
router; the save and load orchestrations (``engine.save``, ``engine.load``) and the state
functions take it as an argument instead of inheriting it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from concurrent.futures import Executor
from typing import Any

from .. import priority
from ..blocking import LoopLocks, Offload, run_blocking
from ..config import CheckpointConfig
from ..cpu import helper_threads, run_queue
from ..node.topology import ThreadBudget, thread_budget
from ..pool import BufferPool
from ..priority import CpuThreads
from ..sinks.isolation import SharedBufferPool
from ..sources.base import GenSpec

log = logging.getLogger("asyncckpt")
# a save's fills and checksums "starved" (a warning) when they waited for a CPU longer than they
# ran and longer than this (a quiet machine: a few per cent of their CPU time)
STARVED_MIN_S = 0.5
#: loop-monitor ticks at least monitor.LATE_S late after which a pinned lane gets every CPU back
LATE_TICKS = 2


def _release(executors: list[Executor], pool: BufferPool | None, wait: bool) -> None:
    """Blocking part of ``aclose`` (run off the loop)."""
    for executor in executors:
        executor.shutdown(wait=wait)  # a thread stuck in a library (a stall) is not waited for
    if pool is not None:
        pool.close()


class Runtime:
    """Pool, executor, CPU lane and lock of one checkpointer; see the module docstring."""

    def __init__(self, config: CheckpointConfig) -> None:
        self.config = config
        self.budget: ThreadBudget = thread_budget(config.gen_threads, rule=config.thread_budget)
        self._pool: BufferPool | None = None
        self._executor: Offload | None = None
        self._cpu: CpuThreads | None = None  # CPU-only work at a lower priority (priority.py)
        self._pinned = False  # whether the last save's CPU-only work ran beside the loop's CPU
        self._late_ticks = 0  # loop-monitor ticks LATE_S late since the lane was last pinned
        self._helpers = True  # whether the last save's fills ran on dgen-py's pool (its lane)
        self._locks = LoopLocks()
        self.closed = False
        self._stalled = False  # set by the stall watchdog
        #: a drain's checkpointer: its CPU lane in SCHED_IDLE on purpose, a starved save is no news
        self.background = False

    # -- what tests and tools may look at ---------------------------------------------------
    @property
    def pool_now(self) -> BufferPool | None:
        """The buffer pool if one was built (None before the first save and after ``aclose``)."""
        return self._pool

    @property
    def cpu_lane(self) -> CpuThreads | None:
        """The lowered threads of fills and checksums, if a save has built them."""
        return self._cpu

    @property
    def lane_pinned(self) -> bool:
        """Whether the last save's CPU-only work ran pinned beside the loop's CPU."""
        return self._pinned

    @property
    def lock(self) -> asyncio.Lock:
        """One operation at a time per pool; one lock per event loop (a lock is bound to the
        loop that first waited on it, and sync code may call ``asyncio.run`` more than once)."""
        return self._locks.current()

    # -- executors ----------------------------------------------------------------------
    def executor(self) -> Offload:
        """The executor of blocking calls (created on first use, replaced after a stall)."""
        if self.closed:
            raise RuntimeError("AsyncCheckpointer is closed")
        if self._stalled:  # threads may still hold buffers: neither is reused (watchdog.py)
            self._executor, self._pool, self._stalled = None, None, False
        if self._executor is None:
            self._executor = self.new_executor()
        return self._executor

    def new_executor(self) -> Offload:
        """The thread budget: as many blocking calls at once as buffers, plus open/commit."""
        return Offload(self.config.num_buffers + 2)

    def new_pool(self, shared: bool) -> BufferPool:
        """The buffer pool; in shared memory when a writer process must see it."""
        cls = SharedBufferPool if shared else BufferPool
        return cls(self.config.chunk_size, self.config.num_buffers)

    def mark_stalled(self) -> None:
        """The stall watchdog gave up on a call: retire the pool and executor at next use."""
        self._stalled = True

    @property
    def cpu_lane_used(self) -> bool:
        return self.config.thread_budget == "leave_loop_core"

    def cpu_executor(self, *, helpers: bool) -> Executor:
        """Where fills and checksums run: threads of their own at ``cpu_nice``, with ``cpu_idle``
        in ``SCHED_IDLE``, with ``cpu_pin`` only beside the CPU this (the loop's) thread is on now
        (dgen-py's pool lowered and pinned to match, unless ``helpers`` is False: a save whose
        fills do not use it); or the shared budget when none applies."""
        nice, idle = self.config.resolved_cpu_nice, self.config.resolved_cpu_idle
        executor = self.executor()
        beside = priority.cpus_beside(priority.current_cpu()) if self.config.resolved_cpu_pin else None
        self._pinned, self._late_ticks, self._helpers = beside is not None, 0, helpers
        mask = beside or os.sched_getaffinity(0)  # unpinned: every CPU the loop's thread may use
        # dgen-py's pool is process-global: another checkpointer may have pinned it
        if helpers:
            priority.pin(helper_threads(), mask)
        if nice == 0 and not idle and beside is None:
            return executor
        if self._cpu is None:  # under the CPU lane one call runs at a time: one thread, reused
            # (several idle threads woken in turn left the loop a worse tail: 2.4 ms p99, not 1.2)
            self._cpu = CpuThreads(1 if self.cpu_lane_used else executor.threads, nice, idle=idle)
        if helpers:
            priority.lower(helper_threads(), nice, idle=idle)
        self._cpu.cpus = beside
        priority.pin(self._cpu.tids(), mask)
        return self._cpu

    def loop_late(self, lag: float) -> None:
        """The loop monitor saw a tick ``lag`` s late: after ``LATE_TICKS`` of them with the lane
        pinned, give it every CPU for the rest of the save. Pinned at niceness 10 beside a core
        that other processes keep busy, the lane's Python thread gets preempted while it holds
        the GIL and the loop waits for it: p99 16-24 ms with a busy loop on each core, against
        2.5-4.2 ms unpinned, whose thread the kernel moves to the loop's core as soon as the loop
        sleeps on the GIL. The next save pins again."""
        self._late_ticks += 1
        if not self._pinned or self._late_ticks < LATE_TICKS:
            return
        self._pinned = False
        if self._cpu is not None:
            self._cpu.cpus = None
        priority.pin(self.lane_tids(), os.sched_getaffinity(0))
        log.info(
            "event loop %.1f ms late with the CPU lane pinned beside its core: other threads keep "
            "the lane's cores busy, so it may use every CPU for the rest of this save",
            lag * 1e3,
        )

    def cpu_priority(
        self, method: str, *, in_library: bool, generator: str | None, lane_prepass: bool = False
    ) -> dict[str, Any]:
        """The niceness, class and pinning the save's CPU-only work ran at: the pool's fills and
        checksums on the lowered threads; generation in a writer process at its niceness (never
        SCHED_IDLE: its uploads run there too); a whole-object save's on the shared threads.
        dgen-py's pool is process-global and keeps the lowest priority any checkpointer gave it:
        a fill there ran at that, whatever this checkpointer's options. A staged state save
        (``lane_prepass``) writes CRCs it already has: its CPU-only work was the CRC pass, on
        the lane."""
        cfg = self.config
        if lane_prepass:
            return {
                "cpu_nice": cfg.resolved_cpu_nice,
                "cpu_idle": cfg.resolved_cpu_idle,
                "cpu_pinned": self._pinned,
            }
        if in_library:
            return {"cpu_nice": cfg.resolved_cpu_nice, "cpu_idle": False, "cpu_pinned": False}
        if method != "streaming":
            return {"cpu_nice": 0, "cpu_idle": False, "cpu_pinned": False}
        nice, idle = cfg.resolved_cpu_nice, cfg.resolved_cpu_idle
        if generator == "dgen":
            pool = priority.priorities(helper_threads())
            nice = max([nice, *(n for n, _ in pool)])
            idle = idle or any(i for _, i in pool)
        return {"cpu_nice": nice, "cpu_idle": idle, "cpu_pinned": self._pinned}

    def lane_tids(self) -> tuple[int, ...]:
        """The threads that run fills and checksums (at a lower priority unless niceness 0):
        dgen-py's pool among them only if the last save's fills used it."""
        own = self._cpu.tids() if self._cpu is not None else ()
        return (*own, *(helper_threads() if self._helpers else ()))

    def warn_if_starved(self, before: tuple[float, float]) -> None:
        """Say so when ``SCHED_IDLE`` kept the save's fills and checksums waiting for a CPU more
        than running: other threads kept every CPU busy (two CPU burners on the 2-core VM: a
        save ran at 0.011-0.014 GB/s, at 0.5-0.9 with niceness 10 alone)."""
        lane = self.lane_tids()
        cpu, waited = (b - a for a, b in zip(before, run_queue(lane), strict=True))
        # the class the lane really ran in: dgen-py's pool keeps what an earlier save gave it
        idle = self.config.resolved_cpu_idle or any(i for _, i in priority.priorities(lane))
        if idle and waited > max(STARVED_MIN_S, cpu):
            if self.background:  # by design: the drain gives way to the training
                log.info(
                    "a drain's checksums waited %.2f s for a CPU and ran %.2f s: other threads held "
                    "every CPU; drain_priority='lane' gives the drain a share (niceness %d)",
                    waited,
                    cpu,
                    self.config.resolved_cpu_nice,
                )
                return
            log.warning(
                "the save's fills and checksums waited %.2f s for a CPU and ran %.2f s: other "
                "threads held every CPU and SCHED_IDLE (cpu_idle) gives this work only what they "
                "leave; cpu_idle=False gives it a share (niceness %d), at the cost of event-loop lag",
                waited,
                cpu,
                self.config.resolved_cpu_nice,
            )

    def writer_spec(self, spec: GenSpec) -> GenSpec:
        """Generation in a writer process may take the rank's whole CPU share when the writer
        runs at a background niceness: the core "leave_loop_core" keeps free is for a loop in
        another process, and the niceness already lets that loop take a core the moment it
        wakes (s3dlio: 2 generator threads, not 1, on the 2-core reference VM)."""
        b = self.budget
        if b.overridden or self.config.resolved_cpu_nice == 0 or b.share <= spec.threads:
            return spec
        return dataclasses.replace(spec, threads=b.share)

    # -- the pool -------------------------------------------------------------------------
    async def pool(self, shared: bool = False) -> BufferPool:
        """The buffer pool, built and pre-touched on first use; in shared memory when a writer
        process must see it (it then stays there)."""
        if shared and self._pool is not None and not isinstance(self._pool, SharedBufferPool):
            await self._pool.faulted()
            await run_blocking(self.executor(), self._pool.close)
            self._pool = None
        if self._pool is None:
            pool = self.new_pool(shared)
            pool.fault_in(self.executor())  # buffer by buffer, beside the save that needs them
            self._pool = pool
        return self._pool

    async def aclose(self) -> None:
        """Shut the executors down and unmap the pool, off the loop thread: unmapping a large
        pool (and joining threads) took tens of milliseconds on it. Idempotent."""
        self.closed = True
        executors: list[Executor] = [e for e in (self._executor, self._cpu) if e is not None]
        self._executor = self._cpu = None
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.faulted()  # no memset may run in a pool being unmapped
        if self._stalled:  # a stuck thread may still read the pool: unmapped when unused
            pool = None
        if executors or pool is not None:
            await run_blocking(Offload(1), _release, executors, pool, not self._stalled)

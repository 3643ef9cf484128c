"""The producer side of the pipeline: something that fills buffers with checkpoint bytes."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from ..blocking import run_blocking


class Source(ABC):
    """Fills caller-owned buffers, in order, with exactly ``total_size`` bytes.

    ``fill`` returns the byte count and the *pure* production time measured where the work
    happens (inside the worker thread), so time spent queued in the executor or blocked on
    back-pressure never counts as generation time.
    """

    kind: str = "source"
    #: whether a fill is CPU work (generation, a copy) that takes turns with the checksums on
    #: the CPU lane; a fill that waits on storage (a read) does not hold the lane
    uses_cpu: bool = True
    #: whether fills run on a generator library's own process-global threads (dgen-py's pool),
    #: which a save then lowers and pins with its CPU lane; a save of other bytes (a drain's
    #: read) leaves them as they are
    uses_helpers: bool = False

    def __init__(self, total_size: int) -> None:
        self.total_size = total_size
        self.position = 0
        #: CPU seconds of the fills so far, measured in the threads that did them
        #: (:meth:`helper_cpu` adds threads a library runs of its own)
        self.cpu_s = 0.0

    @abstractmethod
    async def fill(self, buf: memoryview, executor: Executor) -> tuple[int, float]:
        """Fill ``buf`` completely (or up to the end of the data); return (bytes, seconds)."""

    def describe(self) -> dict[str, Any]:
        """Facts for the run metadata (generator name, seed, threads)."""
        return {"generator": self.kind}

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources; idempotent."""

    def helper_cpu(self) -> float:
        """Cumulative CPU seconds of threads the generator library runs itself (0: none)."""
        return 0.0

    def gen_spec(self) -> GenSpec | None:
        """How to regenerate this source's byte stream elsewhere (a writer process that
        generates straight into a client library's memory), or None if it cannot be."""
        return None


@dataclass(frozen=True)
class GenSpec:
    """A picklable recipe for a fresh synthetic source: the same bytes wherever it runs, as
    long as it is filled with the same chunk sizes in the same order
    (:func:`asyncckpt.sources.spec.source_from_spec` makes the source). ``checksums``: whether
    the handle that generates the chunks also takes each one's CRC32C (``integrity``)."""

    generator: str
    total_size: int
    seed: int
    threads: int
    checksums: bool = True


class ThreadedSource(Source):
    """A source whose ``fill_sync`` is blocking work run in the owned executor."""

    @abstractmethod
    def fill_sync(self, buf: memoryview) -> int:
        """Fill ``buf`` (blocking); return the bytes written."""

    def _timed_fill(self, buf: memoryview) -> tuple[int, float]:
        cpu = time.thread_time() + self.helper_cpu()
        start = time.perf_counter()
        n = self.fill_sync(buf)
        seconds = time.perf_counter() - start
        self.cpu_s += time.thread_time() + self.helper_cpu() - cpu  # one fill at a time: no race
        return n, seconds

    async def fill(self, buf: memoryview, executor: Executor) -> tuple[int, float]:
        want = min(len(buf), self.total_size - self.position)
        if want <= 0:
            return 0, 0.0
        n, seconds = await run_blocking(executor, self._timed_fill, buf[:want])
        self.position += n
        return n, seconds


async def fill_sequentially(source: Source, buf: memoryview, chunk: int, executor: Executor) -> float:
    """Fill a large buffer chunk by chunk (the same byte stream as streaming); return seconds."""
    total = 0.0
    for offset in range(0, len(buf), chunk):
        _, seconds = await source.fill(buf[offset : offset + chunk], executor)
        total += seconds
    return total

"""dgen-py, the default generator: Rust, multithreaded, releases the GIL, no copies.

dgen-py sizes one process-global Rayon pool from ``DGEN_THREADS`` / ``RAYON_NUM_THREADS``
when its first Generator is built; ``max_threads`` only switches between a sequential and a
parallel code path (and the two produce *different* bytes). So the budget is applied through
the environment before first use, ``max_threads`` is left at its default so the byte stream
does not depend on the thread count, and the pool size is verified by counting the threads
that appeared.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from ..cpu import helper_cpu, register_helper_threads
from ..env import export
from ..errors import MissingDependencyError
from .base import GenSpec, ThreadedSource

log = logging.getLogger("asyncckpt")

_lock = threading.Lock()
_pool_threads: int | None = None  # verified size of dgen-py's pool in this process
_pool_requested: int | None = None


def _thread_ids() -> set[int]:
    try:
        return {int(t) for t in os.listdir("/proc/self/task")}
    except OSError:  # pragma: no cover - no procfs
        return set()


def _import_dgen() -> Any:
    try:
        import dgen_py
    except ImportError as exc:  # pragma: no cover - dgen-py is a core dependency
        raise MissingDependencyError("dgen-py", "dgen", "the dgen generator") from exc
    return dgen_py


def _start_pool(threads: int) -> None:
    """Start dgen-py's pool with ``threads`` workers, once per process, and measure it."""
    global _pool_threads, _pool_requested
    with _lock:
        if _pool_requested is not None:
            return
        dgen_py = _import_dgen()
        export({"DGEN_THREADS": str(threads), "RAYON_NUM_THREADS": str(threads)})  # read at pool start
        before = _thread_ids()
        dgen_py.Generator(size=4096, seed=0)
        new = _thread_ids() - before
        register_helper_threads(new)  # fills run on these threads, not on the calling one
        # The pool adds its workers plus one helper thread (measured with DGEN_THREADS=1,2,5).
        started = len(new) - 1
        _pool_requested = threads
        _pool_threads = started if started >= 1 else None
        if _pool_threads is not None and _pool_threads != threads:
            log.warning(
                "dgen-py pool has %d threads, %d requested (pool was started earlier in this "
                "process; its size cannot change)",
                _pool_threads,
                threads,
            )


def pool_threads() -> tuple[int | None, int | None]:
    """(verified, requested) size of dgen-py's pool, or Nones before first use."""
    return _pool_threads, _pool_requested


class DgenSource(ThreadedSource):
    """Seeded, reproducible synthetic bytes from dgen-py.

    The bytes depend on the seed and on the buffer size of each fill, so a checkpoint is
    reproduced by regenerating it with the same seed and chunk size.
    """

    kind = "dgen"
    uses_helpers = True

    def __init__(self, total_size: int, *, seed: int, threads: int) -> None:
        super().__init__(total_size)
        _start_pool(threads)
        self.seed = seed
        self.threads = threads
        self._gen = _import_dgen().Generator(size=max(total_size, 1), seed=seed)

    def gen_spec(self) -> GenSpec | None:
        if self.position:  # a recipe replays the stream from its start only
            return None
        return GenSpec("dgen", self.total_size, self.seed, self.threads)

    def fill_sync(self, buf: memoryview) -> int:
        n: int = self._gen.fill_chunk(buf)
        return n

    def helper_cpu(self) -> float:
        return helper_cpu()

    def describe(self) -> dict[str, Any]:
        verified, requested = pool_threads()
        return {
            "generator": self.kind,
            "seed": self.seed,
            "gen_threads": verified,
            "gen_threads_requested": requested,
        }

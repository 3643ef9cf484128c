"""An :class:`AsyncCheckpointer` on an event loop of its own thread, for synchronous callers.

Frameworks such as PyTorch DCP call their storage layer synchronously (and ``async_save`` from
a worker thread). Running asyncckpt's coroutines on a private loop keeps the pool, the
executor and any open connections alive between calls, as a training loop that checkpoints
every N steps wants, and never touches the caller's own loop (if it has one).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future, wait
from typing import Any, TypeVar

from ..checkpointer import AsyncCheckpointer
from ..config import CheckpointConfig

T = TypeVar("T")
Job = Callable[[AsyncCheckpointer], Coroutine[Any, Any, T]]


class CheckpointerThread:
    """Starts its thread and checkpointer on first use; ``close()`` releases both (idempotent)."""

    def __init__(self, config: CheckpointConfig, name: str) -> None:
        self._config = config
        self._name = name
        self._guard = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ckpt: AsyncCheckpointer | None = None
        self._pending: set[Future[Any]] = set()
        self._stop: asyncio.Event | None = None  # set to end the loop's root task (close)

    def submit(self, job: Job[T]) -> Future[T]:
        """Schedule ``job(checkpointer)`` on the private loop; a concurrent future of its result."""
        with self._guard:
            if self._loop is None:
                self._start()
            assert self._loop is not None
            if threading.current_thread() is self._thread:
                raise RuntimeError(f"{self._name}: called from its own event loop (it would wait on itself)")
            future = asyncio.run_coroutine_threadsafe(self._call(job), self._loop)
            self._pending.add(future)
            future.add_done_callback(self._pending.discard)
            return future

    def run(self, job: Job[T]) -> T:
        """``job(checkpointer)``, waited for on the calling thread."""
        return self.submit(job).result()

    async def _call(self, job: Job[T]) -> T:
        if self._ckpt is None:
            self._ckpt = AsyncCheckpointer(self._config)
        return await job(self._ckpt)

    def _start(self) -> None:
        loop = asyncio.new_event_loop()
        ready = threading.Event()
        stop = asyncio.Event()
        self._stop = stop

        async def root() -> None:
            ready.set()
            await stop.wait()

        def serve() -> None:
            # run_until_complete, not run_forever: anyio ties its worker threads to the task run
            # by run_until_complete; under run_forever every job was its own root, so the
            # threads of each save were stopped when it returned and the next save started new
            # ones (the second thread of a staged copy started 2-5 ms late on the reference VM)
            asyncio.set_event_loop(loop)
            loop.run_until_complete(root())

        # a daemon: an interpreter exiting without close() is not held up by an idle loop
        self._thread = threading.Thread(target=serve, name=self._name, daemon=True)
        self._thread.start()
        ready.wait()
        self._loop = loop

    def close(self) -> None:
        """Close the checkpointer (a save still running finishes first), stop and join the thread."""
        with self._guard:
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
            stop, self._stop = self._stop, None
        if loop is None or thread is None or stop is None:
            return
        try:
            wait(list(self._pending))  # e.g. an async_save nobody waited for: it completes, then we close
            if self._ckpt is not None:
                ckpt, self._ckpt = self._ckpt, None
                asyncio.run_coroutine_threadsafe(ckpt.aclose(), loop).result()
        finally:
            loop.call_soon_threadsafe(stop.set)
            thread.join()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
            loop.close()

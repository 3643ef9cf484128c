"""The storage router: a URI in, a watched handle out.

It decides, once per URI, which backend serves it, whether that backend runs in a writer
process, which store (client, connection pool) its objects share, and puts every handle under
the stall watchdog. The checkpointer composes one (``ckpt.storage``) beside its runtime; steps,
the manager and the state functions ask it for handles and capabilities instead of reaching
into the checkpointer. Models: obstore's one store per bucket and ``from_url``; zarr's
``Store`` over keys with capability flags.

Clients and writer processes belong to the event loop they were made on: the router closes them
as that loop ends and builds new ones on the next (``loops.py``), so sync code may call
``asyncio.run`` more than once with one checkpointer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.process import BaseProcess

from ..blocking import Offload, run_blocking
from ..errors import ConfigError
from .base import Sink, SinkOptions
from .isolation import WriterPolicy, resolve_policy
from .isolation.proc import reap
from .isolation.process_sink import ProcessSink, WriterPool
from .loops import LoopBound
from .registry import BACKENDS, backend_class, import_backend, resolve_backend
from .store import Store
from .watchdog import watch

#: backends whose modules this process has imported (off the loop, by ``handle``)
_IMPORTED: set[str] = set()
log = logging.getLogger("asyncckpt")


def _close_abandoned(stacks: list[contextlib.AsyncExitStack], procs: list[BaseProcess]) -> None:
    """Blocking: close clients whose loop is gone on a private loop of this worker thread (what
    needs the dead loop is skipped by the library or fails here, quietly), and reap writers."""
    for stack in stacks:
        try:
            asyncio.run(stack.aclose())
        except Exception as exc:  # best effort: the loop they needed is gone
            log.debug("closing clients of an ended event loop: %s", exc)
    for proc in procs:
        reap(proc, 5.0)  # the child saw EOF on its pipe and is exiting
        proc.close()


@dataclass(frozen=True)
class Routing:
    """What the router needs of the configuration (``CheckpointConfig.routing()``)."""

    backend: str | None
    isolation: str
    mp_start_method: str | None
    stall_timeout: float
    writer_timeout: float
    options: SinkOptions
    #: threads of a writer process (as many blocking calls as buffers, plus open/commit)
    child_threads: int = 4
    #: niceness of a writer process
    nice: int = 0


class StorageRouter:
    """URI -> handle; see the module docstring.

    ``executor`` gives the runtime's current executor (a stall replaces it); ``on_stall`` tells
    the runtime that the watchdog abandoned a call.
    """

    def __init__(
        self, routing: Routing, *, executor: Callable[[], Offload], on_stall: Callable[[], None]
    ) -> None:
        self.routing = routing
        self._executor = executor
        self._on_stall = on_stall
        self._stores: dict[str, Store] = {}  # backend name -> store
        self._retired: list[Store] = []
        #: writer processes, reused by every object (isolation)
        self.writers = WriterPool()
        self._loops = LoopBound(self._release, self._abandon)

    def route(self, uri: object) -> tuple[str, WriterPolicy]:
        """The backend serving ``uri`` and whether it runs in a writer process; no I/O."""
        if not isinstance(uri, (str, os.PathLike)):
            raise ConfigError(f"uri must be a string or path, got {uri!r}")
        r = self.routing
        name = resolve_backend(os.fspath(uri), r.backend)
        return name, resolve_policy(name, isolation=r.isolation, mp_start_method=r.mp_start_method)

    def backend_of(self, uri: object) -> type[Sink]:
        """The sink class serving ``uri``: its class attributes are the capabilities
        (``has_directories``, ``default_in_flight``, ...); nothing is imported but our module."""
        return backend_class(self.route(uri)[0])

    async def prepare(self, uri: object) -> None:
        """Import ``uri``'s backend module and client library in a thread the first time
        (``import s3dlio`` takes 1.6 s, aiobotocore's a few tenths): not on the loop. A writer
        process imports its own. Called before any handle does I/O: it also follows the running
        event loop (clients and writers of an ended loop are replaced)."""
        await self._loops.enter()
        name, policy = self.route(uri)
        if name not in _IMPORTED and policy.isolation != "process":
            await run_blocking(self._executor(), import_backend, name)
            _IMPORTED.add(name)

    async def handle(self, uri: str | os.PathLike[str]) -> Sink:
        """A handle for ``uri``, its backend imported off the loop, under the stall watchdog."""
        await self.prepare(uri)
        return self.handle_nowait(uri)

    def handle_nowait(self, uri: str | os.PathLike[str]) -> Sink:
        """:meth:`handle` without the import, for synchronous callers (``iter_load``), which
        call :meth:`prepare` before the first I/O."""
        name, policy = self.route(uri)
        return watch(
            self._unwatched(os.fspath(uri), name, policy), self.routing.stall_timeout, self._on_stall
        )

    def _unwatched(self, uri: str, name: str, policy: WriterPolicy) -> Sink:
        r = self.routing
        if policy.isolation == "process":
            return ProcessSink(
                uri,
                backend=r.backend,
                executor=self._executor(),
                options=r.options,
                policy=policy,
                timeout=r.writer_timeout,
                child_threads=r.child_threads,
                pool=self.writers,
                nice=r.nice,
            )
        return self._store(name).handle(uri)

    def _store(self, name: str) -> Store:
        """One store per backend for the router's life: its objects share one client."""
        executor = self._executor()
        store = self._stores.get(name)
        if store is not None and store.executor is not executor:
            self._retired.append(store)  # a stall retired its executor: closed at aclose
            store = None
        if store is None:
            store = self._stores[name] = Store(
                name, BACKENDS[name], executor=executor, options=self.routing.options
            )
        return store

    async def settle(self) -> None:
        """Wait for the work saves left running after they returned (the unlink of a replaced
        file's aside name) in this process's stores; ``aclose`` does it too. A writer process
        finishes its own before it exits."""
        for store in [*self._retired, *self._stores.values()]:
            await store.settle()

    async def aclose(self) -> None:
        """Close every store's clients and reap every writer process; idempotent."""
        await self._loops.leave()
        await self._release()  # what was made before any loop was bound (nothing, usually)
        self._stores = {}

    async def _release(self) -> None:
        """The loop they belong to ends (or ``aclose``): close the stores' clients and the
        writer processes on it. The stores stay, for the next loop's clients."""
        stores, self._retired = [*self._retired, *self._stores.values()], []
        for store in stores:
            await store.aclose()
        await self.writers.aclose()

    async def _abandon(self) -> None:
        """The loop they belong to ended without closing them: nothing is awaited on it; the
        clients are closed from a worker thread where they can be, the writers reaped."""
        stacks = [store.shared.abandon() for store in [*self._retired, *self._stores.values()]]
        self._retired = []
        procs = self.writers.abandon()
        if stacks or procs:
            await run_blocking(self._executor(), _close_abandoned, stacks, procs)

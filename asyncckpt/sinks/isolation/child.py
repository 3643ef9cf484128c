"""The writer process: one event loop serving the objects of one backend, driven over a
pipe by ProcessSink handles; its sinks share one store (one client for all of them).

Requests are ``(kind, request_id, handle_id, *args)``; ``bind`` names the object of a handle
and ``release`` closes it. Each request runs as its own task so writes overlap up to the
parent's ``max_in_flight``, and each is answered ``("ok", id, value)`` or
``("err", id, packed_exception)``. Chunk data is never sent: ``write`` names an offset in
the shared arena. If the parent vanishes (EOF) every write in progress is aborted.
"""

from __future__ import annotations

import asyncio
import contextlib
import mmap
import os
import pickle
import signal
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from ...blocking import Offload, run_blocking
from ...priority import lower
from ...sources.base import GenSpec
from ..base import InPlaceWrite, Sink, SinkOptions
from ..registry import BACKENDS, import_backend
from ..shm import SharedArena
from ..store import Store

Packed = tuple[str, Any, str]


@dataclass(frozen=True)
class ChildSpec:
    """Everything the child needs, picklable for spawn and forkserver."""

    backend: str
    options: SinkOptions
    arena_path: str | None
    arena_size: int
    threads: int
    nice: int = 0  # raised before any thread starts: every thread of the child inherits it
    close_fds: tuple[int, ...] = ()  # fork only: the parent's end of the pipe
    # the parent's environment and directory *now*: a forkserver child would otherwise see
    # those of the moment the server started (stale AWS_* variables, another .env)
    environ: dict[str, str] | None = field(default=None, repr=False)  # holds secrets
    cwd: str | None = None


def pack_error(exc: BaseException) -> Packed:
    """The exception itself when it survives pickling, else its type name and message."""
    try:
        data = pickle.dumps(exc)
        pickle.loads(data)
        return ("pickle", data, "")
    except Exception:
        return ("text", type(exc).__qualname__, str(exc))


def main(conn: Connection, spec: ChildSpec) -> None:
    """Process entry point (must be importable by name for spawn/forkserver)."""
    for fd in spec.close_fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    if spec.environ is not None:
        # env-write: a forkserver/spawn child takes its parent's environment as of the save
        os.environ.clear()
        os.environ.update(spec.environ)
    if spec.cwd is not None:
        with contextlib.suppress(OSError):
            os.chdir(spec.cwd)
    # the writer's CPU (generation in place, a client's runtime) is background work: the
    # parent's event loop gets a core first; set before any thread starts, so all inherit it
    lower([threading.get_native_id()], spec.nice)
    # Ctrl-C reaches the whole process group; the parent decides how the save ends
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    asyncio.run(_Server(conn, spec).serve())


_KEEP_RELEASED = 64


class _Server:
    def __init__(self, conn: Connection, spec: ChildSpec) -> None:
        self.conn = conn
        self.spec = spec
        self.executor = Offload(spec.threads)
        self.arena = SharedArena.attach(spec.arena_path, spec.arena_size) if spec.arena_path else None
        self.view = memoryview(self.arena) if self.arena is not None else None
        self.tasks: dict[int, set[asyncio.Task[None]]] = {}  # handle id → its requests in flight
        self.store = Store(spec.backend, BACKENDS[spec.backend], executor=self.executor, options=spec.options)
        self.sinks: dict[int, Sink] = {}
        # storage-call CPU of handles released before their last CPU reading (a load reads
        # it after closing the reader); read once, and only the latest few are kept
        self.released_cpu: dict[int, float | None] = {}

    def sink(self, hid: int) -> Sink:
        return self.sinks[hid]

    def reply(self, msg: tuple[Any, ...]) -> None:
        with contextlib.suppress(OSError):  # the parent is gone: nobody to tell
            self.conn.send(msg)

    def _read_pipe(self, loop: asyncio.AbstractEventLoop, inbox: asyncio.Queue[Any]) -> None:
        while True:
            try:
                msg: Any = self.conn.recv()
            except (EOFError, OSError):
                msg = None
            loop.call_soon_threadsafe(inbox.put_nowait, msg)
            if msg is None or msg[0] == "close":
                return

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue[Any] = asyncio.Queue()
        threading.Thread(target=self._read_pipe, args=(loop, inbox), daemon=True).start()
        try:
            while True:
                msg = await inbox.get()
                if msg is None:  # parent gone: abandon every object
                    await self._settle(list(self.tasks), cancel=True)
                    for sink in self.sinks.values():
                        await sink.abort()
                    return
                kind, rid, hid, *args = msg
                if kind in ("abort", "release", "close"):
                    handles = list(self.tasks) if kind == "close" else [hid]
                    await self._settle(handles, cancel=kind == "abort")
                    await self._handle(kind, rid, hid, args)
                    if kind == "close":
                        return
                else:
                    task = asyncio.create_task(self._handle(kind, rid, hid, args))
                    running = self.tasks.setdefault(hid, set())
                    running.add(task)
                    task.add_done_callback(running.discard)
        finally:
            for sink in self.sinks.values():
                await sink.aclose()
            await self.store.aclose()
            self.executor.shutdown(wait=True)
            if self.view is not None:
                self.view.release()
            if self.arena is not None:
                self.arena.close()
            self.conn.close()

    async def _settle(self, handles: list[int], *, cancel: bool) -> None:
        """Let the handles' requests finish (or cancel them; sinks wait for their threads)."""
        tasks = [t for hid in handles for t in self.tasks.get(hid, ())]
        if cancel:
            for task in tasks:
                task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    async def _handle(self, kind: str, rid: int, hid: int, args: list[Any]) -> None:
        try:
            result = await getattr(self, f"do_{kind}")(hid, *args)
        except asyncio.CancelledError:
            self.reply(("err", rid, pack_error(RuntimeError(f"{kind} cancelled by abort"))))
        except BaseException as exc:
            self.reply(("err", rid, pack_error(exc)))
        else:
            self.reply(("ok", rid, result))

    # -- requests ----------------------------------------------------------------------
    async def do_warm(self, hid: int) -> None:
        del hid
        # the client library itself (s3dlio: 1-2 s, its runtime starting), so the first open,
        # which the stall watchdog times, is storage I/O only
        await run_blocking(self.executor, import_backend, self.spec.backend)

    async def do_bind(self, hid: int, uri: str) -> None:
        self.sinks[hid] = self.store.handle(uri)

    async def do_release(self, hid: int) -> None:
        self.tasks.pop(hid, None)
        sink = self.sinks.pop(hid, None)
        if sink is not None:
            await sink.aclose()
            self.released_cpu[hid] = sink.storage_cpu.total if sink.storage_cpu is not None else None
            while len(self.released_cpu) > _KEEP_RELEASED:
                del self.released_cpu[next(iter(self.released_cpu))]

    async def do_open(self, hid: int, size: int) -> dict[str, Any]:
        sink = self.sink(hid)
        sink.check()
        await sink.open(size)
        temp = getattr(sink, "temp_path", None)
        return {
            "temp_path": os.fspath(temp) if temp is not None else None,
            "describe": sink.describe(),
            "writes_in_flight": sink.writes_in_flight(),
            "write_behind": sink.write_behind(),
        }

    async def do_write(self, hid: int, offset: int, at: int, length: int) -> float:
        assert self.view is not None, "write from the arena without an arena"
        return await self.do_write_view(hid, offset, self.view[at : at + length])

    async def do_write_inline(self, hid: int, offset: int, data: bytes) -> float:
        scratch = mmap.mmap(-1, max(len(data), 1))  # page-aligned, as O_DIRECT needs
        view = memoryview(scratch)[: len(data)]
        try:
            view[:] = data
            return await self.do_write_view(hid, offset, view)
        finally:
            view.release()
            # a client library may still hold a view of it after the call (minio's urllib3
            # did): the mapping is then freed with that view, not closed under it
            with contextlib.suppress(BufferError):
                scratch.close()

    async def do_write_view(self, hid: int, offset: int, view: memoryview) -> float:
        start = time.perf_counter()
        inner = await self.sink(hid).write_part(offset, view)
        return inner if inner is not None else time.perf_counter() - start

    async def do_begin_generation(self, hid: int, spec: GenSpec) -> bool:
        return await self.sink(hid).begin_generation(spec)

    async def do_write_generated(self, hid: int, offset: int, nbytes: int) -> InPlaceWrite:
        return await self.sink(hid).write_generated(offset, nbytes)

    async def do_complete(self, hid: int) -> tuple[dict[str, float], dict[str, Any]]:
        timings = await self.sink(hid).complete()
        return timings, self.sink(hid).describe()

    async def do_abort(self, hid: int) -> None:
        if hid in self.sinks:
            await self.sinks[hid].abort()

    async def do_close(self, hid: int) -> None:
        return None  # serve() closes the sinks on the way out

    async def do_read(self, hid: int, offset: int, at: int, length: int) -> int:
        assert self.view is not None, "read into the arena without an arena"
        return await self.sink(hid).read_into(offset, self.view[at : at + length])

    async def do_read_inline(self, hid: int, offset: int, length: int) -> bytes:
        scratch = mmap.mmap(-1, max(length, 1))
        view = memoryview(scratch)[:length]
        try:
            n = await self.sink(hid).read_into(offset, view)
            return bytes(view[:n])
        finally:
            view.release()
            # a client library may still hold a view of it after the call (minio's urllib3
            # did): the mapping is then freed with that view, not closed under it
            with contextlib.suppress(BufferError):
                scratch.close()

    async def do_size(self, hid: int) -> int:
        return await self.sink(hid).size()

    async def do_check_unchanged(self, hid: int) -> None:
        await self.sink(hid).check_unchanged()

    async def do_delete(self, hid: int) -> None:
        await self.sink(hid).delete()

    async def do_list(self, hid: int) -> list[str]:
        return await self.sink(hid).list_names()

    async def do_cpu(self, hid: int) -> tuple[float, float | None]:
        """This process's CPU seconds so far (all threads) and the handle's storage-call CPU."""
        if hid in self.sinks:
            tally = self.sinks[hid].storage_cpu
            return time.process_time(), tally.total if tally is not None else None
        return time.process_time(), self.released_cpu.pop(hid, None)

    async def do_describe(self, hid: int) -> dict[str, Any]:
        return self.sink(hid).describe()

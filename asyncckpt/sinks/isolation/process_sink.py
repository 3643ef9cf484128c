"""``ProcessSink``: any sink, run in a writer process, driven without blocking the loop.

A :class:`WriterProcess` is one child serving any number of objects of one backend (its own
store: one client for all of them); a :class:`WriterPool` keeps one per backend and shared
arena for a checkpointer's life, so ten saves start one process (anyio's ``to_process``
reuses its workers the same way). A :class:`ProcessSink` is the handle of one object in it.

The parent keeps generating into the shared pool; a write sends only ``(offset, arena
offset, length)`` and the buffer goes back to the pool when the child's acknowledgement (with
its measured write seconds) arrives. Replies are read by ``loop.add_reader`` on the pipe;
requests are sent by one dedicated thread, so a stuck child can never block the loop. A
child that dies is noticed by EOF on the pipe; one that stalls, by ``timeout`` per request.
Either way the child is killed and reaped, pending calls fail with WriterProcessError, the
pool starts a new child for the next object, and a temporary file the child reported at
open is removed by the parent.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import multiprocessing
import os
import pickle
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, ClassVar

from ... import env
from ...blocking import run_blocking
from ...cpu import CpuCounters
from ...errors import ConfigError, WriterProcessError
from ...sources.base import GenSpec
from ..base import InPlaceWrite, Sink, SinkOptions
from ..file import path_from_uri
from ..registry import backend_class, make_sink, resolve_backend
from ..shm import SharedArena
from . import child
from .policy import LOCAL_BACKENDS, WriterPolicy
from .proc import exit_text, preload_in_forkserver, reap, refuse_unguarded_main, start_process

log = logging.getLogger("asyncckpt")
DEFAULT_TIMEOUT = 300.0
_HANDLES = itertools.count(1)  # object ids within any writer process (unique per parent)
_INLINE_READ = 1 << 20  # reads into caller memory come back in pieces this big


class WriterProcess:
    """One writer child for backend ``backend``: started on first use, reused until closed."""

    def __init__(
        self,
        backend: str,
        *,
        executor: Executor,
        options: SinkOptions,
        policy: WriterPolicy,
        timeout: float,
        child_threads: int,
        arena: SharedArena | None,
        nice: int = 0,
    ) -> None:
        self.backend = backend
        self.executor = executor
        self.options = options
        self.policy = policy
        self.timeout = timeout
        self.child_threads = child_threads
        self.arena = arena
        self.nice = nice
        self._proc: BaseProcess | None = None
        self._pid: int | None = None
        self._conn: Connection | None = None
        self._sender: ThreadPoolExecutor | None = None
        self._reading = False
        self._closing = False
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._ids = itertools.count(1)
        self._dead: str | None = None  # why the writer is gone; each raise gets a fresh error
        self._exit_task: asyncio.Task[None] | None = None
        self._start_lock = asyncio.Lock()

    @property
    def pid(self) -> int | None:
        """The writer process's pid (kept after it exited, for messages and results)."""
        return self._pid

    @property
    def usable(self) -> bool:
        """Whether a new object may use it: not dead, not closing."""
        return self._dead is None and not self._closing

    async def start(self) -> None:
        async with self._start_lock:
            if self._dead is not None:
                raise WriterProcessError(self._dead)
            if self._proc is not None:
                return
            refuse_unguarded_main()
            method = self.policy.start_method
            if method == "forkserver":
                preload_in_forkserver()
            ctx: Any = multiprocessing.get_context(method)  # typeshed's BaseContext lacks Process
            parent_conn, child_conn = ctx.Pipe(duplex=True)
            spec = child.ChildSpec(
                backend=self.backend,
                options=self.options,
                arena_path=self.arena.path if self.arena is not None else None,
                arena_size=self.arena.size if self.arena is not None else 0,
                threads=self.child_threads,
                nice=self.nice,
                close_fds=(parent_conn.fileno(),) if method == "fork" else (),
                environ=env.child_environ(),
                cwd=os.getcwd(),
            )
            proc = ctx.Process(
                target=child.main, args=(child_conn, spec), name="asyncckpt-writer", daemon=True
            )
            self._proc, self._conn = proc, parent_conn
            self._sender = ThreadPoolExecutor(1, thread_name_prefix="asyncckpt-send")
            try:
                await start_process(proc)
            except Exception as exc:
                self._dead = f"could not start the writer process ({method}): {exc}"
                raise WriterProcessError(self._dead) from exc
            finally:
                child_conn.close()
                self._pid = proc.pid
            asyncio.get_running_loop().add_reader(parent_conn.fileno(), self._on_readable)
            # uvloop (libuv) makes a watched fd non-blocking; Connection.recv/send of a message
            # larger than the socket buffer would then fail half-way with EAGAIN
            os.set_blocking(parent_conn.fileno(), True)
            self._reading = True
            # the child imports the client library now: part of starting, not of the first
            # storage call (which the stall watchdog times)
            await self._request("warm", 0)
            log.info(
                "writer process pid %s (%s): start method %s from %s; %s",
                proc.pid,
                self.backend,
                method,
                self.policy.source,
                self.policy.reason,
            )

    def _on_readable(self) -> None:
        assert self._conn is not None
        try:
            while self._conn.poll():
                status, rid, payload = self._conn.recv()
                fut = self._pending.get(rid)
                if fut is None or fut.done():
                    continue
                if status == "ok":
                    fut.set_result(payload)
                else:
                    fut.set_exception(self._unpack(payload))
        except (EOFError, OSError):
            self._child_exited()

    def _child_exited(self) -> asyncio.Task[None]:
        """The pipe broke: stop reading, and reap (once) and report the child."""
        self._stop_reading()
        if self._exit_task is None:
            self._exit_task = asyncio.get_running_loop().create_task(self._on_exit())
        return self._exit_task

    def _stop_reading(self) -> None:
        if self._reading and self._conn is not None:
            self._reading = False
            asyncio.get_running_loop().remove_reader(self._conn.fileno())

    def _unpack(self, packed: child.Packed) -> BaseException:
        how, a, b = packed
        if how == "pickle":
            exc: BaseException = pickle.loads(a)
            exc.add_note(f"(raised in writer process pid {self.pid})")
            return exc
        return WriterProcessError(f"writer process pid {self.pid} failed: {a}: {b}")

    async def _on_exit(self) -> None:
        """The pipe hit EOF: reap the child and fail whatever still waits on it."""
        assert self._proc is not None
        await run_blocking(self.executor, reap, self._proc, 5.0)
        if not self._closing:
            self._fail(f"writer process pid {self._proc.pid} {exit_text(self._proc.exitcode)}")

    def _fail(self, why: str) -> None:
        if self._dead is None:
            self._dead = why
            log.error("%s", why)
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(WriterProcessError(self._dead))
                fut.exception()  # may have no waiter left; never "never retrieved"

    async def _kill(self, why: str) -> None:
        self._fail(why)
        if self._proc is not None and self._proc.pid is not None:
            self._proc.kill()  # SIGKILL works on a stopped or hung process too
            await self._child_exited()  # the one place that reaps it

    async def kill(self, why: str) -> None:
        """Kill the writer now (the stall watchdog): pending calls fail, nothing waits on it."""
        await self._kill(f"writer process pid {self.pid} killed: {why}")

    def _send(self, msg: tuple[Any, ...]) -> None:
        assert self._conn is not None
        self._conn.send(msg)

    async def _roundtrip(self, msg: tuple[Any, ...], fut: asyncio.Future[Any]) -> Any:
        assert self._sender is not None
        try:
            await asyncio.get_running_loop().run_in_executor(self._sender, self._send, msg)
        except OSError:  # the child is gone: wait for its exit status, for the message
            await self._child_exited()
            if self._dead is None:
                self._fail(f"lost the pipe to writer process pid {self.pid}")
        if self._dead is not None:
            raise WriterProcessError(self._dead)
        try:
            return await asyncio.wait_for(fut, self.timeout)
        except TimeoutError:
            await self._kill(
                f"writer process pid {self.pid} stalled: no reply to {msg[0]} within "
                f"writer_timeout={self.timeout:g} s; killed it"
            )
            raise WriterProcessError(self._dead) from None

    async def call(self, kind: str, *args: Any) -> Any:
        """One request (``kind``, handle id, arguments) and its reply; a cancelled caller
        still waits for the reply: the child may be reading the caller's buffer."""
        await self.start()
        return await self._request(kind, *args)

    async def _request(self, kind: str, *args: Any) -> Any:
        if self._dead is not None:
            raise WriterProcessError(self._dead)
        rid = next(self._ids)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        job = asyncio.ensure_future(self._roundtrip((kind, rid, *args), fut))
        try:
            return await asyncio.shield(job)
        except asyncio.CancelledError:
            while not job.done():
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait([job])
            if not job.cancelled():
                job.exception()
            raise
        finally:
            self._pending.pop(rid, None)

    async def aclose(self) -> None:
        proc = self._proc
        if proc is None:
            self._closing = True
            return
        self._closing = True  # its EOF after "close" is the exit asked for, not a failure
        if self._dead is None and self._reading:
            with contextlib.suppress(WriterProcessError):
                await self.call("close", 0)
        self._stop_reading()
        if self._exit_task is not None:
            await self._exit_task
        if self._sender is not None:
            await run_blocking(self.executor, self._sender.shutdown)
            self._sender = None
        if self._conn is not None:  # EOF makes a child that never got "close" abort and exit
            self._conn.close()
            self._conn = None
        if proc.pid is not None:  # a child that answered "close" or saw EOF exits at once
            await run_blocking(self.executor, reap, proc, min(self.timeout, 5.0))
            log.debug("writer process pid %s %s", proc.pid, exit_text(proc.exitcode))
        proc.close()
        self._proc, self._dead = None, self._dead or "the writer process was closed"

    def abandon(self) -> BaseProcess | None:
        """Let the child go without the event loop that started it (that loop ended): close
        the pipe (at EOF the child aborts what it was writing and exits) and stop the sender;
        nothing is awaited. Returns the process for the caller to reap off the loop."""
        self._closing, self._reading = True, False  # the reader was registered on the dead loop
        self._dead = self._dead or "the writer process belonged to an event loop that ended"
        if self._sender is not None:
            self._sender.shutdown(wait=False)
            self._sender = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        proc, self._proc = self._proc, None
        return proc


class WriterPool:
    """One :class:`WriterProcess` per (backend, arena) for a checkpointer's life; a dead one is
    replaced by the next object that asks. Closed (every child reaped) by ``aclose``."""

    def __init__(self) -> None:
        self._writers: dict[tuple[str, str | None], WriterProcess] = {}
        self._retired: list[WriterProcess] = []
        self.started = 0  # writer processes made (tests count them)

    def get(
        self, backend: str, arena: SharedArena | None, make: Callable[[], WriterProcess]
    ) -> WriterProcess:
        key = (backend, arena.path if arena is not None else None)
        writer = self._writers.get(key)
        if writer is None or not writer.usable:
            if writer is not None:
                self._retired.append(writer)
            writer = self._writers[key] = make()
            self.started += 1
        return writer

    def live(self) -> list[WriterProcess]:
        """The writer processes in use (one per backend and arena)."""
        return list(self._writers.values())

    async def aclose(self) -> None:
        for writer in self._take():
            await writer.aclose()

    def abandon(self) -> list[BaseProcess]:
        """Let every writer go without the event loop they ran on (see ``WriterProcess.abandon``);
        the processes to reap. The next object starts a new writer."""
        procs = [writer.abandon() for writer in self._take()]
        return [p for p in procs if p is not None]

    def _take(self) -> list[WriterProcess]:
        writers, self._writers, self._retired = [*self._retired, *self._writers.values()], {}, []
        return writers


class ProcessSink(Sink):
    """The handle of one object served by a writer process (of ``pool``, else its own)."""

    uses_shared_arena: ClassVar[bool] = True
    stoppable: ClassVar[bool] = True

    backend = "process"  # replaced per instance by the wrapped backend's name

    def __init__(
        self,
        uri: str,
        *,
        executor: Executor,
        options: SinkOptions,
        backend: str | None,
        policy: WriterPolicy,
        timeout: float = DEFAULT_TIMEOUT,
        child_threads: int = 8,
        pool: WriterPool | None = None,
        nice: int = 0,
    ) -> None:
        super().__init__(uri, executor=executor, options=options)
        if policy.isolation != "process" or policy.start_method is None:
            raise ConfigError(f"ProcessSink needs a process isolation policy, got {policy}")
        if not timeout > 0:
            raise ConfigError(f"writer timeout must be > 0 s, got {timeout!r}")
        name = resolve_backend(uri, backend)
        # results and the pipeline see the wrapped backend's name and default window
        setattr(self, "backend", name)  # noqa: B010 - instance value shadows the class default
        setattr(self, "default_in_flight", backend_class(name).default_in_flight)  # noqa: B010
        setattr(self, "has_directories", backend_class(name).has_directories)  # noqa: B010
        self.inner_backend = name
        self.policy = policy
        self.timeout = timeout
        self.child_threads = child_threads
        self.nice = nice  # the writer process's niceness (cpu_nice: its CPU is background work)
        self.arena: SharedArena | None = None
        self._reads = {"arena": 0, "inline": 0}  # read calls by how their bytes travelled
        self._pool = pool
        self._writer: WriterProcess | None = None
        self._hid = next(_HANDLES)
        self._writes_in_flight = self.default_in_flight  # until the child's handle is open
        self._write_behind = 0
        self._bound = False
        self._temp_path: str | None = None
        self._facts: dict[str, Any] = {}

    def attach_arena(self, arena: SharedArena) -> None:
        """Let writes from ``arena`` (the shared pool) travel as offsets, not bytes."""
        if self._writer is not None and self._writer.arena is not arena:
            raise RuntimeError("attach the arena before the writer process is chosen")
        self.arena = arena

    @property
    def pid(self) -> int | None:
        """The writer process's pid (kept after it exited, for messages and results)."""
        return self._writer.pid if self._writer is not None else None

    def check(self) -> None:
        """Fail before a child starts: a local backend's whole check (cheap, importless), an
        object store's form of the URI (its library is the child's to import)."""
        if self.inner_backend in LOCAL_BACKENDS:
            make_sink(
                self.uri, backend=self.inner_backend, executor=self.executor, options=self.options
            ).check()
        else:
            backend_class(self.inner_backend).check_target(self.uri)

    def _make_writer(self) -> WriterProcess:
        return WriterProcess(
            self.inner_backend,
            executor=self.executor,
            options=self.options,
            policy=self.policy,
            timeout=self.timeout,
            child_threads=self.child_threads,
            arena=self.arena,
            nice=self.nice,
        )

    def _chosen(self) -> WriterProcess:
        if self._writer is None:
            if self._pool is not None:
                self._writer = self._pool.get(self.inner_backend, self.arena, self._make_writer)
            else:
                self._writer = self._make_writer()
        return self._writer

    async def _call(self, kind: str, *args: Any) -> Any:
        writer = self._chosen()
        if not self._bound:
            await writer.call("bind", self._hid, self.uri)
            self._bound = True
        return await writer.call(kind, self._hid, *args)

    async def kill(self, why: str) -> None:
        """Kill the writer now (the stall watchdog): pending calls fail, nothing waits on it."""
        if self._writer is not None:
            await self._writer.kill(why)

    # -- the Sink interface ------------------------------------------------------------
    async def start(self) -> None:
        await self._chosen().start()

    async def open(self, size: int) -> None:
        facts = await self._call("open", size)
        self._temp_path = facts["temp_path"]
        self._facts = facts["describe"]
        self._writes_in_flight = int(facts["writes_in_flight"])
        self._write_behind = int(facts["write_behind"])

    def writes_in_flight(self) -> int:
        """What the child's opened handle says (a file on tmpfs: one)."""
        return self._writes_in_flight

    def write_behind(self) -> int:
        """What the child's opened handle says (s3dlio: its upload window)."""
        return self._write_behind

    async def write_part(self, offset: int, data: memoryview) -> float | None:
        at = self.arena.locate(data) if self.arena is not None else None
        if at is not None:
            return float(await self._call("write", offset, at, data.nbytes))
        return float(await self._call("write_inline", offset, bytes(data)))

    async def begin_generation(self, spec: GenSpec) -> bool:
        """Ask the child's handle to generate the chunks itself (the generator then runs in
        the writer process, in the client library's memory); nothing travels but offsets."""
        return bool(await self._call("begin_generation", spec))

    async def write_generated(self, offset: int, nbytes: int) -> InPlaceWrite:
        done: InPlaceWrite = await self._call("write_generated", offset, nbytes)
        return done

    async def complete(self) -> dict[str, float]:
        timings, self._facts = await self._call("complete")
        self._temp_path = None
        return dict(timings)

    async def abort(self) -> None:
        if self._writer is not None and self._writer.usable and self._bound:
            with contextlib.suppress(Exception):
                await self._call("abort")
                self._temp_path = None
        if self._temp_path is not None:  # the child died holding it
            path, self._temp_path = self._temp_path, None
            with contextlib.suppress(OSError):
                await run_blocking(self.executor, os.unlink, path)
                log.info("removed %s left by the dead writer process", path)

    async def read_into(self, offset: int, buf: memoryview) -> int:
        at = self.arena.locate(buf) if self.arena is not None else None
        if at is not None:
            self._reads["arena"] += 1
            return int(await self._call("read", offset, at, buf.nbytes))
        self._reads["inline"] += 1
        done = 0
        while done < buf.nbytes:
            data: bytes = await self._call("read_inline", offset + done, min(_INLINE_READ, buf.nbytes - done))
            buf[done : done + len(data)] = data
            done += len(data)
            if not data:
                break
        return done

    async def size(self) -> int:
        size = int(await self._call("size"))
        self._facts = await self._call("describe")  # what the HEAD learnt (ETag) for the load
        return size

    async def check_unchanged(self) -> None:
        await self._call("check_unchanged")

    async def cpu_counters(self) -> CpuCounters:
        """The writer process's CPU so far and its storage calls' (the child measures both)."""
        await self.start()  # started before its CPU is first read: start-up is not the save's
        process, storage = await self._call("cpu")
        return CpuCounters(writer_process=float(process), storage=None if storage is None else float(storage))

    async def delete(self) -> None:
        await self._call("delete")

    async def make_directory(self) -> None:
        if self.has_directories:  # a local path: made here, where the child would make it
            path = path_from_uri(self.uri)
            await run_blocking(self.executor, functools.partial(os.makedirs, path, exist_ok=True))

    async def list_names(self) -> list[str]:
        names: list[str] = await self._call("list")
        return names

    async def aclose(self) -> None:
        writer = self._writer
        if writer is None:
            return
        if self._pool is None:
            await writer.aclose()  # a writer of its own: reaped with the handle
            return
        await self.abort()
        if writer.usable and self._bound:
            with contextlib.suppress(Exception):
                await writer.call("release", self._hid)  # the child closes this object only

    def describe(self) -> dict[str, Any]:
        # how reads crossed the process boundary: into the shared arena, or in pipe messages
        # (a load whose reads went inline ran at 0.04x: a defect these counts now show)
        reads = {f"reads_{how}": n for how, n in self._reads.items() if n}
        return {**self._facts, **self.policy.facts(), "writer_pid": self.pid, **reads}

"""Saving through a real writer process: exact bytes, every start method, and no leaks when
the child is killed, stalls, or the save is cancelled. The test learns that the child is
mid-save from the progress callback (called when the child has acknowledged a write)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
import multiprocessing
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from asyncckpt import AsyncCheckpointer, DirectIOError, WriterProcessError
from asyncckpt.servers.s3endpoint import S3Endpoint
from asyncckpt.sinks import SinkOptions
from asyncckpt.sinks.isolation import ProcessSink, resolve_policy
from asyncckpt.sinks.shm import KIND_ENV, PREFIX, SharedArena, SharedBufferPool, shm_dir
from asyncckpt.units import MiB

from .conftest import checkpoint_data, expected_bytes, files_in, generated

CHUNK = 1 * MiB


def my_segments() -> list[str]:
    """Our shared-memory segments: /dev/shm files, and memfds we hold open."""
    mine = f"{PREFIX}{os.getpid()}-"
    files = [p.name for p in shm_dir().glob(f"{mine}*")]
    memfds = set()  # by name: an mmap object holds a dup of the descriptor it maps
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            link = os.readlink(f"/proc/self/fd/{fd}")
            if link.startswith(f"/memfd:{mine}"):
                memfds.add(link.split()[0])
    return sorted(files + list(memfds))


def assert_gone(pid: int) -> None:
    """Not running and not a zombie (reaped by us, or by the forkserver)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return
    raise AssertionError(f"writer pid {pid} still exists in state {state}")


def writer() -> multiprocessing.process.BaseProcess:
    children = [p for p in multiprocessing.active_children() if p.name == "asyncckpt-writer"]
    assert len(children) == 1, children
    return children[0]


@pytest.fixture
def no_shm_leak() -> Iterator[None]:
    before = my_segments()
    yield
    gc.collect()  # a kept traceback can pin a pool view, so its mapping, until collected
    assert my_segments() == before


@pytest.mark.parametrize(
    ("method", "kind"), [("fork", "memfd"), ("forkserver", "memfd"), ("spawn", "memfd"), ("spawn", "file")]
)
async def test_bytes_through_each_start_method(
    tmp_path: Path, method: str, kind: str, no_shm_leak: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KIND_ENV, kind)
    target = tmp_path / "rank0.bin"
    size = 5 * CHUNK + 12345
    seen: list[tuple[int, list[str]]] = []

    def progress(n: int) -> None:
        if not seen:
            seen.append((writer().pid or 0, my_segments()))

    async with AsyncCheckpointer(
        chunk_size=CHUNK, num_buffers=3, max_in_flight=2, seed=11, isolation="process", mp_start_method=method
    ) as ckpt:
        result = await ckpt.save(target, size, progress=progress)
    assert checkpoint_data(target.read_bytes()) == await generated(size, CHUNK, 11)
    assert files_in(tmp_path) == ["rank0.bin"]
    pid, segments = seen[0]
    assert len(segments) == 1 and segments[0].startswith(
        "/memfd:" if kind == "memfd" else PREFIX
    )  # pool in shared memory
    extra = result.metadata.extra
    assert extra["isolation"] == "process" and extra["mp_start_method"] == method
    assert extra["writer_pid"] == pid != os.getpid()
    assert result.metadata.backend == "file"
    assert f"Writer:            process pid {pid}, {method}" in str(result)
    assert "fsync_s" in result.close_detail  # the child's timings
    for rec in result.records:  # pure write seconds measured in the child, inside the parent's span
        assert 0 < rec.write_s <= rec.t_write_end - rec.t_write_start
    assert_gone(pid)
    assert not multiprocessing.active_children() or all(
        p.name != "asyncckpt-writer" for p in multiprocessing.active_children()
    )


async def test_fork_leaks_no_fds_or_threads(tmp_path: Path, leak_check: None, no_shm_leak: None) -> None:
    async with AsyncCheckpointer(
        chunk_size=CHUNK, num_buffers=2, isolation="process", mp_start_method="fork"
    ) as c:
        for i in range(2):  # the pool is reused; each save has its own writer
            await c.save(tmp_path / f"{i}.bin", 3 * CHUNK)
    assert [f for f in files_in(tmp_path) if not f.endswith(".manifest.json")] == ["0.bin", "1.bin"]


async def test_preallocate_and_null_through_the_child(tmp_path: Path, no_shm_leak: None) -> None:
    size = 2 * CHUNK + 100
    async with AsyncCheckpointer(chunk_size=CHUNK, num_buffers=2, seed=5, isolation="process") as ckpt:
        # preallocate's buffer is private memory: chunks travel through the pipe instead
        await ckpt.save(tmp_path / "p.bin", size, method="preallocate")
        null = await ckpt.save("null://x", size)
    assert checkpoint_data((tmp_path / "p.bin").read_bytes()) == await generated(size, CHUNK, 5)
    assert null.metadata.backend == "null" and null.metadata.extra["mp_start_method"] == "fork"


async def test_child_error_arrives_as_itself(ramfs: Path) -> None:
    async with AsyncCheckpointer(
        chunk_size=CHUNK, num_buffers=2, direct_io=True, isolation="process"
    ) as ckpt:
        with pytest.raises(DirectIOError, match="direct_io=True") as info:
            await ckpt.save(ramfs / "d.bin", CHUNK)
    assert any("writer process pid" in note for note in getattr(info.value, "__notes__", []))
    assert files_in(ramfs) == []


async def test_bad_target_fails_before_a_child_starts(tmp_path: Path) -> None:
    async with AsyncCheckpointer(chunk_size=CHUNK, num_buffers=2, isolation="process") as ckpt:
        with pytest.raises(FileNotFoundError):
            await ckpt.save(tmp_path / "missing" / "x.bin", CHUNK)
    assert not [p for p in multiprocessing.active_children() if p.name == "asyncckpt-writer"]


async def _save_with(
    tmp_path: Path, on_first_ack: Callable[[int], None], **config: object
) -> tuple[BaseException, float, int]:
    """Save 16 chunks through 2 buffers; call ``on_first_ack(child_pid)`` once, mid-save."""
    pids: list[int] = []

    def progress(n: int) -> None:
        if not pids:
            pids.append(writer().pid or 0)
            on_first_ack(pids[0])

    async with AsyncCheckpointer(chunk_size=CHUNK, num_buffers=2, isolation="process", **config) as ckpt:
        t0 = time.monotonic()
        with pytest.raises(WriterProcessError) as info:
            await ckpt.save(tmp_path / "x.bin", 16 * CHUNK, progress=progress)
        elapsed = time.monotonic() - t0
        assert files_in(tmp_path) == []  # the dead child's temporary file was removed
        await ckpt.save(tmp_path / "after.bin", CHUNK)  # the checkpointer is still usable
    return info.value, elapsed, pids[0]


@pytest.mark.parametrize("method", ["fork", "forkserver"])
async def test_killed_child_fails_the_save_fast(tmp_path: Path, method: str, no_shm_leak: None) -> None:
    err, elapsed, pid = await _save_with(
        tmp_path, lambda pid: os.kill(pid, signal.SIGKILL), mp_start_method=method
    )
    assert f"pid {pid}" in str(err) and "SIGKILL" in str(err)
    assert elapsed < 10
    assert_gone(pid)
    assert files_in(tmp_path) == ["after.bin"]


async def test_stalled_child_times_out(tmp_path: Path, no_shm_leak: None) -> None:
    err, elapsed, pid = await _save_with(
        tmp_path, lambda pid: os.kill(pid, signal.SIGSTOP), mp_start_method="fork", writer_timeout=1.0
    )
    assert "stalled" in str(err) and "writer_timeout=1 s" in str(err)
    assert 1.0 <= elapsed < 10
    assert_gone(pid)


@pytest.mark.parametrize("method", ["fork", "spawn"])
async def test_cancel_mid_save_stops_the_child(
    tmp_path: Path, method: str, no_shm_leak: None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="asyncckpt")
    acked = asyncio.Event()
    pids: list[int] = []

    def progress(n: int) -> None:
        if not pids:
            pids.append(writer().pid or 0)
            acked.set()

    async with AsyncCheckpointer(
        chunk_size=CHUNK, num_buffers=2, isolation="process", mp_start_method=method
    ) as ckpt:
        task = asyncio.create_task(ckpt.save(tmp_path / "x.bin", 64 * CHUNK, progress=progress))
        await acked.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert files_in(tmp_path) == []  # the child aborted the object; it waits for the next
    assert_gone(pids[0])  # the checkpointer's aclose reaps its writer process
    # asked to abort and close, it exited by itself: nothing had to be killed
    assert f"writer process pid {pids[0]} exited with code 0" in caplog.text


@pytest.mark.parametrize("kind", ["memfd", "file"])
def test_arena_released_exactly_once_and_attachable(kind: str) -> None:
    arena = SharedArena(2 * 4096, kind)
    assert arena.kind == kind and len(my_segments()) == 1
    child = SharedArena.attach(arena.path, arena.size)
    child[:5] = b"hello"
    assert arena.mmap[:5] == b"hello"
    arena.close()  # the parent lets go first: the child's mapping stays valid
    assert arena.released
    child[5:10] = b"world"
    assert child[:10] == b"helloworld"
    child.close()
    assert my_segments() == []
    arena.close()  # idempotent, no error for the missing name


def test_shared_pool_locates_its_buffers() -> None:
    pool = SharedBufferPool(4096, 3)
    try:
        buf = pool.buffers[2]
        assert pool.arena.locate(buf.view[100:200]) == 2 * 4096 + 100
        assert pool.arena.locate(memoryview(bytearray(10))) is None
        assert pool.arena.locate(memoryview(b"read-only")) is None
    finally:
        pool.close()
    assert not Path(pool.arena.path).exists()


PARENT = """
import asyncio, multiprocessing, sys
from asyncckpt import AsyncCheckpointer

def progress(n):
    if not getattr(progress, "done", False):
        progress.done = True
        (child,) = [p for p in multiprocessing.active_children() if p.name == "asyncckpt-writer"]
        print(child.pid, flush=True)
        sys.stdin.readline()  # hold the save here until the test kills us

async def main():
    async with AsyncCheckpointer(
        chunk_size=1 << 20, num_buffers=2, isolation="process", mp_start_method=sys.argv[2]
    ) as ckpt:
        await ckpt.save(sys.argv[1], 64 << 20, progress=progress)

if __name__ == "__main__":
    asyncio.run(main())
"""


def _wait_exit(pid: int, timeout: float) -> bool:
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], timeout)[0])
    finally:
        os.close(fd)


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_parent_killed_child_aborts_and_exits(tmp_path: Path, method: str) -> None:
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    out = tmp_path / "out"
    out.mkdir()
    parent = subprocess.Popen(
        [sys.executable, str(script), str(out / "x.bin"), method],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert parent.stdout is not None
        ready = select.select([parent.stdout], [], [], 60)[0]
        assert ready, "the parent never reached the middle of its save"
        line = parent.stdout.readline()
        assert line.strip().isdigit(), (line, parent.stderr.read() if parent.stderr else "")
        child_pid = int(line)
        assert len(files_in(out)) == 1  # the child's temporary file, mid-save
    finally:
        parent.kill()
        parent.wait()
        for pipe in (parent.stdin, parent.stdout, parent.stderr):
            if pipe is not None:
                pipe.close()  # not communicate(): a surviving child would hold the pipes open
    exited = _wait_exit(child_pid, 10)
    if not exited:
        os.kill(child_pid, signal.SIGKILL)  # leave nothing behind, then fail
    assert exited, f"writer pid {child_pid} outlived its killed parent"
    assert files_in(out) == []  # on EOF the child aborted: temporary file removed


async def test_read_size_delete_through_the_child(tmp_path: Path) -> None:
    target = tmp_path / "r.bin"
    size = 2 * CHUNK + 77
    async with AsyncCheckpointer(chunk_size=CHUNK, num_buffers=2, seed=9) as ckpt:
        await ckpt.save(target, size)
    want = await generated(size, CHUNK, 9)
    policy = resolve_policy("file", isolation="process", mp_start_method="forkserver")
    pool = SharedBufferPool(CHUNK, 2)
    with ThreadPoolExecutor(4) as executor:
        sink = ProcessSink(
            str(target), executor=executor, options=SinkOptions(), backend=None, policy=policy, timeout=30
        )
        sink.attach_arena(pool.arena)
        try:
            stored = await sink.size()  # the data, then the sealed manifest
            assert stored > size
            buf = pool.buffers[1].view  # in the arena: the child reads straight into it
            assert await sink.read_into(CHUNK, buf) == CHUNK
            assert bytes(buf) == want[CHUNK : 2 * CHUNK]
            private = bytearray(3 * CHUNK)  # not shared: comes back through the pipe in pieces
            assert await sink.read_into(0, memoryview(private)) == stored
            assert checkpoint_data(bytes(private[:stored])) == want
            await sink.delete()
            assert not target.exists()
        finally:
            await sink.aclose()
            pool.close()
    assert sink.pid is not None
    assert_gone(sink.pid)


async def test_pool_moves_to_shared_memory_once(tmp_path: Path, no_shm_leak: None) -> None:
    async with AsyncCheckpointer(chunk_size=CHUNK, num_buffers=2, seed=4) as ckpt:
        await ckpt.save(tmp_path / "a.bin", CHUNK)  # in-process: private pool
        assert my_segments() == []
        ckpt.config = dataclasses.replace(ckpt.config, isolation="process")
        await ckpt.save(tmp_path / "b.bin", CHUNK)
        shared = my_segments()
        assert len(shared) == 1
        ckpt.config = dataclasses.replace(ckpt.config, isolation="none")
        result = await ckpt.save(tmp_path / "c.bin", 2 * CHUNK)  # in-process, same shared pool
        assert my_segments() == shared and result.metadata.extra["isolation"] == "none"
    assert checkpoint_data((tmp_path / "c.bin").read_bytes()) == await generated(2 * CHUNK, CHUNK, 4)


def test_large_inline_messages_under_uvloop(tmp_path: Path) -> None:
    """uvloop makes a watched fd non-blocking; multi-MiB pipe messages must still arrive whole."""
    uvloop = pytest.importorskip("uvloop", reason="uvloop is part of the test extra")
    target = tmp_path / "u.bin"
    size = 3 * CHUNK + 11

    async def run() -> bytes:
        async with AsyncCheckpointer(chunk_size=CHUNK, num_buffers=2, seed=3) as ckpt:
            await ckpt.save(target, size)
        policy = resolve_policy("file", isolation="process", mp_start_method="fork")
        with ThreadPoolExecutor(4) as executor:
            sink = ProcessSink(
                str(target), executor=executor, options=SinkOptions(), backend=None, policy=policy, timeout=30
            )
            try:
                private = bytearray(size)  # not shared: the bytes come back as pipe messages
                assert await sink.read_into(0, memoryview(private)) == size
            finally:
                await sink.aclose()
        return bytes(private)

    assert uvloop.run(run()) == expected_bytes(size, CHUNK, 3)


async def test_a_writer_process_imports_its_client_library_when_it_starts(
    moto_endpoint: S3Endpoint,
) -> None:
    """Starting is not storage I/O: the library's import (s3dlio: 1-2 s, its runtime starting)
    belongs to the start, not to the first ``open`` the stall watchdog times. Before, a fresh
    writer's first open paid it, and a drain with ``stall_timeout=2`` was reported stalled
    before its first request was sent. Read from the kernel's map of the child's memory."""
    policy = resolve_policy("s3dlio", isolation="process", mp_start_method="forkserver")
    options = SinkOptions(extra=moto_endpoint.options())
    with ThreadPoolExecutor(2) as executor:
        sink = ProcessSink(
            "s3://unused-bucket/k",
            executor=executor,
            options=options,
            backend="s3dlio",
            policy=policy,
            timeout=60,
        )
        try:
            await sink.start()
            assert sink.pid is not None
            maps = await asyncio.to_thread(Path(f"/proc/{sink.pid}/maps").read_text)
        finally:
            await sink.aclose()
    assert "/s3dlio/" in maps

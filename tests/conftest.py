"""Shared fixtures. Everything here is real: files in tmp dirs, real threads, real loops."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import mmap
import os
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import dgen_py
import pytest

from asyncckpt.engine.seal import unseal

from .loop_guard import guarded

pytest_plugins = ["tests.plugins.s3servers", "tests.plugins.objstores", "tests.plugins.nodes"]


@pytest.fixture(autouse=True)
async def _no_blocking_in_loop(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    """Fail any async test during which a loop callback blocked for 0.1 s or more
    (a synchronous write, a sleep, a big memcpy or parse on the loop; see ``loop_guard``).
    ``@pytest.mark.gil_waits``: not for waits of the loop's thread for a GIL another thread held."""
    slow: list[str] = []
    with guarded(slow, gil_waits=request.node.get_closest_marker("gil_waits") is not None):
        yield
    assert not slow, f"event loop was blocked: {slow}"


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.fixture
def leak_check() -> Iterator[None]:
    """Assert a test leaves no extra file descriptors or Python threads behind."""
    fds, threads = open_fds(), threading.active_count()
    yield
    # anyio's worker threads (run_blocking) are told to stop when the test's root task ends;
    # a thread still busy after that (a real leak) does not finish and is counted below
    for thread in threading.enumerate():
        if thread.name == "AnyIO worker thread":
            thread.join(timeout=5)
    assert threading.active_count() <= threads, [t.name for t in threading.enumerate()]
    leaked = open_fds() - fds
    # a descriptor listed before may be closed and its number reused; only new ones count
    assert not leaked, {
        fd: os.readlink(f"/proc/self/fd/{fd}") for fd in leaked if os.path.exists(f"/proc/self/fd/{fd}")
    }


def expected_bytes(size: int, chunk_size: int, seed: int) -> bytes:
    """The synthetic stream for (size, chunk_size, seed), regenerated independently."""
    gen = dgen_py.Generator(size=size, seed=seed)
    out = bytearray(size)
    view = memoryview(out)
    for offset in range(0, size, chunk_size):
        want = min(chunk_size, size - offset)
        assert gen.fill_chunk(view[offset : offset + want]) == want
    return bytes(out)


ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def quiet_heap() -> Iterator[None]:
    """The test process's own heap out of the cyclic GC while a test times the event loop.

    By the middle of the suite it holds every test module, matplotlib, hypothesis and the
    garbage of a few hundred tests: one full collection of it stalls the loop for ~50 ms
    (measured with gc.callbacks), which a loop-lag test would pin on asyncckpt.
    """
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def run_python(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` in a fresh interpreter that imports asyncckpt from this checkout."""
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={**os.environ, **(env or {}), "PYTHONPATH": str(ROOT)},
    )


def run_bench(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``python -m asyncckpt.bench ARGS`` in a fresh interpreter, from this checkout."""
    return run_python("-m", "asyncckpt.bench", *args, cwd=cwd, env=env, timeout=timeout)


async def generated(size: int, chunk_size: int, seed: int) -> bytes:
    """:func:`expected_bytes` for an async test: generated in a thread, not on the loop the
    guard watches (tens of MiB, and the first call in a process starts dgen-py's pool)."""
    return await asyncio.to_thread(expected_bytes, size, chunk_size, seed)


def random_mapping(size: int) -> mmap.mmap:
    """Random bytes in page-aligned memory, like the pool's buffers."""
    buf = mmap.mmap(-1, size)
    buf[:] = os.urandom(size)
    return buf


async def payload(size: int) -> mmap.mmap:
    """:func:`random_mapping` for an async test, made in a thread: 2 MiB of ``os.urandom`` held a
    loaded machine's loop for 0.24-0.41 s."""
    return await asyncio.to_thread(random_mapping, size)


def flip_byte(path: Path, offset: int, mask: int = 0xFF) -> None:
    """Corrupt the file at ``path`` in place: the byte at ``offset`` XOR ``mask``."""
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ mask]))


async def save_span(proc: subprocess.Popen[str]) -> float:
    """Seconds from a child's first line (its save has started) to its exit, which must be a
    success: how long a save takes, to choose kill instants inside it."""
    assert proc.stdout is not None
    await asyncio.to_thread(proc.stdout.readline)
    t0 = time.perf_counter()
    await asyncio.to_thread(proc.wait, 60)
    span = time.perf_counter() - t0
    assert proc.returncode == 0
    return span


def checkpoint_data(raw: bytes) -> bytes:
    """The data of a stored checkpoint object: its bytes before the sealed manifest footer."""
    data, _ = unseal(raw)
    return data


def holds_stream(raw: bytes, size: int, chunk_size: int, seed: int) -> bool:
    """Whether a stored checkpoint object's data is the synthetic stream of (size, chunk_size,
    seed). Blocking (unseal, regenerate, compare tens of MB): call it in a thread."""
    return checkpoint_data(raw) == expected_bytes(size, chunk_size, seed)


def to_legacy(path: Path) -> None:
    """Rewrite a sealed checkpoint file as asyncckpt < 0.2 left it: data + sidecar manifest."""
    data, manifest = unseal(path.read_bytes())
    os.truncate(path, len(data))
    st = path.stat()
    identity = {"device": st.st_dev, "inode": st.st_ino, "mtime_ns": st.st_mtime_ns}
    legacy = dataclasses.replace(manifest, backend={"identity": identity})
    path.with_name(path.name + ".manifest.json").write_bytes(legacy.to_json())


def files_in(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir())


def mount(path: Path, fstype: str, options: str | None) -> bool:
    """Mount a file system for a test (root only); False when that is not possible."""
    if os.geteuid() != 0:
        return False
    cmd = ["mount", "-t", fstype, *(["-o", options] if options else []), fstype, str(path)]
    return subprocess.run(cmd, capture_output=True).returncode == 0


@contextlib.contextmanager
def mounted(path: Path, fstype: str, options: str | None) -> Iterator[Path]:
    """``path`` (created) with a file system mounted on it for the block, unmounted after;
    the test is skipped where mounting is not possible (not root)."""
    path.mkdir()
    if not mount(path, fstype, options):
        pytest.skip(f"mounting {fstype} needs root (CI runs as root)")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


@pytest.fixture
def ramfs(tmp_path: Path) -> Iterator[Path]:
    """A ramfs mount: a real file system that refuses O_DIRECT (tmpfs accepts it since 6.6)."""
    with mounted(tmp_path / "ramfs", "ramfs", None) as mnt:
        yield mnt


def in_memory(directory: Path) -> str | None:
    """The file system holding ``directory`` when it lives in memory (tmpfs, ramfs), else None."""
    from asyncckpt.sinks.file import memory_file_system

    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return memory_file_system(fd)
    finally:
        os.close(fd)


@pytest.fixture
def disk_path(tmp_path: Path) -> Iterator[Path]:
    """A fresh directory on a disk-backed file system: ``tmp_path`` unless that is a tmpfs (where
    the file sink keeps one write in flight), then one under /var/tmp."""
    if in_memory(tmp_path) is None:
        yield tmp_path
        return
    if in_memory(Path("/var/tmp")) is not None:
        pytest.skip("both the temporary directory and /var/tmp are in memory")
    import tempfile

    with tempfile.TemporaryDirectory(dir="/var/tmp", prefix="asyncckpt-test-") as name:
        yield Path(name)


@pytest.fixture
def shm_path() -> Iterator[Path]:
    """A fresh directory on a file system in memory (/dev/shm)."""
    import tempfile

    shm = Path("/dev/shm")
    if not shm.is_dir() or in_memory(shm) is None:
        pytest.skip("no tmpfs at /dev/shm")
    with tempfile.TemporaryDirectory(dir=shm, prefix="asyncckpt-test-") as name:
        yield Path(name)

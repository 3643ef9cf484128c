"""A buffer pool in named shared memory that writer processes attach by name.

We map our own file in ``/dev/shm`` instead of ``multiprocessing.shared_memory``: Python
3.11 registers every *attachment* of a SharedMemory with the resource tracker, which then
unlinks the segment when the attaching child exits (and warns, or unlinks twice). Here only
the creating object unlinks, exactly once (``weakref.finalize`` runs at most once, also at
interpreter exit if ``close`` was never called); a child only maps the file. The pages stay
valid for every mapping after the unlink, so a child dying changes nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import tempfile
import uuid
import weakref
from pathlib import Path

from ..pool import BufferPool

PREFIX = "asyncckpt-"


def shm_dir() -> Path:
    """``/dev/shm`` (tmpfs) where it exists, else the temp directory."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() else Path(tempfile.gettempdir())


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


class SharedArena:
    """``size`` bytes of shared memory, page-aligned, named ``asyncckpt-<pid>-<random>``."""

    def __init__(self, size: int) -> None:
        self.name = f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.path = str(shm_dir() / self.name)
        self.size = size
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        self._finalizer = weakref.finalize(self, _unlink, self.path)
        try:
            os.ftruncate(fd, size)
            self.mmap = mmap.mmap(fd, size)
        except BaseException:
            self._finalizer()
            raise
        finally:
            os.close(fd)
        self.base = ctypes.addressof(ctypes.c_char.from_buffer(self.mmap))

    @staticmethod
    def attach(path: str, size: int) -> mmap.mmap:
        """Map an existing arena (in a writer process)."""
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            return mmap.mmap(fd, size)
        finally:
            os.close(fd)

    def locate(self, view: memoryview) -> int | None:
        """Offset of ``view`` inside this arena, or None if it lies (partly) outside."""
        if view.readonly or not view.contiguous or self.mmap.closed:
            return None
        addr = ctypes.addressof(ctypes.c_char.from_buffer(view)) if view.nbytes else self.base
        offset = addr - self.base
        return offset if offset >= 0 and offset + view.nbytes <= self.size else None

    @property
    def unlinked(self) -> bool:
        return not self._finalizer.alive

    def unlink(self) -> None:
        """Remove the name; idempotent (mappings stay valid)."""
        self._finalizer()

    def close(self) -> None:
        self.unlink()
        with contextlib.suppress(BufferError):  # a view is still referenced: unmapped when collected
            self.mmap.close()


class SharedBufferPool(BufferPool):
    """A :class:`BufferPool` whose buffers live in a :class:`SharedArena`."""

    def __init__(self, chunk_size: int, num_buffers: int) -> None:
        self.arena = SharedArena(chunk_size * num_buffers)
        try:
            super().__init__(chunk_size, num_buffers, arena=self.arena.mmap)
        except BaseException:
            self.arena.close()
            raise

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.arena.close()

"""A buffer pool in shared memory that writer processes (fork, forkserver, spawn) attach by path.

Two kinds, same interface:

- ``memfd`` (Linux, the default): an anonymous ``memfd_create`` file. Children open it as
  ``/proc/<parent pid>/fd/<fd>``. It has no name to unlink, so nothing can leak: the kernel
  frees the pages when the last descriptor and mapping are gone, even if the parent is killed.
- ``file``: a file in ``/dev/shm`` (tmpfs), for platforms without memfd or where
  ``/proc/<pid>/fd`` is not reachable (``ASYNCCKPT_SHARED_MEMORY=file``). Only the creating
  object unlinks it, exactly once (``weakref.finalize`` runs at most once, also at interpreter
  exit); only a killed parent can leave it behind.

Neither uses ``multiprocessing.shared_memory``: Python 3.11 registers every *attachment* of a
SharedMemory with the resource tracker, which then unlinks the segment when an attaching child
exits (and warns, or unlinks twice).
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

from .. import env, modes
from ..errors import ConfigError
from ..pool import BufferPool

PREFIX = "asyncckpt-"
KIND_ENV = env.SHARED_MEMORY
KINDS = modes.choices(modes.SharedMemoryKind)


def shm_dir() -> Path:
    """``/dev/shm`` (tmpfs) where it exists, else the temp directory."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() else Path(tempfile.gettempdir())


def resolve_kind(kind: str | None = None) -> modes.SharedMemoryKind:
    """``kind``, else ``ASYNCCKPT_SHARED_MEMORY``, else memfd where available, else file."""
    value: modes.SharedMemoryKind = (
        modes.parse("shared memory kind", kind, modes.SharedMemoryKind) if kind else env.shared_memory_kind()
    )
    has_memfd = hasattr(os, "memfd_create") and os.path.isdir(f"/proc/{os.getpid()}/fd")
    if value == "memfd" and not has_memfd:
        raise ConfigError("memfd shared memory needs Linux memfd_create and /proc; use 'file'")
    return ("memfd" if has_memfd else "file") if value == "auto" else value


def _release(fd: int, path: str | None) -> None:
    """Close our descriptor and remove the name, if any; run at most once per arena."""
    if fd >= 0:
        with contextlib.suppress(OSError):
            os.close(fd)
    if path is not None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


class SharedArena:
    """``size`` bytes of page-aligned shared memory; children map it with :meth:`attach`."""

    def __init__(self, size: int, kind: str | None = None) -> None:
        self.kind = resolve_kind(kind)
        self.size = size
        label = f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}"
        if self.kind == "memfd":
            fd = os.memfd_create(label, os.MFD_CLOEXEC)
            self._memfd = fd
            self._finalizer = weakref.finalize(self, _release, fd, None)  # keep fd: children open it
        else:
            self._memfd = -1
            self._file = str(shm_dir() / label)
            fd = os.open(self._file, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            self._finalizer = weakref.finalize(self, _release, -1, self._file)
        try:
            os.ftruncate(fd, size)
            self.mmap = mmap.mmap(fd, size)
        except BaseException:
            self._finalizer()
            raise
        finally:
            if self.kind == "file":
                os.close(fd)
        self.base = ctypes.addressof(ctypes.c_char.from_buffer(self.mmap))

    @property
    def path(self) -> str:
        """What a child opens: the /dev/shm file, or our memfd through /proc (in this process)."""
        return f"/proc/{os.getpid()}/fd/{self._memfd}" if self.kind == "memfd" else self._file

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
    def released(self) -> bool:
        """True once the name is unlinked (file) or our descriptor closed (memfd)."""
        return not self._finalizer.alive

    def close(self) -> None:
        """Unmap and release; idempotent. Children's mappings stay valid until they unmap."""
        self._finalizer()
        with contextlib.suppress(BufferError):  # a view is still referenced: unmapped when collected
            self.mmap.close()


class SharedBufferPool(BufferPool):
    """A :class:`BufferPool` whose buffers live in a :class:`SharedArena`."""

    def __init__(self, chunk_size: int, num_buffers: int, *, kind: str | None = None) -> None:
        self.arena = SharedArena(chunk_size * num_buffers, kind)
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

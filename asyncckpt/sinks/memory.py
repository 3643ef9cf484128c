"""In-process sinks for tests and for measuring the pipeline without storage.

``NullSink`` discards (the ceiling of everything before storage); ``MemorySink`` keeps the
bytes in a process-global store keyed by URI, so a save can be loaded and compared.
"""

from __future__ import annotations

import errno
from typing import Any, ClassVar

from ..blocking import run_blocking
from ..errors import TargetNotFoundError
from .base import Sink

#: published objects of MemorySink, by URI
MEMORY_STORE: dict[str, bytes] = {}


class NullSink(Sink):
    """Accepts every write and keeps nothing (``null://anything``)."""

    in_process_memory: ClassVar[bool] = True
    keeps_data: ClassVar[bool] = False

    backend = "null"
    default_in_flight = 1

    def __init__(self, uri: str, **kwargs: Any) -> None:
        super().__init__(uri, **kwargs)
        self._size = 0
        self.bytes_written = 0

    async def open(self, size: int) -> None:
        self._size = size
        self.bytes_written = 0

    async def write_part(self, offset: int, data: memoryview) -> float | None:
        self.bytes_written += len(data)
        return None

    async def complete(self) -> dict[str, float]:
        return {}

    async def abort(self) -> None:
        return None

    async def read_into(self, offset: int, buf: memoryview) -> int:
        n = max(0, min(len(buf), self._size - offset))
        buf[:n] = bytes(n)
        return n

    async def size(self) -> int:
        return self._size

    async def delete(self) -> None:
        return None


class MemorySink(Sink):
    """Keeps the object in :data:`MEMORY_STORE` (``memory://name``); visible at complete."""

    in_process_memory: ClassVar[bool] = True

    backend = "memory"
    default_in_flight: ClassVar[int] = 2

    def __init__(self, uri: str, **kwargs: Any) -> None:
        super().__init__(uri, **kwargs)
        self._staging: bytearray | None = None

    async def open(self, size: int) -> None:
        # zero-filling (and, at complete, copying) a whole object: 0.1 s at 128 MiB, on the
        # sink's executor (warm threads), not on the loop
        self._staging = await run_blocking(self.executor, bytearray, size)

    async def write_part(self, offset: int, data: memoryview) -> float | None:
        assert self._staging is not None, "write_part before open"
        self._staging[offset : offset + len(data)] = data
        return None

    async def complete(self) -> dict[str, float]:
        assert self._staging is not None, "complete before open"
        MEMORY_STORE[self.uri] = await run_blocking(self.executor, bytes, self._staging)
        self._staging = None
        return {}

    async def abort(self) -> None:
        self._staging = None

    def _published(self) -> bytes:
        try:
            return MEMORY_STORE[self.uri]
        except KeyError:
            raise TargetNotFoundError(errno.ENOENT, f"{self.uri!r} does not exist") from None

    async def read_into(self, offset: int, buf: memoryview) -> int:
        data = self._published()[offset : offset + len(buf)]
        buf[: len(data)] = data
        return len(data)

    async def size(self) -> int:
        return len(self._published())

    async def delete(self) -> None:
        MEMORY_STORE.pop(self.uri, None)

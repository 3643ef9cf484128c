"""Small whole objects (a commit record, an owner marker) through an ordinary handle.

They go through the same ``open → write_part → commit`` as a checkpoint, so they are
published atomically by the same backend commit (rename, PUT) and isolated backends carry
them through their writer process like any object; no second code path per backend.
"""

from __future__ import annotations

import mmap

from ..blocking import read_full
from ..errors import IntegrityError
from ..pool import close_mapping
from .base import Sink
from .commit import commit


async def put_bytes(sink: Sink, data: bytes) -> dict[str, object]:
    """Publish ``data`` as the whole object (atomically); return the handle's facts."""
    scratch = mmap.mmap(-1, max(len(data), 1))  # page-aligned: O_DIRECT files accept it
    view = memoryview(scratch)[: len(data)]
    try:
        view[:] = data
        sink.check()
        await sink.start()
        await sink.open(len(data))
        try:
            if data:
                await sink.write_part(0, view)
            await commit(sink)
        except BaseException:
            await sink.abort()
            raise
        return sink.describe()
    finally:
        view.release()
        close_mapping(scratch)  # a store's client may still hold a slice: then unmapped when collected


async def read_upto(sink: Sink, size: int) -> bytes:
    """The first ``size`` bytes of the object; fewer if it ends sooner (callers check)."""
    buf = bytearray(size)
    got = await read_full(sink.read_into, 0, memoryview(buf))
    return bytes(buf[:got])


async def get_bytes(sink: Sink, limit: int = 1 << 20) -> bytes:
    """The whole object (at most ``limit`` bytes: these are records, not checkpoints)."""
    size = await sink.size()
    if size > limit:
        raise IntegrityError(f"{sink.uri!r} is {size} bytes, more than a small record may be ({limit})")
    data = await read_upto(sink, size)
    if len(data) < size:
        raise IntegrityError(f"{sink.uri!r} ended after {len(data)} of {size} bytes")
    return data

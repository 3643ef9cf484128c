"""A store's client may hold a view of a buffer after the read or write it was given returns:
anyio's idle worker threads keep the arguments of the last call they ran until they run
another, and a client library may keep a slice in its request objects. A buffer with a live
view cannot be resized or unmapped (``BufferError``), so nothing may depend on that.

A header longer than the first read is read in two parts; growing the first part's buffer
(``first += rest``) raised ``BufferError: Existing exports of data: object cannot be
re-sized`` whenever another worker took the second read (a tiered drain to moto failed this way
in a benchmark run)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from asyncckpt import AsyncCheckpointer
from asyncckpt.engine.header import FIRST_READ, read_prefix
from asyncckpt.sinks.small import get_bytes, put_bytes


class KeepsViews:
    """A real sink whose reads and writes keep a slice of every view they were given, as a
    client library (or an idle worker thread) may after the call returns."""

    def __init__(self, sink: Any) -> None:
        self._sink = sink
        self.kept: list[memoryview] = []

    async def read_into(self, offset: int, view: memoryview) -> int:
        self.kept.append(view[0:])
        got: int = await self._sink.read_into(offset, view)
        return got

    async def write_part(self, offset: int, data: memoryview) -> float | None:
        self.kept.append(data[0:])
        took: float | None = await self._sink.write_part(offset, data)
        return took

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sink, name)


async def test_a_header_longer_than_the_first_read_is_read_while_the_store_holds_its_views(
    tmp_path: Path,
) -> None:
    state = {f"layer.{i:05d}.a_long_parameter_name.weight": np.full(4, i, np.float32) for i in range(2000)}
    uri = str(tmp_path / "many.safetensors")
    async with AsyncCheckpointer() as c:
        await c.save_state(uri, state)
        sink = await c.storage.handle(uri)
        try:
            await sink.open_read()
            size = await sink.size()
            keeper = KeepsViews(sink)
            prefix, header = await read_prefix(keeper, size, uri)  # type: ignore[arg-type]
        finally:
            await sink.aclose()
        assert len(keeper.kept) >= 2 and len(prefix) > FIRST_READ  # two parts, views still held
        assert len(header.tensors) == len(state)
        got = await c.load_state(uri)
    assert sorted(got.state) == sorted(state)


async def test_a_small_record_is_published_while_the_store_holds_a_view_of_its_buffer(tmp_path: Path) -> None:
    uri = str(tmp_path / "record.json")
    async with AsyncCheckpointer() as c:
        sink = await c.storage.handle(uri)
        keeper = KeepsViews(sink)
        try:
            await put_bytes(keeper, b'{"step": 7}')  # type: ignore[arg-type]
        finally:
            await sink.aclose()
        assert keeper.kept  # the write's view was still held when put_bytes let go of its buffer
        reader = await c.storage.handle(uri)
        try:
            await reader.open_read()
            assert await get_bytes(reader) == b'{"step": 7}'
        finally:
            await reader.aclose()

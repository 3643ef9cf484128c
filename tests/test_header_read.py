"""A header longer than the first read is read in two parts, and neither part's buffer may be
resized afterwards: a store's client can hold the view it filled after its read returns.

anyio's idle worker threads keep the arguments of the last call they ran until they run
another, so the view of the first part outlived the read whenever another worker took the
second; ``first += rest`` then raised ``BufferError: Existing exports of data: object cannot
be re-sized`` (a tiered drain to moto failed this way in a benchmark run)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from asyncckpt import AsyncCheckpointer
from asyncckpt.engine.header import FIRST_READ, read_prefix


class KeepsViews:
    """A real sink whose reads keep every view they were given, as a client library (or an
    idle worker thread) may after the call returns."""

    def __init__(self, sink: Any) -> None:
        self._sink = sink
        self.kept: list[memoryview] = []

    async def read_into(self, offset: int, view: memoryview) -> int:
        self.kept.append(view)
        got: int = await self._sink.read_into(offset, view)
        return got

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

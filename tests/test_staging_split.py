"""The host staging copy is shared evenly between the caller's threads.

A state dict alternates large and small tensors (a weight, then its bias; an optimizer's
step, then its two moments). Dealing whole tensors round-robin gave one of two threads
every weight: the caller, who waits for the slower thread, was blocked for two thirds of a
single-threaded copy instead of half of it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from asyncckpt.state.api import plan
from asyncckpt.state.staging import ALIGN, _run, split_copies

MiB = 1 << 20


def _state() -> dict[str, Any]:
    state: dict[str, Any] = {
        f"layer{i}": {
            "weight": np.full((256, 1024), i + 1, np.float32),  # 1 MiB
            "bias": np.arange(7, dtype=np.float32) + i,
        }
        for i in range(6)
    }
    state["strided"] = np.arange(300 * 40, dtype=np.float64).reshape(300, 40)[:, ::2]  # copied whole
    state["empty"] = np.zeros((0, 3), np.float32)
    state["step"] = np.float64(12.0)
    return state


@pytest.mark.parametrize("threads", [1, 2, 3, 4])
def test_staging_copy_is_split_evenly_between_threads(threads: int) -> None:
    p = plan("unused", _state(), MiB, None)
    offsets = [p.data_start + e.start for e in p.entries]
    area = bytearray(p.size)
    assert any(not t.contiguous for t in p.tensors)  # the strided one
    bins = split_copies(p.tensors, offsets, memoryview(area), threads)

    loads = [sum(len(piece[1]) for piece in b) for b in bins]
    total = sum(t.nbytes for t in p.tensors)
    assert len(bins) == threads and sum(loads) == total  # every byte copied once
    assert max(loads) - min(loads) <= threads * ALIGN, loads  # was 6 MiB to 0.1 MiB with 2
    for b in bins:
        _run(b)
    for t, offset in zip(p.tensors, offsets, strict=True):
        expected = np.ascontiguousarray(t.source).view(np.uint8).reshape(-1)
        assert bytes(area[offset : offset + t.nbytes]) == expected.tobytes(), t.leaf.name

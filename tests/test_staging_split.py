"""The host staging copy is shared evenly between the caller's threads.

A state dict alternates large and small tensors (a weight, then its bias; an optimizer's
step, then its two moments). Dealing whole tensors round-robin gave one of two threads
every weight: the caller, who waits for the slower thread, was blocked for two thirds of a
single-threaded copy instead of half of it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from asyncckpt import AsyncCheckpointer
from asyncckpt.state.api import plan
from asyncckpt.state.staging import ALIGN, INLINE_COPY, PIECE, drain, run_pieces, share_copies, split_copies

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


def _laid_out(state: dict[str, Any]) -> tuple[Any, list[int], bytearray]:
    """The plan of ``state``, each tensor's offset in the object and an area of its size."""
    p = plan("unused", state, MiB, None)
    return p, [p.data_start + e.start for e in p.entries], bytearray(p.size)


def _copied(p: Any, offsets: list[int], area: bytearray) -> None:
    for t, offset in zip(p.tensors, offsets, strict=True):
        expected = np.ascontiguousarray(t.source).view(np.uint8).reshape(-1)
        assert bytes(area[offset : offset + t.nbytes]) == expected.tobytes(), t.leaf.name


@pytest.mark.parametrize("threads", [1, 2, 3, 4])
def test_staging_copy_is_split_evenly_between_threads(threads: int) -> None:
    p, offsets, area = _laid_out(_state())
    assert any(not t.contiguous for t in p.tensors)  # the strided one
    bins = split_copies(p.tensors, offsets, memoryview(area), threads)

    loads = [sum(len(piece[1]) for piece in b) for b in bins]
    total = sum(t.nbytes for t in p.tensors)
    assert len(bins) == threads and sum(loads) == total  # every byte copied once
    assert max(loads) - min(loads) <= threads * ALIGN, loads  # was 6 MiB to 0.1 MiB with 2
    for b in bins:
        run_pieces(b)
    _copied(p, offsets, area)


def test_a_small_state_is_copied_by_the_thread_that_laid_it_out() -> None:
    """Handing a few MiB to other threads costs more than copying them (a thread hop took
    0.2-1.5 ms on the reference VM): at most INLINE_COPY bytes are copied at once."""
    p, offsets, area = _laid_out(_state())
    assert sum(t.nbytes for t in p.tensors) <= INLINE_COPY
    assert share_copies(p.tensors, offsets, memoryview(area), 2) == []  # nothing left to share
    _copied(p, offsets, area)


def _large_state() -> dict[str, Any]:
    state = _state()
    state["big"] = np.arange(INLINE_COPY // 4 + 12_345, dtype=np.float32)  # just over the line
    state["big_strided"] = np.arange(2 * 256 * 1024, dtype=np.int32).reshape(-1, 2)[:, 1]
    return state


def test_a_large_state_is_shared_between_threads() -> None:
    p, offsets, area = _laid_out(_large_state())
    bins = share_copies(p.tensors, offsets, memoryview(area), 2)
    assert len([b for b in bins if b]) == 2  # above INLINE_COPY: shared out, not copied yet
    for b in bins:
        run_pieces(b)
    _copied(p, offsets, area)


def test_a_thread_that_starts_late_leaves_its_share_to_the_others() -> None:
    """Each thread takes pieces from its own list, then from the others': a second worker
    thread that wakes late (or never) does not hold the caller up until it has copied half."""
    p, offsets, area = _laid_out(_large_state())
    bins = share_copies(p.tensors, offsets, memoryview(area), 2)
    assert all(len(piece[1]) <= PIECE for b in bins for piece in b)  # small enough to take over
    queues = [deque(b) for b in bins]
    drain(0, queues)  # thread 0 alone: the second never started
    assert not any(queues)
    _copied(p, offsets, area)


async def test_a_large_staged_state_is_copied_by_several_threads(tmp_path: Path) -> None:
    """Above INLINE_COPY the copy is shared out; the object is the same either way."""
    state = await asyncio.to_thread(_large_state)  # tens of MiB: not on the loop the guard watches
    async with AsyncCheckpointer(chunk_size=MiB, num_buffers=4) as ckpt:
        uri = str(tmp_path / "big.safetensors")
        handle = await ckpt.save_state(uri, state, staging="host")
        result = await handle
        assert result.copy_s > 0 and result.blocked_s >= result.copy_s
        loaded = (await ckpt.load_state(uri)).state
    for name in ("big", "big_strided", "strided"):
        np.testing.assert_array_equal(loaded[name], state[name])
    np.testing.assert_array_equal(loaded["layer5"]["weight"], state["layer5"]["weight"])

"""The generating thread of an append stream (asyncckpt/sinks/objstore/ahead.py): chunks are made
in order, back to back, by one thread of their own, at most AHEAD of the requests; a request
collects its chunk's CRC32C; a failure reaches the chunk's request and every later one; stop
ends both threads and returns every chunk's memory, collected or not.

The chunks here are made in plain memory by a real function (the s3dlio end of the same
mechanism runs in tests/test_s3dlio_in_place.py); the threads, the bound and the releases
are the code under test.
"""

from __future__ import annotations

import asyncio
import threading
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import crc32c
import pytest

from asyncckpt.sinks.objstore.ahead import AHEAD, Ahead, Placed

N = 64 * 1024
LAYOUT = [(i * N, N) for i in range(6)] + [(6 * N, 99)]


def content(index: int, nbytes: int) -> bytes:
    return (zlib.compress(bytes([index])) * nbytes)[:nbytes]


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(1) as executor:  # joins the threads, as a sink's executor does
        yield executor


class Maker:
    """Makes each chunk in fresh memory (its bytes depend on its index) and records which
    thread made it; ``made[k]`` is set once k + 1 chunks exist."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.threads: list[int] = []
        self.views: list[memoryview] = []
        self.made = [threading.Event() for _ in LAYOUT]
        self.fail_at = fail_at

    def __call__(self, nbytes: int) -> Placed:
        index = len(self.threads)
        self.threads.append(threading.get_ident())
        if index == self.fail_at:
            raise ConnectionResetError(f"chunk {index} could not be placed")
        view = memoryview(bytearray(content(index, nbytes)))
        self.views.append(view)
        self.made[index].set()
        return Placed(view=view, fill_s=0.0, write_s=0.0)


def released(view: memoryview) -> bool:
    try:
        len(view)
    except ValueError:
        return True
    return False


def threads_left() -> list[str]:
    return [
        t.name for t in threading.enumerate() if t.name.startswith(("asyncckpt-generate", "asyncckpt-crc"))
    ]


async def test_chunks_are_made_ahead_of_requests_by_one_thread_and_bounded(
    pool: ThreadPoolExecutor,
) -> None:
    make = Maker()
    ahead = Ahead(make, LAYOUT, pool)
    await asyncio.to_thread(make.made[AHEAD - 1].wait, 10)  # made with no request at all
    await asyncio.to_thread(ahead.thread.join, 0.2)  # it would go on here if it were not bounded
    assert len(make.threads) == AHEAD
    first = await ahead.take(0, N)  # its memory goes back: one more chunk may be made
    await asyncio.to_thread(make.made[AHEAD].wait, 10)
    assert first.checksum == crc32c.crc32c(content(0, N))
    assert released(make.views[0]) and not released(make.views[1])
    got = [await ahead.take(offset, n) for offset, n in LAYOUT[1:]]
    assert [c.checksum for c in got] == [
        crc32c.crc32c(content(i + 1, n)) for i, (_, n) in enumerate(LAYOUT[1:])
    ]
    assert len(set(make.threads)) == 1 and make.threads[0] != threading.get_ident()
    await ahead.stop()
    assert all(released(v) for v in make.views) and threads_left() == []


async def test_stop_before_the_end_returns_every_chunk_and_ends_the_threads(
    pool: ThreadPoolExecutor,
) -> None:
    make = Maker()
    ahead = Ahead(make, LAYOUT, pool)
    await ahead.take(0, N)
    await asyncio.to_thread(make.made[AHEAD].wait, 10)
    await ahead.stop()  # chunks 1..3 made, never collected
    assert len(make.views) == AHEAD + 1 and all(released(v) for v in make.views)
    assert threads_left() == []


async def test_a_failed_chunk_fails_its_request_and_every_later_one(pool: ThreadPoolExecutor) -> None:
    make = Maker(fail_at=2)
    ahead = Ahead(make, LAYOUT, pool)
    await ahead.take(0, N)
    await ahead.take(N, N)
    for offset, n in LAYOUT[2:]:
        with pytest.raises(ConnectionResetError, match="chunk 2"):
            await ahead.take(offset, n)
    await ahead.stop()
    assert len(make.threads) == 3 and all(released(v) for v in make.views) and threads_left() == []


async def test_a_chunk_outside_the_layout_is_refused(pool: ThreadPoolExecutor) -> None:
    ahead = Ahead(Maker(), LAYOUT, pool)
    with pytest.raises(RuntimeError, match="not in the generated layout"):
        await ahead.take(0, N + 1)
    await ahead.stop()
    assert threads_left() == []

"""Loading real files (and memory objects) back: exact bytes, bounded memory, honest cache defeat."""

from __future__ import annotations

import asyncio
import ctypes
import mmap
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from asyncckpt import AsyncCheckpointer, ConfigError
from asyncckpt.checksum import crc
from asyncckpt.engine.manifest import manifest_uri
from asyncckpt.engine.seal import unseal
from asyncckpt.errors import TruncatedError
from asyncckpt.sinks import MEMORY_STORE
from asyncckpt.units import KiB, MiB

from .conftest import files_in, generated

CHUNK = 1 * MiB
_libc = ctypes.CDLL(None, use_errno=True)


def resident_pages(path: Path) -> int:
    """Pages of ``path`` in the page cache right now (mincore on a mapping of the file)."""
    size = path.stat().st_size
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as m:
        pages = -(-size // mmap.PAGESIZE)
        vec = (ctypes.c_ubyte * pages)()
        addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
        assert _libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size), vec) == 0, ctypes.get_errno()
        resident = sum(b & 1 for b in vec)
        del addr
    return resident


def fs_type(path: Path) -> str:
    """File system type of the mount holding ``path`` (longest matching mount point)."""
    best, kind = "", "?"
    for line in Path("/proc/mounts").read_text().splitlines():
        _, point, fstype, *_ = line.split()
        if str(path.resolve()).startswith(point.rstrip("/") + "/") and len(point) > len(best):
            best, kind = point, fstype
    return kind


async def collect(ckpt: AsyncCheckpointer, uri: str | Path, **kwargs: object) -> bytes:
    out = bytearray()
    async for view in ckpt.iter_load(uri, **kwargs):  # type: ignore[arg-type]
        out += view
    return bytes(out)


@pytest.mark.parametrize("size", [CHUNK, 3 * CHUNK + 12345, 4096 * 7 + 1, 100])
@pytest.mark.parametrize(
    ("verify", "read_chunk", "readers"),
    [
        (True, None, 1),
        ("regenerate", None, 2),
        (True, 64 * KiB, 3),
        ("regenerate", 12 * KiB, 2),
        (False, None, 3),
    ],
)
async def test_round_trip_file(
    tmp_path: Path, size: int, verify: object, read_chunk: int | None, readers: int
) -> None:
    target = tmp_path / "rank0.bin"
    async with AsyncCheckpointer(chunk_size=CHUNK, num_buffers=3, seed=11) as ckpt:
        await ckpt.save(target, size)
        data = await collect(ckpt, target, verify=verify, read_chunk_size=read_chunk, num_readers=readers)
        result = await ckpt.load(target, verify=verify, read_chunk_size=read_chunk, num_readers=readers)
    assert data == await generated(size, CHUNK, 11)
    assert result.operation == "load" and result.size_bytes == size
    assert result.chunks == -(-size // (read_chunk or CHUNK))
    assert sum(result.bottleneck_counts.values()) == result.chunks
    assert result.metadata.max_in_flight == readers
    assert result.metadata.extra["verify"] == {True: "checksum", False: "none"}.get(verify, verify)  # type: ignore[call-overload]
    assert (result.verify_s > 0) == (verify is not False)
    assert result.read_latency_s.max > 0 and result.read_s > 0


async def test_manifest_describes_the_bytes(tmp_path: Path) -> None:
    target = tmp_path / "m.bin"
    async with AsyncCheckpointer(chunk_size=CHUNK, num_buffers=2, seed=5) as ckpt:
        saved = await ckpt.save(target, 2 * CHUNK + 7)
    raw, m = unseal(target.read_bytes())  # sealed into the object itself: no sidecar
    assert files_in(tmp_path) == ["m.bin"]
    assert (m.size, m.chunk_size, m.generator, m.seed, m.object) == (2 * CHUNK + 7, CHUNK, "dgen", 5, "m.bin")
    assert m.chunk_crc32c == tuple(crc(raw[o : o + CHUNK]) for o in range(0, len(raw), CHUNK))
    assert m.object_crc32c == crc(raw)  # combined from chunk CRCs, no second pass
    assert saved.checksum_s > 0 and all(r.checksum is not None for r in saved.records)
    assert target.stat().st_size % 4096 == 0  # data, zeros to a page, manifest, trailer


async def test_into_buffer_and_caller_data(tmp_path: Path) -> None:
    payload = os.urandom(2 * CHUNK + 333)
    target = tmp_path / "state.bin"
    async with AsyncCheckpointer(chunk_size=CHUNK, num_buffers=2) as ckpt:
        await ckpt.save(target, data=payload)
        into = bytearray(len(payload))
        result = await ckpt.load(target, into=into)
        with pytest.raises(ConfigError, match=r"regenerate.*caller"):
            await ckpt.load(target, verify="regenerate")
        with pytest.raises(ConfigError, match="holds 10 bytes"):
            await ckpt.load(target, into=bytearray(10))
    assert bytes(into) == payload
    assert result.metadata.generator == "caller"


async def test_memory_sink_round_trip() -> None:
    uri = "memory://test-load/rank0"
    async with AsyncCheckpointer(chunk_size=CHUNK, num_buffers=2, seed=9) as ckpt:
        await ckpt.save(uri, 2 * CHUNK + 1)
        assert manifest_uri(uri) not in MEMORY_STORE  # sealed into the object
        assert await collect(ckpt, uri, num_readers=2) == await generated(2 * CHUNK + 1, CHUNK, 9)
        result = await ckpt.load(uri, verify="regenerate")
        await ckpt.delete(uri)
    assert result.metadata.backend == "memory"
    assert uri not in MEMORY_STORE and manifest_uri(uri) not in MEMORY_STORE


async def test_memory_bounded_by_pool(tmp_path: Path) -> None:
    target = tmp_path / "big.bin"
    async with AsyncCheckpointer(chunk_size=64 * KiB, num_buffers=3, seed=1) as ckpt:
        await ckpt.save(target, 200 * 64 * KiB)
        result = await ckpt.load(target, num_readers=3)
        pool = ckpt.runtime.pool_now
        assert pool is not None
        stats = pool.stats()
    assert result.chunks == 200
    assert stats.peak_in_use <= 3 and stats.free == 3
    assert stats.acquires == 200


async def test_direct_reads_bypass_cache(tmp_path: Path) -> None:
    target = tmp_path / "d.bin"
    async with AsyncCheckpointer(chunk_size=CHUNK, num_buffers=2, seed=2) as ckpt:
        await ckpt.save(target, 4 * CHUNK + 100)
        result = await ckpt.load(target)
    if not result.metadata.direct_io:
        pytest.skip(
            f"{tmp_path} refuses O_DIRECT ({result.metadata.direct_io_reason}); fadvise test covers it"
        )
    assert "O_DIRECT reads" in result.metadata.direct_io_reason
    assert resident_pages(target) == 0  # neither the O_DIRECT save nor the load cached it


async def test_fadvise_evicts_when_direct_io_off(tmp_path: Path) -> None:
    if fs_type(tmp_path) in ("tmpfs", "ramfs"):
        pytest.skip(f"{tmp_path} is in memory ({fs_type(tmp_path)}): its pages cannot be evicted")
    target = tmp_path / "b.bin"
    size = 4 * CHUNK + 100
    async with AsyncCheckpointer(chunk_size=CHUNK, num_buffers=2, seed=2, direct_io=False) as ckpt:
        await ckpt.save(target, size)
        target.read_bytes()  # warm the cache
        assert resident_pages(target) > 0
        result = await ckpt.load(target)
        assert resident_pages(target) == 0
        warm = await ckpt.load(target, defeat_cache=False)
    assert result.metadata.direct_io is False
    assert "posix_fadvise(DONTNEED) before and during" in result.metadata.direct_io_reason
    assert result.metadata.extra["page_cache_evicted"] is True
    assert "page cache allowed" in warm.metadata.direct_io_reason
    assert resident_pages(target) > 0  # the buffered load without defeat left pages cached


async def test_early_exit_releases_pool(tmp_path: Path, leak_check: None) -> None:
    target = tmp_path / "e.bin"
    async with AsyncCheckpointer(chunk_size=CHUNK, num_buffers=3, seed=4) as ckpt:
        await ckpt.save(target, 10 * CHUNK)
        async with ckpt.iter_load(target, num_readers=3) as views:
            async for view in views:
                assert len(view) == CHUNK
                break
        with pytest.raises(RuntimeError, match="not finished"):
            _ = views.result
        pool = ckpt.runtime.pool_now
        assert pool is not None and pool.stats().free == 3
        await ckpt.save(target, CHUNK)  # the lock was released
        stream = ckpt.iter_load(target)
        assert [len(v) async for v in stream] == [CHUNK]
        assert stream.result.size_bytes == CHUNK


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"verify": "bogus"}, "verify must be"),
        ({"read_chunk_size": 1000}, "multiple of 4096"),
        ({"read_chunk_size": 2 * CHUNK}, "exceeds the pool's chunk_size"),
        ({"num_readers": 0}, "num_readers"),
        ({"num_readers": 9}, "num_readers"),
        ({"into": b"read-only"}, "writable"),
    ],
)
async def test_bad_load_arguments_rejected_before_io(
    tmp_path: Path, kwargs: dict[str, object], message: str
) -> None:
    async with AsyncCheckpointer(chunk_size=CHUNK, num_buffers=2) as ckpt:
        with pytest.raises(ConfigError, match=message):
            await ckpt.load(tmp_path / "absent.bin", **kwargs)  # type: ignore[arg-type]


async def test_preallocate_save_has_a_manifest_too(tmp_path: Path) -> None:
    target = tmp_path / "p.bin"
    async with AsyncCheckpointer(chunk_size=CHUNK, num_buffers=2, seed=8) as ckpt:
        saved = await ckpt.save(target, 3 * CHUNK + 5, method="preallocate")
        result = await ckpt.load(target, verify="regenerate")
        await ckpt.load(target, verify=True)
    assert saved.checksum_s > 0 and result.size_bytes == 3 * CHUNK + 5


async def save_then_cancel_a_reader(
    ckpt: AsyncCheckpointer,
    target: Path,
    consume: Callable[[AsyncCheckpointer], Awaitable[None]],
    got_one: asyncio.Event,
) -> None:
    """Save 20 chunks at ``target``, start ``consume``, cancel it once it holds a view."""
    await ckpt.save(target, 20 * CHUNK)
    task = asyncio.create_task(consume(ckpt))
    await got_one.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_cancel_mid_load_cleans_up(tmp_path: Path, leak_check: None) -> None:
    target = tmp_path / "c.bin"
    got_one = asyncio.Event()
    release = asyncio.Event()

    async def consume(ckpt: AsyncCheckpointer) -> None:
        async with ckpt.iter_load(target, num_readers=2) as views:
            async for _ in views:
                got_one.set()
                await release.wait()  # a slow caller: reads in flight or done, buffers held

    async with AsyncCheckpointer(chunk_size=CHUNK, num_buffers=3, seed=4) as ckpt:
        await save_then_cancel_a_reader(ckpt, target, consume, got_one)
        pool = ckpt.runtime.pool_now
        assert pool is not None and pool.stats().free == 3
        assert (await ckpt.load(target)).chunks == 20  # lock and pool usable again


async def test_object_truncated_during_load(tmp_path: Path) -> None:
    target = tmp_path / "t.bin"
    async with AsyncCheckpointer(chunk_size=CHUNK, num_buffers=2, seed=4) as ckpt:
        await ckpt.save(target, 12 * CHUNK)
        with pytest.raises(TruncatedError, match="truncated during the load"):
            async with ckpt.iter_load(target, num_readers=1) as views:
                async for _ in views:
                    os.truncate(target, 2 * CHUNK)


async def test_plain_async_for_cancelled_releases_the_pool_soon(tmp_path: Path) -> None:
    """Without ``async with`` the generator is finalized by the loop shortly after the task ends."""
    target = tmp_path / "g.bin"
    got_one = asyncio.Event()

    async def consume(ckpt: AsyncCheckpointer) -> None:
        async for _ in ckpt.iter_load(target, num_readers=2):
            got_one.set()
            await asyncio.Event().wait()

    async with AsyncCheckpointer(chunk_size=CHUNK, num_buffers=3, seed=4) as ckpt:
        await save_then_cancel_a_reader(ckpt, target, consume, got_one)
        result = await asyncio.wait_for(ckpt.load(target), timeout=30)  # waits for the lock, not forever
        assert result.chunks == 20


async def test_view_is_invalid_after_the_next_item(tmp_path: Path) -> None:
    target = tmp_path / "v.bin"
    async with AsyncCheckpointer(chunk_size=CHUNK, num_buffers=2, seed=4) as ckpt:
        await ckpt.save(target, 3 * CHUNK)
        kept: list[memoryview] = []
        async for view in ckpt.iter_load(target):
            kept.append(view)
    with pytest.raises(ValueError, match="released"):
        bytes(kept[0])


async def test_delete_removes_a_checkpoint_and_refuses_a_directory(tmp_path: Path) -> None:
    """``delete(dir)`` removed an empty directory the user had made, and on a full one said
    "[Errno 39] Directory not empty"; a directory is not a checkpoint."""
    (tmp_path / "mine").mkdir()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("keep")
    async with AsyncCheckpointer(chunk_size=CHUNK, num_buffers=2) as ckpt:
        await ckpt.save(tmp_path / "c.bin", CHUNK)
        await ckpt.delete(tmp_path / "c.bin")
        for name in ("mine", "full"):
            with pytest.raises(ConfigError, match=f"'{tmp_path / name}' is a directory, not a checkpoint"):
                await ckpt.delete(tmp_path / name)
    assert sorted(os.listdir(tmp_path)) == ["full", "mine"]
    assert (tmp_path / "full" / "notes.txt").read_text() == "keep"

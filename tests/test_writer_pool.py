"""One writer process per checkpointer: every save and load of an isolated backend reuses it.

The first version started a writer process for every object (three per save with manifests,
two per load). The pid each result reports is the process that served it; the checkpointer's
``aclose`` reaps it. A writer that dies is replaced for the next object.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from asyncckpt import AsyncCheckpointer, WriterProcessError
from asyncckpt.servers.s3endpoint import S3Endpoint
from asyncckpt.sinks.s3 import installed
from asyncckpt.units import MiB

from .conftest import ROOT, files_in
from .s3_harness import in_child, new_bucket

CHUNK = 1 * MiB
ROUNDS = 10


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def test_ten_file_saves_and_loads_use_one_writer_process(tmp_path: Path) -> None:
    pids = set()
    async with AsyncCheckpointer(chunk_size=CHUNK, num_buffers=3, isolation="process") as ckpt:
        for i in range(ROUNDS):
            saved = await ckpt.save(tmp_path / f"c{i}.bin", 3 * CHUNK + i)
            loaded = await ckpt.load(tmp_path / f"c{i}.bin")
            pids |= {saved.metadata.extra["writer_pid"], loaded.metadata.extra["writer_pid"]}
        await ckpt.delete(tmp_path / "c0.bin")
    assert len(pids) == 1, pids
    assert gone(pids.pop())  # reaped by aclose


async def test_a_killed_writer_is_replaced_for_the_next_save(tmp_path: Path) -> None:
    async with AsyncCheckpointer(chunk_size=CHUNK, num_buffers=3, isolation="process") as ckpt:
        first = (await ckpt.save(tmp_path / "a.bin", 2 * CHUNK)).metadata.extra["writer_pid"]
        os.kill(first, 9)
        with pytest.raises(WriterProcessError):
            await ckpt.save(tmp_path / "b.bin", 2 * CHUNK)
        second = (await ckpt.save(tmp_path / "c.bin", 2 * CHUNK)).metadata.extra["writer_pid"]
        assert second != first
        assert (await ckpt.load(tmp_path / "a.bin")).size_bytes == 2 * CHUNK
    assert gone(second)
    assert files_in(tmp_path) == ["a.bin", "c.bin"]


@pytest.mark.skipif(in_child() or not installed("s3dlio"), reason="parent process, s3dlio installed")
async def test_ten_default_s3_saves_start_one_writer_process(moto_endpoint: S3Endpoint) -> None:
    bucket = await asyncio.to_thread(new_bucket, moto_endpoint)
    pids = set()
    async with AsyncCheckpointer(
        chunk_size=5 * MiB, num_buffers=3, backend_options=moto_endpoint.options()
    ) as ckpt:
        for i in range(ROUNDS):
            saved = await ckpt.save(f"s3://{bucket}/c{i}.bin", 5 * MiB + i)
            assert saved.metadata.extra["isolation"] == "process"
            pids.add(saved.metadata.extra["writer_pid"])
        loaded = await ckpt.load(f"s3://{bucket}/c3.bin")
        pids.add(loaded.metadata.extra["writer_pid"])
    assert len(pids) == 1, pids
    assert gone(pids.pop())


async def test_minio_in_a_writer_process_writes_the_sealed_footer() -> None:
    """The footer travels inline (not in the arena); minio's urllib3 still held a view of the
    child's scratch mapping after the part was stored, and closing it raised BufferError
    (seen against the discard endpoint of the S3 benchmarks, which answers at once)."""
    server = ROOT / "benchmarks" / "s3_discard_server.py"
    proc = subprocess.Popen([sys.executable, str(server), "--port", "0"], stdout=subprocess.PIPE, text=True)  # noqa: ASYNC220
    try:
        assert proc.stdout is not None
        endpoint = (await asyncio.to_thread(proc.stdout.readline)).split()[-1]
        options = {"endpoint_url": endpoint, "access_key_id": "a", "secret_access_key": "b", "dotenv": False}
        async with AsyncCheckpointer(
            chunk_size=32 * MiB, num_buffers=8, backend="minio", isolation="process", backend_options=options
        ) as ckpt:
            saved = await ckpt.save("s3://discard/m.bin", 8 * 32 * MiB)  # the footer: a piece of its own
    finally:
        proc.kill()
        await asyncio.to_thread(proc.wait)
    assert saved.metadata.extra["isolation"] == "process"

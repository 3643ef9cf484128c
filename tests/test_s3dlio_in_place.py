"""s3dlio in the default mode (a writer process): synthetic chunks are generated straight into
the memory ``reserve()`` lends, so no data byte is copied on the way to s3dlio; caller data is
copied into it exactly once in the writer (after the one copy into the shared pool).

The writer's handle counts the bytes that reached s3dlio by a copy and those generated in its
memory, and reports both in the sink facts (``result.metadata.extra``). s3dlio fixes its
endpoint per process, so the tests run in a child pytest process per server (``run_child_suite``).
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from asyncckpt import AsyncCheckpointer, UnverifiableError
from asyncckpt.engine.seal import unseal
from asyncckpt.node.topology import thread_budget
from asyncckpt.servers.s3endpoint import S3Endpoint

from .conftest import checkpoint_data, expected_bytes
from .s3_harness import CHUNK, in_child, new_bucket, run_child_suite, s3_call

SIZE = 3 * CHUNK + 99  # a short last chunk: the footer follows it
SEED = 23

child_only = pytest.mark.skipif(not in_child(), reason="s3dlio runs in the child suite")


def checkpointer(ep: S3Endpoint, **kw: object) -> AsyncCheckpointer:
    # isolation and start method are left at their defaults: the default mode is measured
    return AsyncCheckpointer(
        chunk_size=CHUNK, num_buffers=3, backend="s3dlio", backend_options=ep.options(), seed=SEED, **kw
    )


async def stored(ep: S3Endpoint, bucket: str, key: str) -> bytes:
    response = await s3_call(ep, "get_object", Bucket=bucket, Key=key)
    body: bytes = await asyncio.to_thread(response["Body"].read)
    return body


@child_only
async def test_s3dlio_synthetic_save_generates_in_place_without_a_copy(s3_env: S3Endpoint) -> None:
    bucket = await asyncio.to_thread(new_bucket, s3_env)
    uri = f"s3://{bucket}/synthetic.bin"
    async with checkpointer(s3_env) as ckpt:
        result = await ckpt.save(uri, SIZE)
        extra = result.metadata.extra
        assert extra["isolation"] == "process" and extra["writer_pid"] is not None
        # every data byte was made in s3dlio's memory; only the footer (zero padding to 4 KiB,
        # the manifest) was copied in, as one small write behind the data
        raw = await stored(s3_env, bucket, "synthetic.bin")
        assert extra["generated_in_library_bytes"] == SIZE
        generator = extra["generated_in_library_by"]  # dgen-py ran in the writer process
        assert generator["pid"] == extra["writer_pid"] and generator["seed"] == SEED
        # the writer runs at background niceness, so its generator takes the rank's whole CPU
        # share; the core "leave_loop_core" keeps free is for the caller's loop, elsewhere
        assert ckpt.config.resolved_cpu_nice > 0
        assert generator["gen_threads_requested"] == thread_budget(rule="leave_loop_core").share
        assert result.metadata.gen_threads == generator["gen_threads"]  # the result says so too
        assert extra["copied_into_library_bytes"] == len(raw) - SIZE < CHUNK
        want = await asyncio.to_thread(expected_bytes, SIZE, CHUNK, SEED)
        assert await asyncio.to_thread(checkpoint_data, raw) == want
        # generation is reported as generation (measured in the writer), per chunk
        assert result.chunks == 4 and result.gen_s > 0
        # made back to back in a thread of their own, some before their request came (a count:
        # how many depends on timing; tests/test_generate_ahead.py pins the mechanism down)
        assert 0 <= extra["generated_ready_when_asked"] <= result.chunks
        for verify in ("checksum", "regenerate"):
            loaded = await ckpt.load(uri, verify=verify)
            assert loaded.size_bytes == SIZE and loaded.metadata.seed == SEED


@child_only
async def test_s3dlio_in_place_save_without_integrity_computes_no_checksum(s3_env: S3Endpoint) -> None:
    """integrity="none" reaches the writer process's generating handle: no chunk gets a CRC32C
    there (the records say so), the sealed manifest says so, and a verifying load refuses."""
    bucket = await asyncio.to_thread(new_bucket, s3_env)
    uri = f"s3://{bucket}/unchecked.bin"
    async with checkpointer(s3_env, integrity="none") as ckpt:
        result = await ckpt.save(uri, SIZE)
        assert result.metadata.extra["generated_in_library_bytes"] == SIZE  # the in-place path
        assert result.integrity == "none" and result.checksum_s == 0
        assert all(r.checksum is None and r.checksum_s == 0 for r in result.records)
        _, manifest = await asyncio.to_thread(unseal, await stored(s3_env, bucket, "unchecked.bin"))
        assert manifest.integrity == "none" and manifest.chunk_crc32c == ()
        with pytest.raises(UnverifiableError, match="integrity='none'"):
            await ckpt.load(uri)
        for verify in (False, "regenerate"):
            loaded = await ckpt.load(uri, verify=verify)
            assert loaded.size_bytes == SIZE
    async with checkpointer(s3_env) as ckpt:  # the default, through the same kind of writer
        result = await ckpt.save(f"s3://{bucket}/checked.bin", SIZE)
        assert all(r.checksum is not None for r in result.records)


@child_only
async def test_s3dlio_generator_threads_given_by_the_caller_are_kept(s3_env: S3Endpoint) -> None:
    bucket = await asyncio.to_thread(new_bucket, s3_env)
    async with checkpointer(s3_env, gen_threads=1) as ckpt:
        result = await ckpt.save(f"s3://{bucket}/one-thread.bin", SIZE)
    assert result.metadata.extra["generated_in_library_by"]["gen_threads_requested"] == 1


@child_only
async def test_s3dlio_caller_data_is_copied_once_into_s3dlio(s3_env: S3Endpoint) -> None:
    bucket = await asyncio.to_thread(new_bucket, s3_env)
    uri = f"s3://{bucket}/caller.bin"
    data = await asyncio.to_thread(expected_bytes, SIZE, CHUNK, 99)
    async with checkpointer(s3_env) as ckpt:
        result = await ckpt.save(uri, data=data)
        extra = result.metadata.extra
        raw = await stored(s3_env, bucket, "caller.bin")
        assert extra["isolation"] == "process", extra
        # the documented copy: every byte (data and footer) copied into reserve()d memory
        assert extra["generated_in_library_bytes"] == 0 and "generated_in_library_by" not in extra
        assert extra["copied_into_library_bytes"] == len(raw)
        assert await asyncio.to_thread(checkpoint_data, raw) == data
        loaded = await ckpt.load(uri, verify="checksum")
        assert loaded.size_bytes == SIZE


@child_only
@pytest.mark.parametrize("isolation", ["none", "process"])
async def test_s3dlio_in_place_save_cancelled_midway_leaves_no_thread_upload_or_object(
    s3_env: S3Endpoint, isolation: str
) -> None:
    """Cancelled once its first chunk is up, the save stops its generating and checksum
    threads (their chunks' memory returned before the upload is dropped), leaves no upload
    and no object, and the same checkpointer (the same writer process) saves again."""
    bucket = await asyncio.to_thread(new_bucket, s3_env)
    async with checkpointer(s3_env, isolation=isolation) as ckpt:
        task: asyncio.Task[object] | None = None

        def cancel_after_first_chunk(done: int) -> None:
            assert task is not None
            task.cancel()  # from the save's own progress report: it cannot finish first

        task = asyncio.create_task(
            ckpt.save(f"s3://{bucket}/cancelled.bin", 12 * CHUNK, progress=cancel_after_first_chunk)
        )
        with pytest.raises(asyncio.CancelledError):
            await task
        if isolation == "none":  # in this process: the threads are gone
            names = [t.name for t in threading.enumerate()]
            assert not [n for n in names if n.startswith(("asyncckpt-generate", "asyncckpt-crc"))], names
        again = await ckpt.save(f"s3://{bucket}/after.bin", SIZE)
        assert again.metadata.extra["generated_in_library_bytes"] == SIZE
    listing = await s3_call(s3_env, "list_objects_v2", Bucket=bucket)
    assert [o["Key"] for o in listing.get("Contents", [])] == ["after.bin"]
    pending = await s3_call(s3_env, "list_multipart_uploads", Bucket=bucket)
    assert pending.get("Uploads", []) == []


@pytest.mark.skipif(in_child(), reason="this is the launcher of the child suite")
def test_s3dlio_in_place_generation_in_a_child_suite(s3_endpoint: S3Endpoint) -> None:
    proc = run_child_suite(__file__, s3_endpoint, "s3dlio and not child_suite")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "6 passed" in proc.stdout, proc.stdout[-2000:]

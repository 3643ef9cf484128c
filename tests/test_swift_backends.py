"""Every S3 backend through the public API on a real object store (OpenStack Swift + s3api):
save + load + verify with many parts, abort after a failure, and a full disk.

Results are checked with an independent client (boto3). s3dlio and s3torchconnector run in a
child pytest (fork safety, see the harness), which reuses the session's Swift.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator

import pytest

from asyncckpt import AsyncCheckpointer, MiB, StorageError
from asyncckpt.servers.s3endpoint import S3Endpoint

from .conftest import holds_stream
from .plugins.s3servers import SMALL_DISK, Servers, endpoint_from_json, endpoint_to_json, small_disk_swift
from .s3_harness import in_child, new_bucket, run_child_suite, s3_backends, s3_call

pytestmark = pytest.mark.realstore  # every test here needs Swift
BACKENDS = s3_backends()
PART = 5 * MiB
MANY = 12  # parts of 5 MiB: more than any window of parts in flight
SMALL_DISK_ENV = "ASYNCCKPT_TEST_SMALL_DISK"


def checkpointer(backend: str, ep: S3Endpoint, **kw: object) -> AsyncCheckpointer:
    return AsyncCheckpointer(
        chunk_size=PART, num_buffers=4, backend=backend, backend_options=ep.options(max_attempts=2), **kw
    )


def listing(ep: S3Endpoint, bucket: str) -> tuple[list[str], list[str]]:
    """(object keys, keys of unfinished multipart uploads), from an independent client."""
    client = ep.client()
    objects = [o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", [])]
    uploads = [u["Key"] for u in client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])]
    return objects, uploads


@pytest.fixture
def swift(swift_endpoint: S3Endpoint) -> tuple[S3Endpoint, str]:
    """The Swift endpoint and a new bucket on it (made here, off the test's loop)."""
    return swift_endpoint, new_bucket(swift_endpoint)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_save_load_verify_many_parts_then_overwrite_and_delete(
    backend: str, swift: tuple[S3Endpoint, str]
) -> None:
    ep, bucket = swift
    uri, size = f"s3://{bucket}/many.bin", MANY * PART
    async with checkpointer(backend, ep, seed=21) as ckpt:
        saved = await ckpt.save(uri, size)
        loaded = await ckpt.load(uri)  # verified against the manifest (CRC32C per chunk)
        head = await s3_call(ep, "head_object", Bucket=bucket, Key="many.bin")
        got = await s3_call(ep, "get_object", Bucket=bucket, Key="many.bin")
        body = await asyncio.to_thread(got["Body"].read)
        small = await ckpt.save(uri, 1000)  # replaces the manifest (a delete on the way): one PUT
        assert (await ckpt.load(uri)).size_bytes == 1000
        await ckpt.delete(uri)
    assert saved.metadata.extra["parts"] == MANY + 1 and small.size_bytes == 1000  # + the sealed manifest
    if backend != "s3torchconnector":  # the CRT stream does not report the ETag
        assert str(saved.metadata.extra["etag"]).strip('"').endswith(f"-{MANY + 1}")
    assert head["ETag"].strip('"').endswith(f"-{MANY + 1}")  # Swift's multipart ETag: md5-of-md5s-N
    assert await asyncio.to_thread(holds_stream, body, size, PART, 21)
    assert loaded.operation == "load" and loaded.size_bytes == size
    assert await asyncio.to_thread(listing, ep, bucket) == ([], [])  # object and manifest deleted


@pytest.mark.parametrize("backend", BACKENDS)
async def test_failure_mid_save_aborts_and_publishes_nothing(
    backend: str, swift: tuple[S3Endpoint, str]
) -> None:
    ep, bucket = swift
    written = 0

    def fail_after_two_chunks(nbytes: int) -> None:
        nonlocal written
        written += nbytes
        if written >= 2 * PART:
            raise RuntimeError("training step failed")

    async with checkpointer(backend, ep) as ckpt:
        with pytest.raises(RuntimeError, match="training step failed"):
            await ckpt.save(f"s3://{bucket}/f.bin", MANY * PART, progress=fail_after_two_chunks)
    assert await asyncio.to_thread(listing, ep, bucket) == ([], [])


@pytest.fixture(scope="module")
def small_disk(s3_servers: Servers) -> Iterator[S3Endpoint]:
    """A Swift of this module's own with its data on a 16 MiB tmpfs (shared by its tests).

    The child suite reuses the parent's (see the launcher): every test leaves the disk empty.
    """
    s3_servers.get("swift")  # skips (with the reason) when Swift is unavailable
    if SMALL_DISK_ENV in os.environ:
        yield endpoint_from_json(os.environ[SMALL_DISK_ENV])
        return
    with small_disk_swift(SMALL_DISK) as ep:
        yield ep


@pytest.mark.parametrize("backend", BACKENDS)
async def test_full_disk_fails_clearly_and_leaves_nothing(backend: str, small_disk: S3Endpoint) -> None:
    ep = small_disk
    bucket = await asyncio.to_thread(new_bucket, ep)
    async with checkpointer(backend, ep) as ckpt:
        with pytest.raises(StorageError) as info:
            await ckpt.save(f"s3://{bucket}/full.bin", 5 * PART)  # 25 MiB into 16 MiB
    text = str(info.value)
    assert "full.bin" in text and "out of space" in text, text
    assert ep.secret_key not in text + repr(info.value)
    assert await asyncio.to_thread(listing, ep, bucket) == ([], [])


@pytest.mark.skipif(in_child(), reason="this is the launcher of the child suite")
def test_out_of_process_backends_pass_the_same_tests(
    swift_endpoint: S3Endpoint, small_disk: S3Endpoint
) -> None:
    proc = run_child_suite(__file__, swift_endpoint, env={SMALL_DISK_ENV: endpoint_to_json(small_disk)})
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-2000:]

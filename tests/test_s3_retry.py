"""Transient S3 faults on ONE endpoint are retried by asyncckpt, against a real moto server.

A ``FaultyFront`` (tests/relay.py) before moto spoils chosen requests. botocore cannot rewind
the pool's memoryview body of ``upload_part``, so these retries must be asyncckpt's own: fresh
requests with the same buffer.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable

import pytest

from asyncckpt import AsyncCheckpointer, StorageError, StoragePermissionError
from asyncckpt.servers.s3endpoint import S3Endpoint

from .conftest import checkpoint_data, generated
from .relay import FaultyFront, is_create, is_part, is_part_2, part_number
from .s3_harness import CHUNK, in_child, new_bucket, s3_call

pytestmark = pytest.mark.skipif(in_child(), reason="aiobotocore runs in the parent process only")


def checkpointer(options: dict[str, object]) -> AsyncCheckpointer:
    return AsyncCheckpointer(
        chunk_size=CHUNK,
        num_buffers=4,
        max_in_flight=4,
        backend="aiobotocore",
        backend_options=options,
        seed=7,
    )


async def stored(server: S3Endpoint, bucket: str, key: str) -> bytes:
    def get() -> bytes:
        body: bytes = server.client().get_object(Bucket=bucket, Key=key)["Body"].read()
        return body

    return await asyncio.to_thread(get)


async def uploads(server: S3Endpoint, bucket: str) -> list[str]:
    listing = await s3_call(server, "list_multipart_uploads", Bucket=bucket)
    return [u["Key"] for u in listing.get("Uploads", [])]


@pytest.mark.parametrize(
    ("mode", "match", "times"),
    [("cut", is_part_2, 2), ("busy", is_part, 1), ("busy", is_create, 1)],
    ids=["part-reset-mid-body-twice", "part-503-slowdown", "create-503-slowdown"],
)
async def test_a_transient_fault_on_the_only_endpoint_is_retried(
    moto_endpoint: S3Endpoint, mode: str, match: Callable[[str], bool], times: int
) -> None:
    """aiohttp itself resends an idempotent PUT once after a reset, silently; a second reset of
    the same part (or any 5xx) reaches the sink, which resends the same memoryview (botocore's
    own retry could not rewind it: UnseekableStreamError before this fix)."""
    bucket, size = await asyncio.to_thread(new_bucket, moto_endpoint), 3 * CHUNK + 1  # 4 parts
    front = FaultyFront(moto_endpoint.endpoint, mode, match, times)
    url = await front.start()
    try:
        async with checkpointer(moto_endpoint.options(endpoint_url=url)) as ckpt:
            saved = await ckpt.save(f"s3://{bucket}/r.bin", size)
            loaded = await ckpt.load(f"s3://{bucket}/r.bin", verify=True)
    finally:
        await front.stop()
    assert len(front.spoiled) == times, front.matched
    assert checkpoint_data(await stored(moto_endpoint, bucket, "r.bin")) == await generated(size, CHUNK, 7)
    assert saved.metadata.extra["retries"] >= 1
    assert loaded.metadata.extra["retries"] == 0
    assert "identity_note" not in loaded.metadata.extra
    assert await uploads(moto_endpoint, bucket) == []


@pytest.mark.parametrize("mode", ["busy", "short"], ids=["503-slowdown", "response-cut-mid-body"])
async def test_a_failed_range_read_is_retried(moto_endpoint: S3Endpoint, mode: str) -> None:
    bucket, size = await asyncio.to_thread(new_bucket, moto_endpoint), 2 * CHUNK + 5
    front = FaultyFront(moto_endpoint.endpoint, mode, lambda line: line.startswith(f"GET /{bucket}/g.bin "))
    url = await front.start()
    try:
        async with checkpointer(moto_endpoint.options(endpoint_url=url)) as ckpt:
            await ckpt.save(f"s3://{bucket}/g.bin", size)
            into = bytearray(size)
            loaded = await ckpt.load(f"s3://{bucket}/g.bin", verify=True, into=into)
    finally:
        await front.stop()
    assert len(front.spoiled) == 1  # the manifest's GET (another object) passed
    assert bytes(into) == await generated(size, CHUNK, 7)
    assert loaded.metadata.extra["retries"] >= 1


async def parts_tried(
    ep: S3Endpoint, bucket: str, fault: str, attempts: int, raises: type[StorageError]
) -> tuple[list[int], StorageError]:
    """(the part numbers each request carried, the save's error) of a save whose every part
    request the relay answers with ``fault``, with ``attempts`` tries per request."""
    front = FaultyFront(ep.endpoint, fault, is_part, times=10**6)
    url = await front.start()
    try:
        async with checkpointer(ep.options(endpoint_url=url, max_attempts=attempts)) as ckpt:
            with pytest.raises(raises) as info:
                await ckpt.save(f"s3://{bucket}/{fault}.bin", 2 * CHUNK + 1)
    finally:
        await front.stop()
    return [part_number(line) for line in front.matched], info.value


async def test_a_persistent_slowdown_gives_up_after_max_attempts(moto_endpoint: S3Endpoint) -> None:
    bucket = await asyncio.to_thread(new_bucket, moto_endpoint)
    numbers, error = await parts_tried(moto_endpoint, bucket, "busy", 2, StorageError)
    assert re.search(r"upload part \d+ of s3://.*SlowDown", str(error)), error
    assert max(numbers.count(n) for n in set(numbers)) == 2, numbers  # tried twice, then gave up
    assert moto_endpoint.secret_key not in f"{error!s} {error!r}"
    assert await uploads(moto_endpoint, bucket) == []


async def test_access_denied_is_never_retried(moto_endpoint: S3Endpoint) -> None:
    bucket = await asyncio.to_thread(new_bucket, moto_endpoint)
    numbers, error = await parts_tried(moto_endpoint, bucket, "deny", 5, StoragePermissionError)
    assert "AccessDenied" in str(error), error
    assert numbers and len(numbers) == len(set(numbers)), numbers  # each part tried once

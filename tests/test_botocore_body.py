"""aiobotocore's parts: what each option puts on the wire, and no copy of a part in the default.

A relay before the server records the head of every UploadPart, so the options are checked
as the server sees them (``x-amz-content-sha256``, ``x-amz-checksum-crc32``, the length);
the values are compared with the bytes the server then returns. The copy test counts the
memory Python allocates during a save with tracemalloc: the pool's buffers are mmaps (not
traced), so a part copied anywhere in the client (aiohttp joining it with the request head,
asyncio buffering it) shows up as a peak of a part's size. The same measure is shown to see
the copies of the signed-payload path, so it can fail.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import re
import tracemalloc
import zlib

import pytest

from asyncckpt import AsyncCheckpointer, ConfigError, MiB
from asyncckpt.servers.s3endpoint import S3Endpoint

from .conftest import checkpoint_data, generated
from .relay import counting
from .s3_harness import in_child, new_bucket, s3_call

pytestmark = pytest.mark.skipif(in_child(), reason="aiobotocore runs in the parent process")

CHUNK = 5 * MiB


def header(head: str, name: str) -> str | None:
    m = re.search(rf"^{name}:\s*(.*?)\s*$", head, re.IGNORECASE | re.MULTILINE)
    return None if m is None else m.group(1)


@pytest.mark.parametrize("checksums", ["when_required", "when_supported"])
@pytest.mark.parametrize("signing", [False, True], ids=["unsigned", "signed"])
async def test_each_option_changes_the_part_requests_as_documented(
    s3_endpoint: S3Endpoint, signing: bool, checksums: str
) -> None:
    bucket = await asyncio.to_thread(new_bucket, s3_endpoint)
    size = 2 * CHUNK + 1
    async with counting(s3_endpoint.endpoint) as (front, url):
        options = s3_endpoint.options(endpoint_url=url, payload_signing=signing, checksums=checksums)
        async with AsyncCheckpointer(
            chunk_size=CHUNK, num_buffers=3, backend="aiobotocore", backend_options=options, seed=3
        ) as ckpt:
            await ckpt.save(f"s3://{bucket}/o.bin", size)
    response = await s3_call(s3_endpoint, "get_object", Bucket=bucket, Key="o.bin")
    stored = await asyncio.to_thread(response["Body"].read)
    assert checkpoint_data(stored) == await generated(size, CHUNK, 3)
    assert len(front.heads) == 3  # two full parts, then the last with the sealed footer
    for head in front.heads:
        number = int(re.search(r"partNumber=(\d+)", head).group(1))  # type: ignore[union-attr]
        part = stored[(number - 1) * CHUNK : number * CHUNK]
        assert header(head, "content-length") == str(len(part)), head
        assert header(head, "transfer-encoding") is None and header(head, "expect") is None, head
        sha = header(head, "x-amz-content-sha256")
        assert sha == (hashlib.sha256(part).hexdigest() if signing else "UNSIGNED-PAYLOAD"), head
        crc = header(head, "x-amz-checksum-crc32")
        if checksums == "when_supported":
            assert crc == base64.b64encode(zlib.crc32(part).to_bytes(4, "big")).decode(), head
            assert header(head, "x-amz-sdk-checksum-algorithm") == "CRC32", head
        else:
            assert crc is None and "x-amz-checksum-" not in head.lower(), head


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"checksums": "crc32"}, "checksums must be one of"),
        ({"payload_signing": "maybe"}, "must be a boolean"),
    ],
)
async def test_options_are_validated_before_any_request(options: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        async with AsyncCheckpointer(
            chunk_size=CHUNK,
            num_buffers=3,
            backend="aiobotocore",
            backend_options={"endpoint_url": "http://127.0.0.1:9", "dotenv": False, **options},
        ) as ckpt:
            await ckpt.save("s3://bucket/never.bin", CHUNK)


async def peak_allocated_during_save(moto: S3Endpoint, bucket: str, options: dict[str, object]) -> int:
    """Bytes Python allocated at the peak of a 4-part save (after a warm-up save made the client)."""
    async with AsyncCheckpointer(
        chunk_size=CHUNK, num_buffers=3, backend="aiobotocore", backend_options=options
    ) as ckpt:
        await ckpt.save(f"s3://{bucket}/warm.bin", CHUNK + 1)
        tracemalloc.start()
        try:
            base, _ = tracemalloc.get_traced_memory()
            await ckpt.save(f"s3://{bucket}/copies.bin", 4 * CHUNK)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    return peak - base


async def test_default_parts_go_from_the_pool_to_the_socket_without_a_copy(moto_endpoint: S3Endpoint) -> None:
    bucket = await asyncio.to_thread(new_bucket, moto_endpoint)
    default = await peak_allocated_during_save(moto_endpoint, bucket, moto_endpoint.options())
    assert default < CHUNK // 4, f"{default} B allocated at once: a part ({CHUNK} B) was copied"
    # the measure sees copies: a signed payload is handed to aiohttp as a bytes-like body,
    # which aiohttp joins with the request head (a copy of the part) on these Pythons
    signed = await peak_allocated_during_save(
        moto_endpoint, bucket, moto_endpoint.options(payload_signing=True)
    )
    assert signed >= CHUNK, signed

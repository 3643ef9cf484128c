"""The local S3 servers themselves, proven with boto3 and aiobotocore directly.

Runs on every server of ``--s3-server`` (moto and Swift): multipart with several 5 MiB parts,
abort, range GET, EntityTooSmall, DeleteObjects with the Content-MD5 workaround.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from asyncckpt.servers.s3compat import FAST_CLIENT_CONFIG, register_s3compat
from asyncckpt.servers.s3endpoint import S3Endpoint
from asyncckpt.sinks.s3.botocore_sink import warm_session

MiB = 1 << 20


def payload(n: int, seed: int) -> bytes:
    """Distinct, position-dependent bytes (a misplaced part or range cannot pass)."""
    block = hashlib.sha256(seed.to_bytes(8, "little")).digest()
    return (block * (n // len(block) + 1))[:n].translate(bytes((i * 7 + seed) % 256 for i in range(256)))


def multipart_upload(client: Any, bucket: str, key: str, parts: list[bytes]) -> str:
    upload_id = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    done = [
        {"PartNumber": n, "ETag": client.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=n,
                                                     Body=body)["ETag"]}
        for n, body in enumerate(parts, start=1)
    ]  # fmt: skip
    result = client.complete_multipart_upload(
        Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": done}
    )
    return str(result["ETag"])


def test_multipart_roundtrip_and_range_get(s3_client: Any, s3_bucket: str) -> None:
    parts = [payload(5 * MiB, 1), payload(5 * MiB, 2), payload(5 * MiB, 3), payload(MiB + 123, 4)]
    whole = b"".join(parts)
    etag = multipart_upload(s3_client, s3_bucket, "ckpt.bin", parts)
    md5s = b"".join(hashlib.md5(p).digest() for p in parts)
    assert etag.strip('"') == f"{hashlib.md5(md5s).hexdigest()}-4"
    assert s3_client.head_object(Bucket=s3_bucket, Key="ckpt.bin")["ContentLength"] == len(whole)
    for start, end in ((0, 99), (5 * MiB - 10, 5 * MiB + 9), (len(whole) - 77, len(whole) - 1)):
        got = s3_client.get_object(Bucket=s3_bucket, Key="ckpt.bin", Range=f"bytes={start}-{end}")
        assert got["Body"].read() == whole[start : end + 1]
    assert s3_client.get_object(Bucket=s3_bucket, Key="ckpt.bin")["Body"].read() == whole


def test_abort_leaves_no_upload_and_no_object(s3_client: Any, s3_bucket: str) -> None:
    upload_id = s3_client.create_multipart_upload(Bucket=s3_bucket, Key="half")["UploadId"]
    s3_client.upload_part(
        Bucket=s3_bucket, Key="half", UploadId=upload_id, PartNumber=1, Body=payload(5 * MiB, 5)
    )
    listed = s3_client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", [])
    assert [u["UploadId"] for u in listed] == [upload_id]
    s3_client.abort_multipart_upload(Bucket=s3_bucket, Key="half", UploadId=upload_id)
    assert s3_client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []
    assert s3_client.list_objects_v2(Bucket=s3_bucket).get("KeyCount", 0) == 0
    with pytest.raises(ClientError) as err:
        s3_client.list_parts(Bucket=s3_bucket, Key="half", UploadId=upload_id)
    assert err.value.response["Error"]["Code"] == "NoSuchUpload"


def test_entity_too_small(s3_client: Any, s3_bucket: str) -> None:
    with pytest.raises(ClientError) as err:
        multipart_upload(s3_client, s3_bucket, "small", [payload(MiB, 6), payload(MiB, 7)])
    assert err.value.response["Error"]["Code"] == "EntityTooSmall"
    with pytest.raises(ClientError):
        s3_client.head_object(Bucket=s3_bucket, Key="small")


def test_delete_objects_with_content_md5_hook(s3_client: Any, s3_bucket: str) -> None:
    for key in ("a", "b"):
        s3_client.put_object(Bucket=s3_bucket, Key=key, Body=b"x")
    out = s3_client.delete_objects(Bucket=s3_bucket, Delete={"Objects": [{"Key": "a"}, {"Key": "b"}]})
    assert sorted(d["Key"] for d in out["Deleted"]) == ["a", "b"] and not out.get("Errors")
    assert s3_client.list_objects_v2(Bucket=s3_bucket).get("KeyCount", 0) == 0


@pytest.mark.parametrize("fast", [False, True], ids=["default-config", "fast-config"])
async def test_aiobotocore_multipart(s3_endpoint: S3Endpoint, s3_bucket: str, fast: bool) -> None:
    """aiobotocore 3.x, defaults and FAST_CLIENT_CONFIG (unsigned payload, checksums when required)."""
    cfg = Config(**FAST_CLIENT_CONFIG) if fast else Config(s3={"addressing_style": "path"})
    parts = [payload(5 * MiB, 11), payload(5 * MiB, 12), payload(2 * MiB, 13)]
    # the library's session, its S3 model read in a thread (create_client would read it on the loop)
    session = await asyncio.to_thread(warm_session)
    async with session.create_client("s3", config=cfg, **s3_endpoint.client_kwargs()) as client:
        register_s3compat(client)
        upload_id = (await client.create_multipart_upload(Bucket=s3_bucket, Key="k"))["UploadId"]
        done = []
        for n, body in enumerate(parts, start=1):
            r = await client.upload_part(
                Bucket=s3_bucket, Key="k", UploadId=upload_id, PartNumber=n, Body=body
            )
            done.append({"PartNumber": n, "ETag": r["ETag"]})
        await client.complete_multipart_upload(
            Bucket=s3_bucket, Key="k", UploadId=upload_id, MultipartUpload={"Parts": done}
        )
        got = await client.get_object(Bucket=s3_bucket, Key="k", Range=f"bytes={5 * MiB}-{10 * MiB - 1}")
        async with got["Body"] as stream:
            assert await stream.read() == parts[1]
        out = await client.delete_objects(Bucket=s3_bucket, Delete={"Objects": [{"Key": "k"}]})
        assert [d["Key"] for d in out["Deleted"]] == ["k"]

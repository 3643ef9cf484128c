"""A load compares the object's ETag with the one its save recorded, per S3 backend.

A fresh save then load must carry no "changed after the save" note (backends that learn no
ETag compare nothing); an object replaced by another client after the save is named as such,
or fails verification, with a specific message. aiobotocore and minio run here; s3dlio and
s3torchconnector in a child pytest process (see ``tests/s3_harness.py``).
"""

from __future__ import annotations

import asyncio

import pytest

from asyncckpt import AsyncCheckpointer, ChecksumMismatchError, IntegrityError, ManifestMissingError
from asyncckpt.servers.s3endpoint import S3Endpoint

from .conftest import expected_bytes
from .s3_harness import CHUNK, in_child, new_bucket, run_child_suite, s3_backends, s3_call

BACKENDS = s3_backends()
#: backends whose save and whose HEAD both learn the ETag (s3dlio's stat result is not recorded)
ETAG_BOTH_SIDES = ("aiobotocore", "minio", "s3dlio", "s3torchconnector", "obstore")


def checkpointer(backend: str, options: dict[str, object], seed: int) -> AsyncCheckpointer:
    return AsyncCheckpointer(
        chunk_size=CHUNK, num_buffers=3, backend=backend, backend_options=options, seed=seed
    )


async def put_other(server: S3Endpoint, bucket: str, key: str, body: bytes) -> None:
    """Replace the object with one plain PUT from an independent client (off the loop)."""
    await s3_call(server, "put_object", Bucket=bucket, Key=key, Body=body)


@pytest.mark.parametrize("size", [1000, 2 * CHUNK + 3], ids=["single-put", "multipart"])
@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_fresh_load_has_no_identity_note(backend: str, size: int, s3_env: S3Endpoint) -> None:
    bucket = await asyncio.to_thread(new_bucket, s3_env)
    async with checkpointer(backend, s3_env.options(), seed=3) as ckpt:
        saved = await ckpt.save(f"s3://{bucket}/f.bin", size)
        loaded = await ckpt.load(f"s3://{bucket}/f.bin", verify=True)
    assert "identity_note" not in loaded.metadata.extra, loaded.metadata.extra["identity_note"]
    if backend in ETAG_BOTH_SIDES:
        etags = [str(r.metadata.extra["etag"]).strip('"') for r in (saved, loaded)]
        assert etags[0] == etags[1] != "None", etags


@pytest.mark.parametrize("backend", BACKENDS)
async def test_an_object_replaced_after_the_save_is_judged_by_its_own_footer(
    backend: str, s3_env: S3Endpoint
) -> None:
    """The manifest travels inside the object: foreign bytes put over a checkpoint carry none
    and are refused; another checkpoint put over it is that checkpoint, verified."""
    bucket, size = await asyncio.to_thread(new_bucket, s3_env), 2 * CHUNK + 3
    uri = f"s3://{bucket}/x.bin"
    async with checkpointer(backend, s3_env.options(), seed=4) as ckpt:
        await ckpt.save(uri, size)
        await put_other(
            s3_env, bucket, "x.bin", await asyncio.to_thread(expected_bytes, size, CHUNK, 4)
        )  # the data alone
        with pytest.raises(ManifestMissingError, match="has no manifest"):
            await ckpt.load(uri, verify=True)
        await ckpt.save(f"s3://{bucket}/y.bin", size + 1)
        other = await s3_call(s3_env, "get_object", Bucket=bucket, Key="y.bin")
        await put_other(s3_env, bucket, "x.bin", await asyncio.to_thread(other["Body"].read))
        loaded = await ckpt.load(uri, verify="regenerate")
    assert loaded.size_bytes == size + 1


@pytest.mark.parametrize("backend", BACKENDS)
async def test_an_object_replaced_while_it_is_read_is_named_not_corrupt(
    backend: str, s3_env: S3Endpoint
) -> None:
    """Another client puts a different checkpoint over the key between two ranged reads of a
    load. The load says the object was replaced: it asked for the ETag its stat saw
    (``If-Match``), or, where the library cannot ask, it compares the ETag again once a
    checksum fails. Before, it read old and new bytes and called the checkpoint corrupt."""
    bucket, size = await asyncio.to_thread(new_bucket, s3_env), 6 * CHUNK
    uri = f"s3://{bucket}/moving.bin"
    async with checkpointer(backend, s3_env.options(), seed=5) as other:
        await other.save(f"s3://{bucket}/other.bin", size)
    got = await s3_call(s3_env, "get_object", Bucket=bucket, Key="other.bin")
    other_bytes = await asyncio.to_thread(got["Body"].read)
    replaced: list[int] = []
    async with checkpointer(backend, s3_env.options(), seed=4) as ckpt:
        await ckpt.save(uri, size)
        # one read at a time, three buffers: chunk 3 is read only after the first view is done
        stream = ckpt.iter_load(uri, num_readers=1)
        with pytest.raises(IntegrityError, match="replaced while it was being read") as info:
            async with stream:
                async for _ in stream:
                    if not replaced:
                        await put_other(s3_env, bucket, "moving.bin", other_bytes)
                        replaced.append(stream.offset)
        assert replaced == [0]
        assert not isinstance(info.value, ChecksumMismatchError) and uri in str(info.value)
        loaded = await ckpt.load(uri, verify=True)  # the new object, judged on its own
    assert loaded.size_bytes == size


@pytest.mark.skipif(in_child(), reason="this is the launcher of the child suite")
def test_out_of_process_backends_compare_identities_too(s3_endpoint: S3Endpoint) -> None:
    proc = run_child_suite(__file__, s3_endpoint)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-2000:]

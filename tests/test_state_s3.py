"""save_state / load_state against S3 servers (moto, Swift): multipart objects readable by safetensors."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import safetensors.torch
import torch

from asyncckpt import AsyncCheckpointer, ChecksumMismatchError
from asyncckpt.engine.chunks import CHECK_BLOCK
from asyncckpt.servers.s3endpoint import S3Endpoint

from .s3_harness import CHUNK, new_bucket


@pytest.mark.parametrize(
    ("staging", "backend"),
    # s3dlio runs in a writer process by default: a staged save goes through its shared pool
    [("none", "aiobotocore"), ("host", "aiobotocore"), ("host", "s3dlio")],
)
async def test_state_round_trip_on_s3(s3_endpoint: S3Endpoint, staging: str, backend: str) -> None:
    bucket = await asyncio.to_thread(new_bucket, s3_endpoint)
    uri = f"s3://{bucket}/step-1/rank0.safetensors"
    rng = np.random.default_rng(5)
    state = {
        "model": {"w": rng.standard_normal((1000, 1500)).astype(np.float32)},  # 6 MB: 2 parts
        "bf": torch.randn(40, 3).to(torch.bfloat16),
        "step": 1,
    }
    options = s3_endpoint.options()
    async with AsyncCheckpointer(
        chunk_size=CHUNK, num_buffers=3, backend=backend, backend_options=options
    ) as c:
        handle = await c.save_state(uri, state, staging=staging)
        saved = await handle if staging == "host" else handle
        assert saved.save.chunks == 2
        # in process, a staged object is written from the staging area itself
        assert saved.save.method == (
            "preallocated" if (staging, backend) == ("host", "aiobotocore") else "streaming"
        )
        loaded = await c.load_state(uri, as_torch=True)
    assert loaded.verified and loaded.state["step"] == 1
    assert torch.equal(loaded.state["model"]["w"], torch.from_numpy(state["model"]["w"]))
    assert torch.equal(loaded.state["bf"], state["bf"])
    # the object as S3 holds it is a plain safetensors file
    body = await asyncio.to_thread(
        lambda: s3_endpoint.client().get_object(Bucket=bucket, Key="step-1/rank0.safetensors")["Body"].read()
    )
    plain = safetensors.torch.load(body)
    assert (
        torch.equal(plain["bf"], state["bf"])
        and plain["model.w"].numpy().tobytes() == state["model"]["w"].tobytes()
    )


async def test_corrupt_object_on_s3_is_detected(moto_endpoint: S3Endpoint) -> None:
    bucket = await asyncio.to_thread(new_bucket, moto_endpoint)
    client = moto_endpoint.client()
    state = {"w": np.arange(2_000_000, dtype=np.float32)}
    async with AsyncCheckpointer(
        chunk_size=CHUNK, num_buffers=3, backend="aiobotocore", backend_options=moto_endpoint.options()
    ) as c:
        await c.save_state(f"s3://{bucket}/s.safetensors", state)
        body = bytearray(
            await asyncio.to_thread(
                lambda: client.get_object(Bucket=bucket, Key="s.safetensors")["Body"].read()
            )
        )
        body[-1] ^= 0xFF
        await asyncio.to_thread(client.put_object, Bucket=bucket, Key="s.safetensors", Body=bytes(body))
        last = (len(body) - 1) // CHECK_BLOCK  # the 256 KiB checksum block holding the last byte
        with pytest.raises(ChecksumMismatchError, match=f"corrupt in chunk {last} of {last + 1}"):
            await c.load_state(f"s3://{bucket}/s.safetensors")

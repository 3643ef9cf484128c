"""One store per backend: every object of a checkpointer shares one client.

The first version built a client (and its connection pool) for every sink: three per save.
A relay in front of Swift (which keeps connections alive; moto closes each) counts the TCP
connections the clients open: ten saves and ten loads through one checkpointer reuse the
store's pooled connections (at most a window's worth); one client per object opened 30.
"""

from __future__ import annotations

import asyncio

import pytest

from asyncckpt import AsyncCheckpointer
from asyncckpt.servers.s3endpoint import S3Endpoint
from asyncckpt.sinks import backend_class

from .relay import counting
from .s3_harness import CHUNK, in_child, new_bucket

pytestmark = [
    pytest.mark.realstore,
    pytest.mark.skipif(in_child(), reason="runs in the parent test process only"),
]

ROUNDS = 10


@pytest.mark.parametrize("backend", ["aiobotocore", "minio"])
async def test_ten_saves_and_loads_share_one_client(swift_endpoint: S3Endpoint, backend: str) -> None:
    bucket = await asyncio.to_thread(new_bucket, swift_endpoint)
    async with counting(swift_endpoint.endpoint) as (front, url):
        options = swift_endpoint.options(endpoint_url=url)
        async with AsyncCheckpointer(
            chunk_size=CHUNK, num_buffers=3, backend=backend, backend_options=options
        ) as c:
            for i in range(ROUNDS):
                await c.save(f"s3://{bucket}/c{i}.bin", 2 * CHUNK)
                await c.load(f"s3://{bucket}/c{i}.bin")
    window = backend_class(backend).default_in_flight
    # a client keeps its connections: at most a window's worth (+ one for control requests)
    assert front.connections <= window + 2, f"{front.connections} connections for {2 * ROUNDS} objects"

"""``s3://`` with default options: the design's defaults, checked at a real server.

Two defects of the first version: the URI resolved to the name ``s3``, which the isolation
policy did not isolate, and the factory then chose s3dlio anyway (its Tokio runtime inside the
caller); and an isolated writer took its window from the factory function (1 part) instead of
the backend class. A relay before moto counts the parts the server receives at once.
"""

from __future__ import annotations

import asyncio

import pytest

from asyncckpt import AsyncCheckpointer
from asyncckpt.servers.s3endpoint import S3Endpoint
from asyncckpt.sinks import resolve_backend
from asyncckpt.sinks.isolation import resolve_policy
from asyncckpt.sinks.s3 import installed

from .relay import counting
from .s3_harness import CHUNK, in_child, new_bucket

pytestmark = [
    pytest.mark.skipif(in_child(), reason="runs in the parent test process only"),
    pytest.mark.skipif(not installed("s3dlio"), reason="s3dlio is not installed"),
]


def test_s3_uri_resolves_to_the_library_that_will_run_before_isolation_is_decided() -> None:
    name = resolve_backend("s3://bucket/key")
    assert name == "s3dlio"
    assert resolve_policy(name, isolation="auto").isolation == "process"


@pytest.mark.parametrize("backend", [None, "s3dlio"], ids=["s3-scheme-default", "s3dlio-named"])
async def test_default_s3_save_is_isolated_and_keeps_several_parts_in_flight(
    moto_endpoint: S3Endpoint, backend: str | None
) -> None:
    bucket = await asyncio.to_thread(new_bucket, moto_endpoint)
    # the first part waits for a second (up to 60 s): whether the save keeps several parts in
    # flight, not whether it happened to on a loaded machine (generation slower than moto)
    async with counting(moto_endpoint.endpoint, wait_for_second_s=60.0) as (front, url):
        options = moto_endpoint.options(endpoint_url=url)
        async with AsyncCheckpointer(
            chunk_size=CHUNK, num_buffers=4, backend=backend, backend_options=options
        ) as c:
            result = await c.save(f"s3://{bucket}/defaults.bin", 6 * CHUNK)
    assert result.metadata.backend == "s3dlio"
    assert result.metadata.extra["isolation"] == "process", result.metadata.extra
    assert result.metadata.max_in_flight > 1
    assert len(front.matched) == 7, front.matched  # 6 full chunks, then the sealed manifest
    assert front.peak > 1, f"the server never received two parts at once ({front.matched})"

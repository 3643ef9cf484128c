"""A server that stops answering mid-part (issue 13 item 3): every S3 backend, in-process and
isolated, fails the save with StallError within the watchdog's deadline and publishes nothing.

The relay in front of moto forwards a part and a half of request bytes, then nothing either
way, without closing anything (what a SIGSTOPped server looks like). Before the watchdog, the
same save waited for each library's own timeouts and retries: minutes.
s3dlio and s3torchconnector run in child pytest processes (s3dlio: one endpoint per process).
"""

from __future__ import annotations

import asyncio
import time

import pytest

from asyncckpt import AsyncCheckpointer, StallError, StorageError
from asyncckpt.servers.s3endpoint import S3Endpoint
from asyncckpt.sinks.s3 import sink_class

from .s3_harness import CHUNK, S3_IN_PROCESS, in_child, new_bucket, run_child_suite, s3_call
from .s3_server import TcpProxy

STALL_S = 2.0
#: watchdog + the abort's share, plus room for a busy 2-core machine
DEADLINE_S = 1.5 * STALL_S + 4.0
CASES = (
    [
        ("s3dlio", "process"),
        ("s3dlio", "none"),
        ("s3torchconnector", "none"),
        ("obstore", "none"),
        ("obstore", "process"),
    ]
    if in_child()
    else [("aiobotocore", "none"), ("minio", "none"), ("aiobotocore", "process")]
)

if not in_child():  # importing a client library takes ~0.2 s: not inside a timed loop callback
    for _name in S3_IN_PROCESS:
        sink_class(_name)


async def visible(ep: S3Endpoint, bucket: str) -> list[str]:
    listing = await s3_call(ep, "list_objects_v2", Bucket=bucket)
    return [o["Key"] for o in listing.get("Contents", [])]


@pytest.mark.parametrize(("backend", "isolation"), CASES, ids=["-".join(c) for c in CASES])
async def test_stall_mid_part_fails_within_deadline(
    backend: str, isolation: str, moto_endpoint: S3Endpoint
) -> None:
    ep = moto_endpoint
    bucket = await asyncio.to_thread(new_bucket, ep)
    proxy = TcpProxy(ep.endpoint, stall_after=CHUNK + CHUNK // 2)
    options = ep.options(endpoint_url=proxy.endpoint, request_timeout=60.0)  # the watchdog, not the client
    stalled_at = None
    try:
        async with AsyncCheckpointer(
            chunk_size=CHUNK,
            num_buffers=3,
            backend=backend,
            isolation=isolation,
            backend_options=options,
            stall_timeout=STALL_S,
        ) as ckpt:
            with pytest.raises(StallError) as info:
                await ckpt.save(f"s3://{bucket}/stall.bin", 8 * CHUNK)
            assert proxy.stalled.is_set()
            stalled_at = time.monotonic()
    finally:
        await asyncio.to_thread(proxy.cut)  # stuck library threads get a reset and finish
    assert stalled_at is not None
    text = str(info.value)
    assert "stall.bin" in text and "stall_timeout=2 s" in text, text
    assert info.value.stage.startswith(("open", "write part", "delete", "complete")), text
    if backend in ("aiobotocore", "minio"):  # one request per part: the stuck part is named
        assert info.value.stage.startswith("write part"), text
    assert await visible(ep, bucket) == []


async def test_stall_duration_is_bounded(moto_endpoint: S3Endpoint) -> None:
    """The whole save, abort included, is over within 1.5 x stall_timeout of the stall."""
    if in_child():
        pytest.skip("aiobotocore runs in the parent process")
    ep = moto_endpoint
    bucket = await asyncio.to_thread(new_bucket, ep)
    proxy = TcpProxy(ep.endpoint, stall_after=CHUNK + CHUNK // 2)
    options = ep.options(endpoint_url=proxy.endpoint)  # default request timeout and retries
    try:
        async with AsyncCheckpointer(
            chunk_size=CHUNK,
            num_buffers=3,
            backend="aiobotocore",
            backend_options=options,
            stall_timeout=STALL_S,
        ) as ckpt:
            task = asyncio.create_task(ckpt.save(f"s3://{bucket}/b.bin", 8 * CHUNK))
            await asyncio.to_thread(proxy.stalled.wait, 30)
            started = time.monotonic()
            with pytest.raises(StallError):
                await task
            took = time.monotonic() - started
    finally:
        await asyncio.to_thread(proxy.cut)
    assert took < DEADLINE_S, f"{took:.1f} s after the stall"
    assert await visible(ep, bucket) == []


@pytest.mark.skipif(in_child(), reason="this is the launcher of the child suites")
def test_out_of_process_backends_stall_the_same_way(moto_endpoint: S3Endpoint) -> None:
    # s3dlio fixes its endpoint once per process: the in-process s3dlio case gets its own
    for selection in ("stall_mid_part and not s3dlio-none", "stall_mid_part and s3dlio-none"):
        proc = run_child_suite(__file__, moto_endpoint, selection)
        assert proc.returncode == 0, selection + "\n" + proc.stdout[-4000:] + proc.stderr[-2000:]
        assert " passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-2000:]


@pytest.mark.parametrize("backend", ["aiobotocore", "minio"])
async def test_request_timeout_bounds_one_request(backend: str, moto_endpoint: S3Endpoint) -> None:
    """With a generous watchdog, the library's own request timeout ends the stuck request."""
    if in_child():
        pytest.skip("runs in the parent process")
    ep = moto_endpoint
    bucket = await asyncio.to_thread(new_bucket, ep)
    proxy = TcpProxy(ep.endpoint, stall_after=CHUNK + CHUNK // 2)
    options = ep.options(endpoint_url=proxy.endpoint, request_timeout=1.0, max_attempts=1)
    try:
        async with AsyncCheckpointer(
            chunk_size=CHUNK, num_buffers=3, backend=backend, backend_options=options, stall_timeout=60.0
        ) as ckpt:
            started = time.monotonic()
            with pytest.raises(StorageError) as info:
                await ckpt.save(f"s3://{bucket}/t.bin", 8 * CHUNK)
            took = time.monotonic() - started
    finally:
        await asyncio.to_thread(proxy.cut)
    assert not isinstance(info.value, StallError), info.value
    assert took < 15, f"{took:.1f} s"
    assert await visible(ep, bucket) == []

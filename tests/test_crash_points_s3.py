"""The crash-point invariant on S3 (moto and OpenStack Swift): a real save of B over a
checkpoint A, SIGKILLed as its relay sees a chosen request (the upload's creation, a part, the
completion before the server gets it, the completion while it is on its way) or at fixed-seed
instants, leaves A or B loadable and verified. The dead save's pending upload is what
``cleanup --older-than`` removes."""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from asyncckpt import AsyncCheckpointer, ChecksumMismatchError, ManifestMissingError
from asyncckpt.servers.s3endpoint import S3Endpoint
from asyncckpt.sinks.leftovers import find, remove
from asyncckpt.units import MiB

from .cancel_points import cancel_everywhere
from .conftest import ROOT, save_span
from .relay import FaultyFront, is_create, is_part_2
from .s3_harness import in_child, new_bucket

pytestmark = pytest.mark.skipif(in_child(), reason="runs in the parent test process only")

CHILD = ROOT / "tests" / "crash_child.py"
CHUNK = 5 * MiB
SIZE_A, SEED_A = 2 * CHUNK + 77, 1
SIZE_B, SEED_B = 3 * CHUNK + 1234, 2
#: random kill instants (half the file count: each S3 kill costs more); stress runs 50
INSTANTS = int(os.environ.get("CRASH_INSTANTS", "5"))


def is_complete(line: str) -> bool:
    return line.startswith("POST ") and "uploadId=" in line.split()[1]


def child(uri: str, options: dict[str, object]) -> subprocess.Popen[str]:
    args = [uri, str(SIZE_B), str(SEED_B), "none", "0", str(CHUNK), json.dumps(options)]
    return subprocess.Popen(
        [sys.executable, str(CHILD), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def ckpt(ep: S3Endpoint, seed: int = 0) -> AsyncCheckpointer:
    return AsyncCheckpointer(
        chunk_size=CHUNK, num_buffers=3, seed=seed, backend="aiobotocore", backend_options=ep.options()
    )


async def version(ep: S3Endpoint, uri: str) -> str:
    async with ckpt(ep) as c:
        r = await c.load(uri, verify="regenerate")
    return {(SIZE_A, SEED_A): "A", (SIZE_B, SEED_B): "B"}[(r.size_bytes, r.metadata.seed)]


async def settled_version(ep: S3Endpoint, uri: str) -> str:
    """:func:`version`, strict on Swift. moto publishes a completion non-atomically (see the
    complete-in-flight case): a kill that lands while it assembles B shows a tail it has not
    written yet, for a moment. On moto only, that state is polled until it settles (bounded)."""
    deadline = time.monotonic() + 10.0
    while True:
        try:
            return await version(ep, uri)
        except (ManifestMissingError, ChecksumMismatchError):
            if ep.kind != "moto" or time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.2)  # polling moto's state, bounded by the deadline


async def save_a(ep: S3Endpoint, uri: str) -> None:
    async with ckpt(ep, SEED_A) as c:
        await c.save(uri, SIZE_A)


async def killed_at(
    ep: S3Endpoint, uri: str, mode: str, match: Callable[[str], bool]
) -> subprocess.CompletedProcess[str] | None:
    """Run the child through a relay that kills it as ``match`` first sees a request."""
    proc: list[subprocess.Popen[str]] = []
    front = FaultyFront(ep.endpoint, mode, match, times=1, on_spoil=lambda: proc[0].kill())
    url = await front.start()
    try:
        proc.append(child(uri, ep.options(endpoint_url=url)))
        out, err = await asyncio.to_thread(proc[0].communicate, timeout=60)
    finally:
        await front.stop()
    assert front.spoiled, (out, err)
    assert proc[0].returncode == -9, (out, err)
    return None


@pytest.mark.parametrize(
    ("mode", "match", "expect"),
    [
        ("hold", is_create, {"A"}),
        ("hold", is_part_2, {"A"}),
        ("hold", is_complete, {"A"}),  # killed with everything uploaded, not yet published
        ("short", is_complete, {"A", "B"}),  # the completion on its way as the process dies
    ],
    ids=["create", "part-2", "before-complete", "complete-in-flight"],
)
async def test_sigkill_at_each_request_leaves_old_or_new(
    s3_endpoint: S3Endpoint, mode: str, match: Callable[[str], bool], expect: set[str]
) -> None:
    if s3_endpoint.kind == "moto" and expect == {"A", "B"}:
        # measured: right after such a kill moto's HEAD already gives B's size while a GET of
        # the tail still returns bytes it has not assembled (seconds later it reads B, verified):
        # moto publishes a completed upload non-atomically. AWS and Swift do not.
        pytest.skip("moto's CompleteMultipartUpload is not atomic; the case runs on Swift")
    bucket = await asyncio.to_thread(new_bucket, s3_endpoint)
    uri = f"s3://{bucket}/run/ck.bin"
    await save_a(s3_endpoint, uri)
    await killed_at(s3_endpoint, uri, mode, match)
    assert await version(s3_endpoint, uri) in expect
    prefix = f"s3://{bucket}/run/"
    pending = await find(prefix, 0.0, s3_endpoint.options())
    assert len(pending) <= 1
    await remove(pending, prefix, s3_endpoint.options())
    assert await find(prefix, 0.0, s3_endpoint.options()) == []


async def test_sigkill_at_random_instants_leaves_old_or_new(s3_endpoint: S3Endpoint) -> None:
    bucket = await asyncio.to_thread(new_bucket, s3_endpoint)
    uri = f"s3://{bucket}/ck.bin"
    await save_a(s3_endpoint, uri)
    span = await save_span(child(uri, s3_endpoint.options()))  # calibrate
    for delay in random.Random(4321).sample(range(1000), INSTANTS):
        await save_a(s3_endpoint, uri)
        proc = child(uri, s3_endpoint.options())
        assert proc.stdout is not None
        await asyncio.to_thread(proc.stdout.readline)
        await asyncio.sleep(span * delay / 1000)  # the chosen instant (not a synchronisation)
        proc.kill()
        await asyncio.to_thread(proc.communicate, timeout=60)
        assert await settled_version(s3_endpoint, uri) in {"A", "B"}


async def test_cancellation_at_every_point_says_what_was_published(s3_endpoint: S3Endpoint) -> None:
    """Cancel an S3 save after k loop iterations, for k spread over the whole save: a save
    that raised says whether it published, and what loads agrees."""
    bucket = await asyncio.to_thread(new_bucket, s3_endpoint)
    uri = f"s3://{bucket}/ck.bin"
    async with ckpt(s3_endpoint, SEED_B) as c:
        await c.save(uri, SIZE_A)  # warm the client and pool
        outcomes = await cancel_everywhere(
            lambda: c.save(uri, SIZE_B),
            lambda: save_a(s3_endpoint, uri),
            lambda: version(s3_endpoint, uri),
            points=12,
        )
    assert outcomes == {True, False}  # both sides of the commit were hit

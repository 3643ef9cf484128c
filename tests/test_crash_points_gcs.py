"""The crash-point invariant on Google Cloud Storage (fake-gcs-server): a real save of B over a
checkpoint A, in a child process SIGKILLed as its relay sees a chosen request (the first chunk,
the final chunk before the store gets it, the final chunk while it is on its way), leaves A or B
loadable and verified, never a mix. GCS's commit is the final chunk of the resumable upload:
before it B does not exist; the session of a killed save expires by itself (docs/azure-gcs.md).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from typing import Any

import pytest

from asyncckpt import AsyncCheckpointer
from asyncckpt.servers.gcs_emulator import GcsEndpoint
from asyncckpt.units import MiB

from .conftest import ROOT
from .relay import FaultyFront

CHILD = ROOT / "tests" / "crash_child.py"
CHUNK = 1 * MiB  # small objects: the emulator's resumable path is slow
SIZE_A, SEED_A = 2 * CHUNK + 77, 1
SIZE_B, SEED_B = 3 * CHUNK + 1234, 2  # with its sealed manifest: 3 full chunks and a final one
TOKEN = "crash-test-token-never-in-argv"


class NthChunk:
    """Matches the n-th chunk PUT of the session (the relay asks once per request)."""

    def __init__(self, n: int) -> None:
        self.n, self.seen = n, 0

    def __call__(self, line: str) -> bool:
        if not (line.startswith("PUT ") and "upload_id=" in line):
            return False
        self.seen += 1
        return self.seen == self.n


def options(endpoint_url: str) -> dict[str, Any]:
    return {"endpoint_url": endpoint_url, "max_attempts": 1}


def ckpt(ep: GcsEndpoint, seed: int = 0) -> AsyncCheckpointer:
    return AsyncCheckpointer(chunk_size=CHUNK, num_buffers=3, seed=seed, backend_options=options(ep.url))


def child(uri: str, endpoint_url: str) -> subprocess.Popen[str]:
    """The save of B through the relay; the token reaches it in the environment, never argv."""
    args = [uri, str(SIZE_B), str(SEED_B), "none", "0", str(CHUNK), json.dumps(options(endpoint_url))]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GOOGLE_OAUTH_ACCESS_TOKEN": TOKEN}
    argv = [sys.executable, str(CHILD), *args]
    assert not any(TOKEN in a for a in argv)
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


async def version(ep: GcsEndpoint, uri: str) -> str:
    async with ckpt(ep) as c:
        r = await c.load(uri, verify="regenerate")
    return {(SIZE_A, SEED_A): "A", (SIZE_B, SEED_B): "B"}[(r.size_bytes, r.metadata.seed)]


@pytest.mark.parametrize(
    ("mode", "nth", "expect"),
    [
        ("hold", 1, {"A"}),
        ("hold", 4, {"A"}),  # every other chunk up, the object not there
        ("short", 4, {"A", "B"}),  # the commit on its way as the process dies
    ],
    ids=["first-chunk", "before-final-chunk", "final-chunk-in-flight"],
)
async def test_sigkill_at_each_request_leaves_old_or_new(
    gcs_endpoint: GcsEndpoint, gcs_bucket: str, mode: str, nth: int, expect: set[str]
) -> None:
    ep, uri = gcs_endpoint, f"gs://{gcs_bucket}/run/ck.bin"
    async with ckpt(ep, SEED_A) as c:
        await c.save(uri, SIZE_A)
    proc: list[subprocess.Popen[str]] = []
    match = NthChunk(nth)
    front = FaultyFront(ep.url, mode, match, times=1, on_spoil=lambda: proc[0].kill())
    relay = await front.start()
    try:
        proc.append(child(uri, relay))
        out, err = await asyncio.to_thread(proc[0].communicate, timeout=60)
    finally:
        await front.stop()
    assert front.spoiled, (out, err, front.matched)
    assert proc[0].returncode == -9, (out, err)
    assert match.seen == nth  # the chunks before it went through, one after the other
    final = re.search(r"content-range: bytes \d+-\d+/(\d+)\r\n", front.heads[0].lower())
    assert (final is not None) == (nth == 4), front.heads[0]  # the 4th is the final chunk (the total)
    assert await version(ep, uri) in expect
    assert all(f"authorization: bearer {TOKEN}" in head.lower() for head in front.heads)  # as a header

"""The crash-point invariant on Azure Blob (Azurite): a real save of B over a checkpoint A, in a
child process SIGKILLed as its relay sees a chosen request (the first block, the block list
before Azurite gets it, the block list while it is on its way), leaves A or B loadable and
verified. Azure's commit is the one Put Block List: before it B does not exist; its blocks stay
uncommitted and Azure discards them (docs/azure-gcs.md)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from asyncckpt import AsyncCheckpointer
from asyncckpt.servers.azurite import AzureEndpoint
from asyncckpt.units import MiB

from .conftest import ROOT
from .relay import FaultyFront

CHILD = ROOT / "tests" / "crash_child.py"
CHUNK = 5 * MiB
SIZE_A, SEED_A = 2 * CHUNK + 77, 1
SIZE_B, SEED_B = 3 * CHUNK + 1234, 2


def is_block(line: str) -> bool:
    return line.startswith("PUT ") and "comp=block&" in line.split()[1] + "&"


def is_block_list(line: str) -> bool:
    return line.startswith("PUT ") and "comp=blocklist" in line.split()[1]


def options(ep: AzureEndpoint, endpoint_url: str | None = None) -> dict[str, Any]:
    return {"account": ep.account, "endpoint_url": endpoint_url or ep.account_url, "max_attempts": 1}


def ckpt(ep: AzureEndpoint, seed: int = 0) -> AsyncCheckpointer:
    opts = {**options(ep), "account_key": ep.key}
    return AsyncCheckpointer(chunk_size=CHUNK, num_buffers=3, seed=seed, backend_options=opts)


def child(ep: AzureEndpoint, uri: str, endpoint_url: str) -> subprocess.Popen[str]:
    """The save of B through the relay; the key reaches it in the environment, never argv."""
    args = [uri, str(SIZE_B), str(SEED_B), "none", "0", str(CHUNK), json.dumps(options(ep, endpoint_url))]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AZURE_STORAGE_KEY": ep.key.reveal()}
    argv = [sys.executable, str(CHILD), *args]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


async def version(ep: AzureEndpoint, uri: str) -> str:
    async with ckpt(ep) as c:
        r = await c.load(uri, verify="regenerate")
    return {(SIZE_A, SEED_A): "A", (SIZE_B, SEED_B): "B"}[(r.size_bytes, r.metadata.seed)]


@pytest.mark.parametrize(
    ("mode", "match", "expect"),
    [
        ("hold", is_block, {"A"}),
        ("hold", is_block_list, {"A"}),  # every block up, not committed
        ("short", is_block_list, {"A", "B"}),  # the commit on its way as the process dies
    ],
    ids=["first-block", "before-block-list", "block-list-in-flight"],
)
async def test_sigkill_at_each_request_leaves_old_or_new(
    azurite_endpoint: AzureEndpoint,
    az_container: str,
    mode: str,
    match: Callable[[str], bool],
    expect: set[str],
) -> None:
    ep, uri = azurite_endpoint, f"az://{az_container}/run/ck.bin"
    async with ckpt(ep, SEED_A) as c:
        await c.save(uri, SIZE_A)
    proc: list[subprocess.Popen[str]] = []
    front = FaultyFront(ep.blob_url, mode, match, times=1, on_spoil=lambda: proc[0].kill())
    relay = await front.start()
    try:
        proc.append(child(ep, uri, f"{relay}/{ep.account}"))
        out, err = await asyncio.to_thread(proc[0].communicate, timeout=60)
    finally:
        await front.stop()
    assert front.spoiled, (out, err)
    assert proc[0].returncode == -9, (out, err)
    assert await version(ep, uri) in expect

"""Tiered crash points with moto (and Swift where installed) as the remote: a real child SIGKILLed
as its relay sees a chosen request of step 2's drain (a part of its object's upload, the PUT of
the remote commit record). After each kill a new manager restores step 2 from the local tier,
no remote commit record names an incomplete object, and the drain resumes to a remote commit.
The dead drain's multipart upload is removed by the owner rule when the drain resumes: the
drain records its process (``rank-<r>-of-<w>.draining.json``) before it uploads."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from asyncckpt import CheckpointManager
from asyncckpt.servers.s3endpoint import S3Endpoint
from asyncckpt.sinks.leftovers import find

from .conftest import ROOT
from .relay import FaultyFront, is_part_2
from .s3_harness import CHUNK, in_child, new_bucket
from .tiers_child import state_of

pytestmark = pytest.mark.skipif(in_child(), reason="runs in the parent test process only")
OBJECT = "step-2/rank-0-of-1.safetensors"


def part_2_of_step_2(line: str) -> bool:
    return is_part_2(line) and OBJECT in line


def remote_commit_of_step_2(line: str) -> bool:
    return line.startswith("PUT ") and "step-2/COMMITTED.json" in line


def keys(ep: S3Endpoint, bucket: str) -> dict[str, int]:
    found = ep.client().list_objects_v2(Bucket=bucket, Prefix="run/").get("Contents", [])
    return {o["Key"].removeprefix("run/"): o["Size"] for o in found}


def committed_remotely(ep: S3Endpoint, bucket: str) -> list[int]:
    """Remote steps with a commit record, each record naming objects that are all there."""
    listing = keys(ep, bucket)
    steps = []
    for key in [k for k in listing if k.endswith("/COMMITTED.json")]:
        body = ep.client().get_object(Bucket=bucket, Key=f"run/{key}")["Body"].read()
        record = json.loads(body)
        step_dir = key.rsplit("/", 1)[0]
        for name, size in zip(record["objects"], record["sizes"], strict=True):
            assert listing.get(f"{step_dir}/{name}") == size, (key, listing)
        steps.append(record["step"])
    return sorted(steps)


@pytest.mark.parametrize(
    "match", [part_2_of_step_2, remote_commit_of_step_2], ids=["mid-drain", "before-remote-commit"]
)
async def test_a_kill_during_an_s3_drain_restores_locally_and_resumes(
    s3_endpoint: S3Endpoint, tmp_path: Path, match: Callable[[str], bool]
) -> None:
    bucket = await asyncio.to_thread(new_bucket, s3_endpoint)
    remote = f"s3://{bucket}/run"
    local = tmp_path / "local"
    local.mkdir()
    proc: list[subprocess.Popen[str]] = []
    front = FaultyFront(s3_endpoint.endpoint, "hold", match, times=1, on_spoil=lambda: proc[0].kill())
    url = await front.start()
    try:
        options = json.dumps(s3_endpoint.options(endpoint_url=url))
        cmd = [sys.executable, "-m", "tests.tiers_child", str(local), remote, "none", "1", options]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        popen = functools.partial(subprocess.Popen, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        proc.append(await asyncio.to_thread(popen, cmd, env=env, cwd=ROOT))
        out, err = await asyncio.to_thread(proc[0].communicate, timeout=120)
    finally:
        await front.stop()
    assert front.spoiled and proc[0].returncode == -9, (out, err[-2000:])
    assert await asyncio.to_thread(committed_remotely, s3_endpoint, bucket) == [1]
    options_ = {
        "chunk_size": CHUNK,
        "num_buffers": 4,
        "backend_options": s3_endpoint.options(),
    }
    into = await asyncio.to_thread(state_of, 0)
    async with CheckpointManager(remote, local=local, keep_local=3, **options_) as mgr:
        assert await mgr.restore(into=into) == 2  # committed locally before the kill
        await mgr.wait()  # its drain resumes
    assert np.array_equal(into["model"]["w"], (await asyncio.to_thread(state_of, 2))["model"]["w"])
    assert mgr.stats.tiers is not None and mgr.stats.tiers.resumed == [2]
    assert await asyncio.to_thread(committed_remotely, s3_endpoint, bucket) == [1, 2]
    # the dead drain's pending upload (mid-drain) was removed by the owner rule: its
    # .draining.json names a process of this host and boot that is gone
    assert await find(f"s3://{bucket}/run/", 0.0, s3_endpoint.options()) == []
    assert len(mgr.stats.tiers.collected) == (1 if match is part_2_of_step_2 else 0)

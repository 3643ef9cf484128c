"""Tiered checkpoints with an S3 remote (moto, and Swift where installed): multipart drains,
the remote commit, node loss restored from S3, and an outage or a stall of the store during a
drain."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np

from asyncckpt import AsyncCheckpointer, CheckpointManager
from asyncckpt.servers.s3endpoint import S3Endpoint

from .relay import FaultyFront
from .s3_harness import CHUNK, new_bucket

OBJECT = "rank-0-of-1.safetensors"


def state_of(step: int) -> dict[str, Any]:
    return {"model": {"w": np.arange(2_000_000, dtype=np.float32) + step}, "step": step}  # 8 MB: 2 parts


def keys(ep: S3Endpoint, bucket: str) -> list[str]:
    found = ep.client().list_objects_v2(Bucket=bucket, Prefix="run/").get("Contents", [])
    return sorted(o["Key"].removeprefix("run/") for o in found)


def options_for(ep: S3Endpoint, **extra: Any) -> dict[str, Any]:
    return {"chunk_size": CHUNK, "num_buffers": 4, "backend_options": ep.options(**extra)}


async def test_steps_drain_to_s3_and_a_lost_node_restores_from_it(s3_env: S3Endpoint, tmp_path: Path) -> None:
    bucket = await asyncio.to_thread(new_bucket, s3_env)
    remote = f"s3://{bucket}/run"
    local = tmp_path / "local"
    local.mkdir()
    options = options_for(s3_env)
    async with CheckpointManager(remote, local=local, keep_last=1, keep_local=1, **options) as mgr:
        for step in (1, 2):
            await mgr.maybe_save(step, await asyncio.to_thread(state_of, step))
            await mgr.wait()
    tiers = mgr.stats.tiers
    assert tiers is not None and tiers.remote_committed == [1, 2] and tiers.remote_deleted == [1]
    assert await asyncio.to_thread(keys, s3_env, bucket) == [
        "step-2/COMMITTED.json",
        "step-2/asyncckpt-index.json",  # the indexes: copied before the remote commit
        "step-2/model.safetensors.index.json",
        "step-2/rank-0-of-1.drained.json",
        "step-2/rank-0-of-1.draining.json",
        f"step-2/{OBJECT}",
    ]
    async with AsyncCheckpointer(**options) as ckpt:  # the drained object verifies on its own
        loaded = await ckpt.load_state(f"{remote}/step-2/{OBJECT}")
    assert loaded.verified and loaded.state["step"] == 2
    for path in sorted(local.rglob("*"), reverse=True):  # the node is lost
        path.rmdir() if path.is_dir() else path.unlink()
    into = await asyncio.to_thread(state_of, 0)
    async with CheckpointManager(remote, local=local, **options) as mgr:
        assert await mgr.restore(into=into) == 2
    assert np.array_equal(into["model"]["w"], (await asyncio.to_thread(state_of, 2))["model"]["w"])
    assert mgr.stats.tiers is not None and mgr.stats.tiers.restored_from is not None
    assert mgr.stats.tiers.restored_from[0] == "remote"


async def test_an_s3_outage_keeps_steps_local_reports_once_and_retries(
    moto_endpoint: S3Endpoint, tmp_path: Path
) -> None:
    bucket = await asyncio.to_thread(new_bucket, moto_endpoint)
    front = FaultyFront(
        moto_endpoint.endpoint, "deny", lambda line: line.startswith(("PUT ", "POST ")), times=10**6
    )
    endpoint = await front.start()
    local = tmp_path / "local"
    local.mkdir()
    ep = moto_endpoint
    options = {
        "chunk_size": CHUNK,
        "num_buffers": 4,
        "backend": None,
        "backend_options": ep.options(endpoint_url=endpoint),
    }
    try:
        async with CheckpointManager(
            f"s3://{bucket}/run", local=local, raise_on_failure=False, **options
        ) as mgr:
            await mgr.maybe_save(1, await asyncio.to_thread(state_of, 1))
            await mgr.wait()  # training goes on: the step is committed locally only
            tiers = mgr.stats.tiers
            assert tiers is not None and mgr.stats.saved == [1]
            assert [s for s, _ in tiers.drain_failures] == [1] and tiers.steps[1].state == "failed"
            assert (
                "AccessDenied" in tiers.drain_failures[0][1] or "Access Denied" in tiers.drain_failures[0][1]
            )
            front.left = 0  # the store is back
            await mgr.maybe_save(2, await asyncio.to_thread(state_of, 2))
            await mgr.wait()
    finally:
        await front.stop()
    assert tiers.remote_committed == [1, 2] and len(tiers.drain_failures) == 1
    assert "step-1/COMMITTED.json" in await asyncio.to_thread(keys, ep, bucket)


async def test_an_s3_stall_during_a_drain_keeps_the_step_local_and_is_retried(
    moto_endpoint: S3Endpoint, tmp_path: Path
) -> None:
    bucket = await asyncio.to_thread(new_bucket, moto_endpoint)
    # no upload request of step 1's object is answered: the store stalls (retries too)
    stalls = lambda line: line.startswith(("PUT ", "POST ")) and f"step-1/{OBJECT}" in line  # noqa: E731
    front = FaultyFront(moto_endpoint.endpoint, "hold", stalls, times=10**6)
    endpoint = await front.start()
    local = tmp_path / "local"
    local.mkdir()
    options = {
        "chunk_size": CHUNK,
        "num_buffers": 4,
        "stall_timeout": 2.0,
        "backend_options": moto_endpoint.options(endpoint_url=endpoint),
    }
    try:
        async with CheckpointManager(
            f"s3://{bucket}/run", local=local, raise_on_failure=False, **options
        ) as mgr:
            await mgr.maybe_save(1, await asyncio.to_thread(state_of, 1))
            await mgr.wait()  # the drain gave up after stall_timeout; the step is committed locally
            tiers = mgr.stats.tiers
            assert tiers is not None and mgr.stats.saved == [1] and front.spoiled
            # the first cause: the stall watchdog's StallError after stall_timeout, or s3dlio's own
            # error on the held connection when that comes first (both seen on this machine)
            assert [s for s, _ in tiers.drain_failures] == [1]
            cause = tiers.drain_failures[0][1]
            assert "StallError" in cause or "step-1/rank-0-of-1.safetensors" in cause, cause
            front.left = 0  # the store answers again: step 1 is retried first, after step 2's commit
            await mgr.maybe_save(2, await asyncio.to_thread(state_of, 2))
            await mgr.wait()
    finally:
        await front.stop()
    assert tiers.remote_committed == [1, 2] and len(tiers.drain_failures) == 1


async def test_a_remote_listing_that_fails_during_retention_is_recorded(
    moto_endpoint: S3Endpoint, tmp_path: Path
) -> None:
    """Remote retention lists the remote after each remote commit; a listing the store refused
    ended the remote-commit task with nobody reading it: nothing in stats.tiers, nothing logged."""
    bucket = await asyncio.to_thread(new_bucket, moto_endpoint)
    front = FaultyFront(moto_endpoint.endpoint, "deny", lambda line: False, times=1000)
    url = await front.start()
    options: dict[str, Any] = {"chunk_size": CHUNK, "num_buffers": 4, "backend": "aiobotocore"}
    options["backend_options"] = moto_endpoint.options(endpoint_url=url)
    local = tmp_path / "local"
    local.mkdir()
    try:
        async with CheckpointManager(f"s3://{bucket}/run", local=local, keep_last=1, **options) as mgr:
            await mgr.maybe_save(1, await asyncio.to_thread(state_of, 1))
            await mgr.wait()
            front.match = lambda line: line.startswith("GET ") and "list-type=2" in line
            await mgr.maybe_save(2, await asyncio.to_thread(state_of, 2))
            await mgr.wait()
            front.match = lambda line: False
    finally:
        await front.stop()
    tiers = mgr.stats.tiers
    assert tiers is not None and front.spoiled
    assert tiers.remote_committed == [1, 2] and tiers.remote_deleted == []
    assert [step for step, _ in tiers.retention_failures] == [2]
    assert "could not list" in tiers.retention_failures[0][1]

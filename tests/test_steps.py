"""Step directories with a commit and the CheckpointManager, on real files, S3 servers and 2 ranks."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from asyncckpt import (
    AsyncCheckpointer,
    CheckpointManager,
    ConfigError,
    IntegrityError,
    Shard,
    StepNotCommittedError,
    StoragePermissionError,
)
from asyncckpt.node.collectives import get_collectives
from asyncckpt.owner import boot_id, host
from asyncckpt.servers.s3endpoint import S3Endpoint
from asyncckpt.steps import COMMIT, OWNER, latest_step, read_commit, start_step, steps_under

from .launch import mpirun, torchrun
from .relay import FaultyFront
from .s3_harness import CHUNK, new_bucket, s3_call

MiB = 1 << 20


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def files_ckpt() -> AsyncCheckpointer:
    return AsyncCheckpointer(chunk_size=MiB, num_buffers=4)


def state_of(step: int) -> dict[str, Any]:
    return {"model": {"w": np.arange(100_000, dtype=np.float32) + step}, "step": step}


# -- listing ---------------------------------------------------------------------------------
async def test_list_names_of_a_directory(tmp_path: Path) -> None:
    async with files_ckpt() as c:
        (tmp_path / "a").mkdir()
        await c.save(tmp_path / "a" / "x.bin", 4096)
        await c.save(tmp_path / "b.bin", 4096)
        (tmp_path / ".b.bin.ackpt~h~00000000~1~00000000.partial").write_bytes(b"")  # a temporary
        sink = await c.storage.handle(str(tmp_path))
        assert await sink.list_names() == ["a", "b.bin"]
        await sink.aclose()
        missing = await c.storage.handle(str(tmp_path / "nope"))
        assert await missing.list_names() == []
        await missing.aclose()
        with pytest.raises(ConfigError, match="is a file"):
            await (await c.storage.handle(str(tmp_path / "b.bin"))).list_names()


@pytest.mark.parametrize("backend", ["aiobotocore", "minio", "s3dlio", "s3torchconnector", "obstore"])
async def test_list_names_on_s3(s3_endpoint: S3Endpoint, backend: str) -> None:
    """Each library's _list primitive (s3dlio and obstore through the writer process)."""
    bucket = await asyncio.to_thread(new_bucket, s3_endpoint)
    client = await asyncio.to_thread(s3_endpoint.client)
    for key in ("run/step-1/a", "run/step-1/b", "run/step-2/a", "run/top", "runner/x", "other/y"):
        await asyncio.to_thread(client.put_object, Bucket=bucket, Key=key, Body=b"x")
    async with AsyncCheckpointer(
        chunk_size=CHUNK, num_buffers=3, backend=backend, backend_options=s3_endpoint.options()
    ) as c:
        for uri, want in [("run", ["step-1", "step-2", "top"]), ("run/step-1", ["a", "b"]), ("none", [])]:
            sink = await c.storage.handle(f"s3://{bucket}/{uri}")
            try:
                assert await sink.list_names() == want, (backend, uri)
            finally:
                await sink.aclose()


# -- steps -----------------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["file", "s3"])
async def test_step_round_trip_one_rank(tmp_path: Path, s3_endpoint: S3Endpoint, where: str) -> None:
    if where == "s3":
        bucket = await asyncio.to_thread(new_bucket, s3_endpoint)
        root = f"s3://{bucket}/run"
        ckpt = AsyncCheckpointer(
            chunk_size=CHUNK, num_buffers=3, backend="aiobotocore", backend_options=s3_endpoint.options()
        )
    else:
        root, ckpt = str(tmp_path / "run"), files_ckpt()
    async with ckpt as c:
        assert await c.latest_step(root) is None
        with pytest.raises(StepNotCommittedError, match="no committed step"):
            await c.load_step(root)
        for step in (1, 2):
            record = await c.save_step(root, step, state_of(step))
            assert (record.step, record.world_size, record.objects) == (step, 1, ["rank-0-of-1.safetensors"])
            assert record.sizes[0] > 400_000 and record.identities[0]
        assert await c.latest_step(root) == 2
        loaded = await c.load_step(root)
        assert loaded.step == 2 and loaded.state["step"] == 2 and loaded.result.verified
        assert np.array_equal(loaded.state["model"]["w"], state_of(2)["model"]["w"])
        into = state_of(0)
        again = await c.load_step(root, 1, into=into)
        assert again.state["model"]["w"] is into["model"]["w"] and into["model"]["w"][0] == 1
        assert await steps_under(c, root) == [1, 2]


async def test_uncommitted_step_is_refused_and_passed_over(tmp_path: Path) -> None:
    root = tmp_path / "run"
    async with files_ckpt() as c:
        await c.save_step(root, 1, state_of(1))
        (root / "step-2").mkdir()  # step 2 as a dead run left it: its object, no commit record
        await c.save_state(root / "step-2" / "rank-0-of-1.safetensors", state_of(2))
        assert await latest_step(c, root) == 1
        assert await read_commit(c, root, 2) is None
        with pytest.raises(StepNotCommittedError, match=r"step 2 under .* is not committed: .*COMMITTED"):
            await c.load_step(root, 2)
        assert (await c.load_step(root)).step == 1


async def test_a_nanosecond_clock_step_is_listed_and_loaded(tmp_path: Path) -> None:
    """19 digits: saved and committed, then passed over by every listing (an 18-digit pattern)."""
    step = 1_796_325_054_166_750_400
    async with files_ckpt() as c:
        await c.save_step(tmp_path, 7, state_of(7))
        await c.save_step(tmp_path, step, state_of(8))
        assert await steps_under(c, tmp_path) == [7, step]
        assert await latest_step(c, tmp_path) == step
        assert (await c.load_step(tmp_path)).step == step


async def test_a_record_with_a_field_of_a_later_version_is_read(tmp_path: Path) -> None:
    """A manager refused to start over a root holding one (every step was then unreadable)."""
    async with files_ckpt() as c:
        await c.save_step(tmp_path, 3, state_of(3))
        path = tmp_path / "step-3" / COMMIT
        record = json.loads(path.read_text())
        path.write_text(json.dumps({**record, "a_later_field": {"x": 1}}))
        found = await read_commit(c, tmp_path, 3)
        assert found is not None and found.step == 3
        assert (await c.load_step(tmp_path)).step == 3


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("sizes", "big", "field 'sizes' must be a list of 1 byte counts, got 'big'"),
        ("sizes", [-1], "field 'sizes'"),
        ("step", "3", "field 'step' must be a non-negative integer, got '3'"),
        ("world_size", True, "field 'world_size' must be a positive integer"),
        ("objects", ["a", "b"], "field 'objects' must be a list of 1 object names"),
        ("committed_at", "today", "field 'committed_at'"),
        ("metadata", [1], "field 'metadata' must be an object or null"),
        ("index", 5, "field 'index'"),
        ("checksums", {"asyncckpt-index.json": 5}, "field 'checksums'"),
    ],
)
async def test_a_record_with_a_wrong_typed_field_is_refused_naming_it(
    tmp_path: Path, field: str, value: object, named: str
) -> None:
    """A record edited by hand: ``sizes: "big"`` reached load_step's size check ("an object
    of b"), ls died in ``sum()`` with a TypeError traceback."""
    async with files_ckpt() as c:
        await c.save_step(tmp_path, 3, state_of(3))
        path = tmp_path / "step-3" / COMMIT
        record = json.loads(path.read_text())
        path.write_text(json.dumps({**record, field: value}))
        with pytest.raises(IntegrityError, match=named):
            await read_commit(c, tmp_path, 3)


async def test_bad_input_is_refused_before_any_io(tmp_path: Path) -> None:
    a_file = tmp_path / "f"
    a_file.write_bytes(b"")
    async with files_ckpt() as c:
        for step in (-1, True, 1.5, "3"):
            with pytest.raises(ConfigError, match="step must be a non-negative integer"):
                await c.save_step(tmp_path / "r", step, state_of(0))  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match=r"step must be below 2\*\*63 .*got 9223372036854775808"):
            await c.save_step(tmp_path / "r", 1 << 63, state_of(0))
        with pytest.raises(ConfigError, match="is a file, not a directory of steps"):
            await c.latest_step(a_file)
        with pytest.raises(ConfigError, match="s3://bucket/prefix"):
            await c.load_step("s3://bucket")
        with pytest.raises(ConfigError, match="root must be"):
            await c.latest_step(3)  # type: ignore[arg-type]
    assert names(tmp_path) == ["f"]  # nothing was written


def check_two_rank_step(root: Path) -> None:
    for rank in (0, 1):
        loaded = json.loads((root / f"loaded-{rank}.json").read_text())
        assert loaded == {"step": 1, "rank": rank, "equal": True}
    record = json.loads((root / "step-1" / COMMIT).read_text())
    assert record["world_size"] == 2
    assert record["objects"] == ["rank-0-of-2.safetensors", "rank-1-of-2.safetensors"]


@pytest.mark.mpi
def test_two_ranks_under_mpirun(tmp_path: Path) -> None:
    proc = mpirun("tests.steps_child", str(tmp_path), "ok")
    assert proc.returncode == 0, proc.stderr
    check_two_rank_step(tmp_path)


@pytest.mark.mpi
def test_two_ranks_refuse_a_clock_cadence_and_record_metrics(tmp_path: Path) -> None:
    proc = mpirun("tests.steps_child", str(tmp_path), "policies")
    assert proc.returncode == 0, proc.stderr
    for rank in (0, 1):  # each rank's clock is its own: they could save different steps
        assert (
            "every_seconds and continuous need one rank; this job has 2"
            in (tmp_path / f"error-{rank}.txt").read_text()
        )
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-1", "step-2"]  # 1 best, 2 newest
    record = json.loads((tmp_path / "step-1" / COMMIT).read_text())
    assert record["world_size"] == 2 and record["metadata"]["metrics"] == {"loss": 0.5}


@pytest.mark.torchrun
def test_two_ranks_under_torchrun(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    proc = torchrun("tests.steps_child", str(tmp_path), "ok", "torch")
    assert proc.returncode == 0, proc.stderr
    check_two_rank_step(tmp_path)


@pytest.mark.mpi
async def test_a_rank_whose_save_fails_fails_the_step_on_every_rank(tmp_path: Path) -> None:
    proc = await asyncio.to_thread(mpirun, "tests.steps_child", str(tmp_path), "fail")
    assert proc.returncode == 0, proc.stderr  # nobody hung in the all-gather
    assert (tmp_path / "error-1.txt").read_text().startswith("ConfigError")
    assert (tmp_path / "error-0.txt").read_text().startswith(
        "StepNotCommittedError: step 2 under"
    ) and "rank(s) [1] failed to save" in (tmp_path / "error-0.txt").read_text()
    assert not (tmp_path / "step-2" / COMMIT).exists() and (tmp_path / "step-1" / COMMIT).exists()


@pytest.mark.mpi
async def test_a_rank_refusing_its_state_leaves_a_committed_step_of_that_number_committed(
    tmp_path: Path,
) -> None:
    """Step 1 saved again by two ranks, rank 1's state refused before any I/O. Before, rank 0
    had already withdrawn step 1's commit record and written its object: step 1 was lost on
    every rank. Now the ranks agree that every state was laid out before any of them touches
    the step."""
    proc = await asyncio.to_thread(mpirun, "tests.steps_child", str(tmp_path), "failsame")
    assert proc.returncode == 0, proc.stderr  # nobody hung in the agreement
    assert (tmp_path / "error-1.txt").read_text().startswith("ConfigError")
    told = (tmp_path / "error-0.txt").read_text()
    assert told.startswith("StepNotCommittedError: step 1 under") and "rank(s) [1] failed to save" in told
    assert "before any I/O" in told
    for rank in (0, 1):
        assert json.loads((tmp_path / f"loaded-{rank}.json").read_text()) == {"step": 1, "equal": True}
    assert (tmp_path / "step-1" / COMMIT).exists()


@pytest.mark.mpi
async def test_rank_0_failing_to_commit_fails_the_step_on_every_rank(tmp_path: Path) -> None:
    """Every object durable, then rank 0 cannot write the step's index: the other rank hears
    of it and raises, rather than wait for a commit record that will not come."""
    proc = await asyncio.to_thread(mpirun, "tests.steps_child", str(tmp_path), "commitfail")
    assert proc.returncode == 0, proc.stderr  # nobody hung
    assert "asyncckpt-index.json" in (tmp_path / "error-0.txt").read_text()
    told = (tmp_path / "error-1.txt").read_text()
    assert told.startswith("StepNotCommittedError: step 2 under") and "rank 0 failed to commit it" in told
    assert not (tmp_path / "step-2" / COMMIT).exists() and (tmp_path / "step-1" / COMMIT).exists()


@pytest.mark.mpi
async def test_a_rank_killed_mid_step_leaves_the_previous_step_loadable(tmp_path: Path) -> None:
    proc = await asyncio.to_thread(mpirun, "tests.steps_child", str(tmp_path), "crash")
    assert proc.returncode != 0  # rank 1 was SIGKILLed, the launcher tore rank 0 down
    step2 = tmp_path / "step-2"
    assert (step2 / OWNER).exists() and not (step2 / COMMIT).exists()
    async with files_ckpt() as c:
        assert await c.latest_step(tmp_path) == 1
        with pytest.raises(StepNotCommittedError, match="step 2"):
            await c.load_step(tmp_path, 2)
        # committed by a world of two: one rank reshards it; plain tensors are per-rank values,
        # and on another world size every rank gets rank 0's (docs/resharding.md)
        other = await c.load_step(tmp_path)
        assert other.reads is not None and other.state["rank"] == 0
        assert np.array_equal(other.state["w"], np.arange(50_000, dtype=np.float32) + 1)
    # the next run's manager removes step 2: its owner (rank 0's pid on this host) is dead
    async with CheckpointManager(tmp_path, chunk_size=MiB, num_buffers=4) as mgr:
        await mgr.start()
    assert mgr.stats.cleaned == [2] and mgr.stats.left == [], mgr.stats
    assert names(tmp_path) == ["step-1"]


# -- the manager -----------------------------------------------------------------------------
class GatedCheckpointer(AsyncCheckpointer):
    """A real checkpointer whose writes start only once ``gate`` is set: a deliberately slow save."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.gate = asyncio.Event()

    async def save(self, *args: Any, **kwargs: Any) -> Any:
        await self.gate.wait()
        return await super().save(*args, **kwargs)


async def test_manager_saves_every_n_keeps_last_and_restores(tmp_path: Path) -> None:
    options: dict[str, Any] = {"chunk_size": MiB, "num_buffers": 4}
    async with CheckpointManager(tmp_path, every_n_steps=3, keep_last=2, **options) as mgr:
        assert await mgr.restore() is None
        started = [step for step in range(1, 13) if await mgr.maybe_save(step, state_of(step))]
        await mgr.wait()
    assert started == [3, 6, 9, 12] and mgr.stats.saved == [3, 6, 9, 12]
    assert mgr.stats.deleted == [3, 6]  # in the background, after 9 and 12 committed
    assert names(tmp_path) == ["step-12", "step-9"]
    into = state_of(0)
    async with CheckpointManager(tmp_path, every_n_steps=3, chunk_size=MiB, num_buffers=4) as again:
        assert await again.restore(into=into) == 12
    assert into["model"]["w"][0] == 12 and again.restored is not None and again.restored.state["step"] == 12
    assert into["step"] == 12  # issue 25 item 13: the scalar comes back into the caller's state


async def test_manager_on_s3_keeps_last_and_restores(s3_endpoint: S3Endpoint) -> None:
    bucket = await asyncio.to_thread(new_bucket, s3_endpoint)
    root = f"s3://{bucket}/run"
    options: dict[str, Any] = {"chunk_size": CHUNK, "num_buffers": 3, "backend": "aiobotocore"}
    options["backend_options"] = s3_endpoint.options()
    async with CheckpointManager(root, keep_last=1, **options) as mgr:
        for step in (1, 2, 3):
            await mgr.maybe_save(step, state_of(step))
    assert mgr.stats.saved == [1, 2, 3] and mgr.stats.deleted == [1, 2]
    listed = await s3_call(s3_endpoint, "list_objects_v2", Bucket=bucket)
    keys = sorted(o["Key"] for o in listed["Contents"])
    assert keys == [
        "run/step-3/COMMITTED.json",
        "run/step-3/OWNER.json",
        "run/step-3/asyncckpt-index.json",
        "run/step-3/model.safetensors.index.json",  # the Hugging Face index: retention removed the others'
        "run/step-3/rank-0-of-1.safetensors",
    ]
    async with CheckpointManager(root, **options) as again:
        assert await again.restore() == 3 and again.restored is not None
    assert np.array_equal(again.restored.state["model"]["w"], state_of(3)["model"]["w"])


async def test_manager_when_busy_skip_records_the_skipped_step(tmp_path: Path) -> None:
    ckpt = GatedCheckpointer(chunk_size=MiB, num_buffers=4)
    async with ckpt, CheckpointManager(tmp_path, when_busy="skip", checkpointer=ckpt) as mgr:
        assert await mgr.maybe_save(1, state_of(1))  # staged; its write waits at the gate
        assert not await mgr.maybe_save(2, state_of(2))  # still pending: skipped
        ckpt.gate.set()
        await mgr.wait()
        assert await mgr.maybe_save(3, state_of(3))
    assert mgr.stats.saved == [1, 3] and mgr.stats.skipped == [2] and mgr.stats.waited == []


async def test_manager_when_busy_wait_waits_for_the_pending_save(tmp_path: Path) -> None:
    ckpt = GatedCheckpointer(chunk_size=MiB, num_buffers=4)
    async with ckpt, CheckpointManager(tmp_path, when_busy="wait", checkpointer=ckpt) as mgr:
        await mgr.maybe_save(1, state_of(1))
        second = asyncio.create_task(mgr.maybe_save(2, state_of(2)))
        for _ in range(20):  # let it run as far as it can: it must be waiting for step 1
            await asyncio.sleep(0)
        assert not second.done() and mgr.stats.saved == []
        ckpt.gate.set()
        assert await second
    assert mgr.stats.saved == [1, 2] and mgr.stats.skipped == []
    assert [step for step, _ in mgr.stats.waited] == [2] and mgr.stats.waited[0][1] > 0


async def test_manager_leaves_an_uncommitted_step_whose_owner_may_live(tmp_path: Path) -> None:
    step = tmp_path / "step-5"
    step.mkdir()
    (step / OWNER).write_text(json.dumps({"host": host(), "boot": boot_id(), "pid": os.getpid()}))
    (tmp_path / "step-6").mkdir()  # no owner recorded
    async with CheckpointManager(tmp_path, chunk_size=MiB, num_buffers=4) as mgr:
        assert await mgr.restore() is None
    assert mgr.stats.cleaned == []
    assert [s for s, _ in mgr.stats.left] == [5, 6]
    assert "running" in mgr.stats.left[0][1] and "unrecorded" in mgr.stats.left[1][1]
    assert (step / OWNER).exists()


async def s3_keys(ep: S3Endpoint, bucket: str) -> list[str]:
    listed = await s3_call(ep, "list_objects_v2", Bucket=bucket)
    return sorted(o["Key"] for o in listed.get("Contents", []))


async def step_1_denied(ep: S3Endpoint) -> tuple[FaultyFront, dict[str, Any]]:
    """A started relay in front of ``ep`` that denies every object PUT of step 1, and manager
    options (aiobotocore) that go through it."""
    front = FaultyFront(ep.endpoint, "deny", lambda line: line.startswith("PUT ") and "/step-1/rank-" in line)
    url = await front.start()
    options: dict[str, Any] = {"chunk_size": CHUNK, "num_buffers": 3, "backend": "aiobotocore"}
    options["backend_options"] = ep.options(endpoint_url=url)
    return front, options


async def test_manager_raises_a_failed_save_and_cleans_its_step(moto_endpoint: S3Endpoint) -> None:
    """Issue 25 item 12: ``wait()`` raises the background failure, the failed step's records are
    gone in this process, and the manager goes on saving."""
    bucket = await asyncio.to_thread(new_bucket, moto_endpoint)
    front, options = await step_1_denied(moto_endpoint)
    root = f"s3://{bucket}/run"
    try:
        async with CheckpointManager(root, **options) as mgr:
            assert await mgr.maybe_save(1, state_of(1))  # staged: the write fails in the background
            with pytest.raises(StoragePermissionError, match="step-1"):
                await mgr.wait()
            assert front.spoiled and [s for s, _ in mgr.stats.failed] == [1]
            assert await s3_keys(moto_endpoint, bucket) == []  # OWNER.json removed: no leftovers
            assert mgr.stats.cleaned == [1]
            await mgr.wait()  # raised once
            assert await mgr.maybe_save(2, state_of(2))
        assert mgr.stats.saved == [2]
    finally:
        await front.stop()
    keys = await s3_keys(moto_endpoint, bucket)
    assert [k.split("/")[1] for k in keys] == ["step-2"] * 5  # owner, object, two indexes, commit


async def test_manager_aclose_raises_a_failure_not_yet_raised(moto_endpoint: S3Endpoint) -> None:
    bucket = await asyncio.to_thread(new_bucket, moto_endpoint)
    front, options = await step_1_denied(moto_endpoint)
    try:
        with pytest.raises(StoragePermissionError):
            async with CheckpointManager(f"s3://{bucket}/run", **options) as mgr:
                await mgr.maybe_save(1, state_of(1))
        quiet = CheckpointManager(f"s3://{bucket}/quiet", raise_on_failure=False, **options)
        front.left = 1
        front.match = lambda line: line.startswith("PUT ") and "/quiet/step-1/rank-" in line
        async with quiet:
            await quiet.maybe_save(1, state_of(1))
            await quiet.wait()  # today's behaviour on request: logged and counted only
    finally:
        await front.stop()
    assert len(front.spoiled) == 2 and [s for s, _ in quiet.stats.failed] == [1]
    assert mgr.stats.cleaned == [1] == quiet.stats.cleaned
    assert await s3_keys(moto_endpoint, bucket) == []


async def test_manager_cleans_a_step_whose_save_is_refused_at_once(tmp_path: Path) -> None:
    """A state that cannot be saved fails ``maybe_save`` itself and begins no step (it is
    refused before the step's first I/O: nothing to clean)."""
    async with CheckpointManager(tmp_path, chunk_size=MiB, num_buffers=4, staging="none") as mgr:
        with pytest.raises(ConfigError, match="complex128"):
            await mgr.maybe_save(1, {"z": np.zeros(3, np.complex128)})
        assert names(tmp_path) == []
        await mgr.wait()  # raised already: not again
    assert mgr.stats.cleaned == [] and [s for s, _ in mgr.stats.failed] == [1]


def test_manager_refuses_bad_settings(tmp_path: Path) -> None:
    for kwargs, match in [
        ({"every_n_steps": 0}, "every_n_steps"),
        ({"keep_last": 0}, "keep_last"),
        ({"when_busy": "drop"}, "when_busy"),
        ({"staging": "gpu"}, "staging"),
    ]:
        with pytest.raises(ConfigError, match=match):
            CheckpointManager(tmp_path, **kwargs)
    assert names(tmp_path) == []  # nothing written


BAD_STATES = {
    "not an array": {"w": np.arange(4.0), "bad": object()},
    "a box leaving its tensor": {"w": Shard((4,), (3,), np.arange(2.0))},
}


@pytest.mark.parametrize("staging", ["none", "host"])
@pytest.mark.parametrize("bad", list(BAD_STATES))
async def test_a_refused_state_touches_no_step(tmp_path: Path, bad: str, staging: str) -> None:
    """Before: the step's directory was made and the commit record of an earlier save of that
    step number withdrawn (with ``OWNER.json`` written) before the state was laid out: saving
    a bad state as step 1 left committed step 1 unloadable (StepNotCommittedError), and as a
    new step 2 left ``step-2/`` behind."""
    root = tmp_path / "run"
    async with AsyncCheckpointer(chunk_size=1 << 20, num_buffers=3) as c, get_collectives() as coll:
        await c.save_step(root, 1, {"w": np.arange(4.0), "step": 1})
        before = sorted(os.listdir(root / "step-1"))
        for step in (1, 2):
            with pytest.raises(ConfigError, match=r"state\['(bad|w)'\]"):
                await start_step(c, root, step, BAD_STATES[bad], coll=coll, staging=staging)  # type: ignore[arg-type]
        assert sorted(os.listdir(root / "step-1")) == before
        assert sorted(os.listdir(root)) == ["step-1"]
        got = await c.load_step(root)
    assert got.step == 1 and got.state["step"] == 1


async def test_a_listing_that_fails_during_retention_is_recorded_and_raised(
    moto_endpoint: S3Endpoint,
) -> None:
    """Retention lists the root after each commit; a listing the store refuses was a failed
    background task nobody read: nothing in stats, nothing raised, old steps silently kept."""
    bucket = await asyncio.to_thread(new_bucket, moto_endpoint)
    front = FaultyFront(moto_endpoint.endpoint, "deny", lambda line: False, times=1000)
    url = await front.start()
    options: dict[str, Any] = {"chunk_size": CHUNK, "num_buffers": 3, "backend": "aiobotocore"}
    options["backend_options"] = moto_endpoint.options(endpoint_url=url)
    try:
        async with CheckpointManager(f"s3://{bucket}/run", keep_last=1, staging="none", **options) as mgr:
            await mgr.maybe_save(1, state_of(1))
            await mgr.wait()
            front.match = lambda line: line.startswith("GET ") and "list-type=2" in line
            await mgr.maybe_save(2, state_of(2))
            with pytest.raises(StoragePermissionError):
                await mgr.wait()
            assert front.spoiled
            assert [(step, why.split(":")[0]) for step, why in mgr.stats.failed] == [(2, "retention")]
            front.match = lambda line: False
    finally:
        await front.stop()
    assert mgr.stats.saved == [1, 2] and mgr.stats.deleted == []


async def test_a_zero_padded_directory_or_a_stray_file_is_not_a_step(tmp_path: Path) -> None:
    """``step-007`` beside ``step-7`` was step 7 again (listed twice, "deleted" twice), and a
    file named ``step-9`` stopped the manager: stat 'step-9/COMMITTED.json': Not a directory."""
    options: dict[str, Any] = {"chunk_size": MiB, "num_buffers": 4}
    async with CheckpointManager(tmp_path, **options) as mgr:
        await mgr.maybe_save(7, state_of(7))
    (tmp_path / "step-007").mkdir()
    (tmp_path / "step-007" / "notes.txt").write_text("mine")
    (tmp_path / "step-9").write_text("a file of mine")
    async with files_ckpt() as ckpt:
        assert await steps_under(ckpt, str(tmp_path)) == [7]
    async with CheckpointManager(tmp_path, keep_last=1, **options) as mgr:
        assert await mgr.restore() == 7
        assert [c.step for c in await mgr.steps()] == [7]
        await mgr.maybe_save(10, state_of(10))
    assert mgr.stats.deleted == [7] and mgr.stats.left == [] and mgr.stats.failed == []
    assert names(tmp_path) == ["step-007", "step-10", "step-9"]  # theirs, untouched
    assert (tmp_path / "step-007" / "notes.txt").read_text() == "mine"

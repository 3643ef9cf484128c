"""Tiered checkpoints on real files (a local tier and a remote root): drains, the remote
commit, restore from the nearest verified copy, retention per tier, when a drain is busy,
resumed drains, a remote outage, a full local disk and bad input."""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from asyncckpt import AsyncCheckpointer, CheckpointManager
from asyncckpt.cpu import helper_threads
from asyncckpt.drain import drain_object
from asyncckpt.errors import ChecksumMismatchError, ConfigError, NoSpaceError
from asyncckpt.priority import is_idle_class, priorities
from asyncckpt.sinks.registry import resolve_backend
from asyncckpt.steps import COMMIT

from .conftest import mounted

MiB = 1 << 20
OPTIONS: dict[str, Any] = {"chunk_size": MiB, "num_buffers": 4}
OBJECT = "rank-0-of-1.safetensors"


def state_of(step: int, n: int = 300_000) -> dict[str, Any]:
    return {"model": {"w": np.arange(n, dtype=np.float32) + step}, "step": step}


def committed(root: Path) -> list[int]:
    return sorted(int(p.parent.name.split("-")[1]) for p in root.glob(f"step-*/{COMMIT}"))


def tiers_of(tmp_path: Path) -> tuple[Path, Path]:
    local, remote = tmp_path / "local", tmp_path / "remote"
    local.mkdir()
    remote.mkdir()
    return local, remote


def outage(remote: Path) -> None:
    """The remote root becomes unusable (a file where the directory was): every drain fails."""
    remote.rmdir()
    remote.write_text("")


def back(remote: Path) -> None:
    remote.unlink()
    remote.mkdir()


def corrupt(path: Path, offset: int) -> None:
    with path.open("r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


async def test_steps_commit_locally_drain_and_commit_remotely(tmp_path: Path) -> None:
    local, remote = tiers_of(tmp_path)
    async with CheckpointManager(remote, local=local, keep_local=2, keep_last=2, **OPTIONS) as mgr:
        for step in (1, 2, 3, 4):
            await mgr.maybe_save(step, state_of(step), metrics={"loss": 1.0 / step})
            await mgr.wait()
    assert committed(remote) == [3, 4]  # keep_last on the remote tier
    assert committed(local) == [3, 4]  # keep_local: older ones were remote-committed, so deleted
    tiers = mgr.stats.tiers
    assert tiers is not None
    assert tiers.remote_committed == [1, 2, 3, 4] and tiers.drain_failures == []
    assert tiers.local_deleted == [1, 2] and tiers.remote_deleted == [1, 2]
    for step in (1, 2, 3, 4):
        facts = tiers.steps[step]
        assert facts.state == "remote-committed"
        assert facts.local_commit_s is not None and facts.remote_commit_s is not None
        assert facts.remote_commit_s >= facts.local_commit_s > 0
        assert facts.bytes_drained == (local / "step-4" / OBJECT).stat().st_size or step != 4
        assert facts.drain_gb_per_s > 0
    # the same bytes: the remote object verifies with the checksums of the local one
    assert (remote / "step-4" / OBJECT).read_bytes() == (local / "step-4" / OBJECT).read_bytes()
    record = json.loads((remote / "step-4" / COMMIT).read_text())
    assert record["metadata"]["metrics"] == {"loss": 0.25}
    assert record["metadata"]["tiers"]["rank0"]["bytes_drained"] > 0
    json.dumps(tiers.as_dict())  # result JSON


async def test_restore_prefers_the_local_copy_and_says_why(tmp_path: Path) -> None:
    local, remote = tiers_of(tmp_path)
    async with CheckpointManager(remote, local=local, **OPTIONS) as mgr:
        await mgr.maybe_save(1, state_of(1))
    into = state_of(0)
    async with CheckpointManager(remote, local=local, **OPTIONS) as mgr:
        assert await mgr.restore(into=into) == 1
    assert np.array_equal(into["model"]["w"], state_of(1)["model"]["w"])
    assert mgr.stats.tiers is not None and mgr.stats.tiers.restored_from is not None
    assert mgr.stats.tiers.restored_from[0] == "local"


async def test_a_corrupt_local_copy_falls_back_to_the_remote_naming_the_offset(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    local, remote = tiers_of(tmp_path)
    async with CheckpointManager(remote, local=local, **OPTIONS) as mgr:
        await mgr.maybe_save(1, state_of(1))
    corrupt(local / "step-1" / OBJECT, MiB + 5)
    into = state_of(0)
    with caplog.at_level(logging.WARNING, logger="asyncckpt"):
        async with CheckpointManager(remote, local=local, **OPTIONS) as mgr:
            assert await mgr.restore(into=into) == 1
    assert np.array_equal(into["model"]["w"], state_of(1)["model"]["w"])
    assert mgr.stats.tiers is not None and mgr.stats.tiers.restored_from is not None
    tier, why = mgr.stats.tiers.restored_from
    assert tier == "remote" and "offset" in why
    assert any("failed verification at offset" in r.getMessage() for r in caplog.records)


async def test_node_loss_restores_from_the_remote(tmp_path: Path) -> None:
    local, remote = tiers_of(tmp_path)
    async with CheckpointManager(remote, local=local, **OPTIONS) as mgr:
        for step in (1, 2):
            await mgr.maybe_save(step, state_of(step))
    shutil.rmtree(local)
    local.mkdir()  # a replacement node: an empty local tier
    into = state_of(0)
    async with CheckpointManager(remote, local=local, **OPTIONS) as mgr:
        assert await mgr.restore(into=into) == 2
    assert np.array_equal(into["model"]["w"], state_of(2)["model"]["w"])
    assert mgr.stats.tiers is not None and mgr.stats.tiers.restored_from is not None
    assert mgr.stats.tiers.restored_from[0] == "remote"


async def test_a_corrupt_local_byte_stops_the_drain_with_its_offset(tmp_path: Path) -> None:
    local, remote = tiers_of(tmp_path)
    async with AsyncCheckpointer(**OPTIONS) as ckpt:
        await ckpt.save_state(str(local / OBJECT), state_of(1))
        corrupt(local / OBJECT, MiB + 17)
        with pytest.raises(ChecksumMismatchError, match="corrupt at offset 1048576") as err:
            await drain_object(ckpt, str(local / OBJECT), str(remote / OBJECT))
    assert err.value.offset == MiB
    assert list(remote.iterdir()) == []  # nothing published, no temporary left


async def test_a_remote_outage_keeps_the_step_local_reports_once_and_retries(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    local, remote = tiers_of(tmp_path)
    with caplog.at_level(logging.ERROR, logger="asyncckpt"):
        mgr = CheckpointManager(str(remote), local=local, raise_on_failure=False, **OPTIONS)
        outage(remote)
        async with mgr:
            await mgr.maybe_save(1, state_of(1))
            await mgr.wait()  # training goes on: step 1 is committed locally
            assert committed(local) == [1] and mgr.stats.saved == [1]
            tiers = mgr.stats.tiers
            assert tiers is not None and [s for s, _ in tiers.drain_failures] == [1]
            assert tiers.steps[1].state == "failed"
            back(remote)  # the store is back: the next commit retries step 1 first
            await mgr.maybe_save(2, state_of(2))
            await mgr.wait()
    assert committed(remote) == [1, 2]
    assert tiers.remote_committed == [1, 2] and len(tiers.drain_failures) == 1
    assert sum("drain of step 1" in r.getMessage() for r in caplog.records) == 1


async def test_drains_of_committed_local_steps_resume_after_a_restart(tmp_path: Path) -> None:
    local, remote = tiers_of(tmp_path)
    async with CheckpointManager(remote, local=local, raise_on_failure=False, **OPTIONS) as mgr:
        outage(remote)  # the drain of step 1 fails: the run ends with step 1 local-only
        await mgr.maybe_save(1, state_of(1))
        await mgr.wait()
    assert committed(local) == [1]
    back(remote)
    async with CheckpointManager(remote, local=local, **OPTIONS) as mgr:
        await mgr.start()
        await mgr.wait()
    assert mgr.stats.tiers is not None and mgr.stats.tiers.resumed == [1]
    assert committed(remote) == [1]


async def test_a_busy_drain_is_skipped_waited_for_or_queued(tmp_path: Path) -> None:
    local, remote = tiers_of(tmp_path)
    big = 1_000_000  # 4 MB at 8 MB/s: a drain that takes about half a second
    for mode in ("skip", "wait", "queue"):
        (local / mode).mkdir()
        (remote / mode).mkdir()
        async with CheckpointManager(
            remote / mode, local=local / mode, drain_when_busy=mode, drain_bandwidth=8e6, **OPTIONS
        ) as mgr:
            await mgr.maybe_save(1, state_of(1, big))
            assert mgr.tiers is not None
            await mgr.tiers.drain_began(1)
            await mgr.maybe_save(2, state_of(2, big))
        tiers = mgr.stats.tiers
        assert tiers is not None
        if mode == "skip":
            assert tiers.drains_skipped == [2] and committed(remote / mode) == [1]
        elif mode == "wait":
            assert [s for s, _ in tiers.drains_waited] == [2] and committed(remote / mode) == [1, 2]
        else:
            assert tiers.drains_queued == [2] and committed(remote / mode) == [1, 2]
            assert tiers.drains_waited == []  # one queued is within max_queued_drains=1: no wait


async def test_a_full_local_disk_says_so_and_the_previous_step_restores(tmp_path: Path) -> None:
    remote = tmp_path / "remote"
    remote.mkdir()
    with mounted(tmp_path / "small", "tmpfs", "size=6m") as local:
        async with CheckpointManager(remote, local=local, keep_local=5, **OPTIONS) as mgr:
            await mgr.maybe_save(1, state_of(1))  # 1.2 MB
            await mgr.wait()
            with pytest.raises(NoSpaceError):
                await mgr.maybe_save(2, state_of(2, 2_000_000))  # 8 MB: does not fit
                await mgr.wait()
        into = state_of(0)
        async with CheckpointManager(remote, local=local, **OPTIONS) as mgr:
            assert await mgr.restore(into=into) == 1
        assert np.array_equal(into["model"]["w"], state_of(1)["model"]["w"])


async def test_a_local_step_kept_for_its_drain_goes_once_it_is_remote_committed(tmp_path: Path) -> None:
    """keep_local=1, and step 2 commits locally while step 1's drain still runs (capped at
    1 MB/s for 1.2 MB), so step 1 is kept. Before, it stayed on the local disk until step 3's
    local commit: two local steps where one was asked for. Now the remote commit prunes too."""
    local, remote = tiers_of(tmp_path)
    async with CheckpointManager(remote, local=local, keep_local=1, drain_bandwidth=1e6, **OPTIONS) as mgr:
        for step in (1, 2):
            await mgr.maybe_save(step, state_of(step))
        await mgr.wait()
        tiers = mgr.stats.tiers
        assert tiers is not None
        first, second = tiers.steps[1], tiers.steps[2]
        assert first.started_at and first.remote_commit_s and second.started_at and second.local_commit_s
        # the case under test: step 2 committed locally before step 1 was remote-committed
        assert second.started_at + second.local_commit_s < first.started_at + first.remote_commit_s
        assert (1, "not remote-committed yet: kept beyond keep_local") in tiers.kept_local
        assert committed(local) == [2] and tiers.local_deleted == [1]
    assert committed(remote) == [1, 2]


async def test_steps_lists_both_tiers_or_the_one_asked_for(tmp_path: Path) -> None:
    """With local=, mgr.steps() listed the local tier only: steps 1 and 2, drained and pruned
    locally (keep_local=1), were missing though the remote holds them."""
    local, remote = tiers_of(tmp_path)
    async with CheckpointManager(remote, local=local, keep_local=1, **OPTIONS) as mgr:
        for step in (1, 2, 3):
            await mgr.maybe_save(step, state_of(step))
            await mgr.wait()  # drained and remote-committed before the next prunes the local copy
        both = await mgr.steps()
        assert [r.step for r in both] == [1, 2, 3]
        here, there = await mgr.steps(tier="local"), await mgr.steps(tier="remote")
        with pytest.raises(ConfigError, match="tier must be one of local, remote, got 'nvme'"):
            await mgr.steps(tier="nvme")  # type: ignore[arg-type]
    assert committed(local) == [3] and committed(remote) == [1, 2, 3]
    assert [r.step for r in here] == [3] and [r.step for r in there] == [1, 2, 3]
    assert all((r.metadata or {}).get("tiers") for r in both)  # the remote record, where there is one
    async with CheckpointManager(remote, **OPTIONS) as plain:
        with pytest.raises(ConfigError, match="tier= applies to a manager with local="):
            await plain.steps(tier="local")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"keep_local": 0}, "keep_local must be a positive integer, got 0"),
        ({"local": "s3://bucket/run"}, "must be a local directory path"),
        ({"drain_when_busy": "later"}, "drain_when_busy must be one of"),
        ({"drain_bandwidth": -1}, "drain_bandwidth must be a positive number"),
        ({"max_queued_drains": 0}, "max_queued_drains must be a positive integer"),
        ({"drain_priority": "fast"}, "drain_priority must be one of"),
        ({"replicate_to_peer": "yes"}, "replicate_to_peer must be True or False, got 'yes'"),
    ],
)
def test_bad_tier_input_is_refused_naming_it(tmp_path: Path, kwargs: dict[str, Any], message: str) -> None:
    options: dict[str, Any] = {"local": tmp_path / "local", **OPTIONS, **kwargs}
    with pytest.raises(ConfigError, match=message):
        CheckpointManager(tmp_path / "remote", **options)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"keep_local": 5}, r"keep_local=5 set\(s\) the local tier, but no local= was given"),
        ({"drain_when_busy": "skip", "max_queued_drains": 3}, "drain_when_busy='skip', max_queued_drains=3"),
        ({"drain_bandwidth": 1e6}, "drain_bandwidth=1000000.0"),
        ({"keep_local": 0}, "keep_local=0"),
        ({"drain_priority": "lane"}, "drain_priority='lane'"),
        ({"replicate_to_peer": True}, "replicate_to_peer=True"),
    ],
)
def test_local_tier_options_without_local_are_refused_naming_them(
    tmp_path: Path, kwargs: dict[str, Any], message: str
) -> None:
    """``keep_local=5`` without ``local=`` ran untiered without a word (the user believed the
    steps were kept on the fast tier and drained)."""
    with pytest.raises(ConfigError, match=message):
        CheckpointManager(tmp_path / "remote", **OPTIONS, **kwargs)
    assert list(tmp_path.iterdir()) == []


def test_a_file_given_as_the_local_tier_is_named_as_local(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    with pytest.raises(ConfigError, match=r"local='.*/f': root '.*/f' is a file"):
        CheckpointManager(tmp_path / "remote", local=tmp_path / "f", **OPTIONS)


def test_the_local_root_must_not_be_the_remote_root(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="overlap"):
        CheckpointManager(tmp_path, local=tmp_path, **OPTIONS)
    with pytest.raises(ConfigError, match="overlap"):
        CheckpointManager(tmp_path, local=tmp_path / "local", **OPTIONS)
    # however the same directory is written: local pruning deleted remote steps
    for local in (f"direct://{tmp_path}", f"file://{tmp_path}", f"direct://{tmp_path}/local"):
        with pytest.raises(ConfigError, match="overlap"):
            CheckpointManager(str(tmp_path), local=local, **OPTIONS)


def test_an_explicit_s3_backend_chooses_the_remotes_library_not_the_local_tiers(tmp_path: Path) -> None:
    """``backend="aiobotocore"`` names the S3 library; it refused the local tier (a directory,
    served by files) as "not a local directory path" (found on the two-node bed)."""
    mgr = CheckpointManager("s3://bucket/run", local=tmp_path, backend="aiobotocore", **OPTIONS)
    storage = mgr.ckpt.storage
    assert storage.route("s3://bucket/run/x")[0] == "aiobotocore"
    assert storage.route(str(tmp_path / "x"))[0] == "file"
    assert resolve_backend("direct:///tmp/x", "file") == "file"  # files: the kind is the same
    assert resolve_backend("/tmp/x", "direct") == "direct"
    assert resolve_backend("az://c/k", "aiobotocore") == "obstore-azure"  # Azure's own default


async def test_a_full_local_disk_deletes_undrained_steps_beyond_keep_local_and_says_so(
    tmp_path: Path,
) -> None:
    remote = tmp_path / "remote"
    remote.mkdir()
    n = 600_000  # 2.4 MB a step: two fit in 6 MiB, three do not
    with mounted(tmp_path / "small", "tmpfs", "size=6m") as local:
        mgr = CheckpointManager(remote, local=local, keep_local=1, raise_on_failure=False, **OPTIONS)
        outage(remote)  # nothing is remote-committed: keep_local alone deletes nothing
        async with mgr:
            for step in (1, 2):
                await mgr.maybe_save(step, state_of(step, n))
                await mgr.wait()
            tiers = mgr.stats.tiers
            assert tiers is not None and tiers.kept_local == [
                (1, "not remote-committed yet: kept beyond keep_local")
            ]
            with contextlib.suppress(NoSpaceError):  # raised here, or recorded for wait()
                await mgr.maybe_save(3, state_of(3, n))
            await mgr.wait()
            assert [s for s, why in mgr.stats.failed] == [3] and "No space" in mgr.stats.failed[0][1]
            assert [s for s, _ in tiers.dropped_local] == [1]
            assert (
                "local disk full" in tiers.dropped_local[0][1]
                and "not remote-committed" in tiers.dropped_local[0][1]
            )
            assert await mgr.maybe_save(4, state_of(4, n))  # room again
            await mgr.wait()
            assert mgr.stats.saved == [1, 2, 4] and committed(local) == [2, 4]


async def test_a_running_drain_does_not_hold_the_next_local_commit(tmp_path: Path) -> None:
    local, remote = tiers_of(tmp_path)
    big = 1_000_000  # 4 MB drained at 4 MB/s: about a second, a local save takes milliseconds
    async with CheckpointManager(remote, local=local, drain_bandwidth=4e6, **OPTIONS) as mgr:
        assert mgr.tiers is not None
        await mgr.maybe_save(1, state_of(1, big))
        await mgr.tiers.drain_began(1)
        await mgr.maybe_save(2, state_of(2, big))
        await mgr.tiers.local_committed(2)
        # step 2 committed locally while step 1 was still draining (the drain has its own
        # checkpointer: the manager's runtime lock, held for a whole save, is not the drain's)
        assert mgr.tiers.stats.steps[1].state == "draining"
    assert committed(remote) == [1, 2]


def idle_threads() -> set[int]:
    """This process's threads in the kernel's SCHED_IDLE class."""
    return {t for t in (int(p.name) for p in Path("/proc/self/task").iterdir()) if is_idle_class(t)}


@pytest.mark.parametrize("priority", [None, "idle", "lane"])
async def test_a_drain_checksums_in_sched_idle_and_leaves_the_saves_threads_as_they_were(
    tmp_path: Path, priority: str | None
) -> None:
    """A drain is background work: by default its CPU-only work runs only on CPU other threads
    leave (``drain_priority="lane"``: at the lane's niceness). The manager's own lane, and
    dgen-py's process-global pool, keep their priority."""
    local, remote = tiers_of(tmp_path)
    chosen = {} if priority is None else {"drain_priority": priority}
    async with CheckpointManager(remote, local=local, **chosen, **OPTIONS) as mgr:
        await mgr.ckpt.save("null://probe", 8 << 20)  # dgen-py's pool, lowered by the save's lane
        helpers = priorities(helper_threads())
        before = idle_threads()
        await mgr.maybe_save(1, state_of(1))
        await mgr.wait()
        assert mgr.stats.tiers is not None and mgr.stats.tiers.remote_committed == [1]
        drainer = idle_threads() - before
        if priority == "lane":
            assert not drainer, "a drain at the lane's priority ran in SCHED_IDLE"
        else:
            assert drainer, "no thread of the drain ran in SCHED_IDLE"
        lane = mgr.ckpt.runtime.cpu_lane
        assert lane is not None and not set(lane.tids()) & drainer  # the saves' lane: not idle
        assert priorities(helper_threads()) == helpers  # dgen-py's pool: as the save left it

"""CheckpointManager policies on real files: metadata in the commit record, ``steps()``,
best-N on disk, time and continuous cadences, bad input, and ``python -m asyncckpt.bench ls``."""

from __future__ import annotations

import asyncio
import json
import math
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from asyncckpt import CheckpointManager
from asyncckpt.errors import ConfigError
from asyncckpt.steps import COMMIT

from .conftest import run_bench
from .test_steps import GatedCheckpointer, MiB, names, state_of

OPTIONS: dict[str, Any] = {"chunk_size": MiB, "num_buffers": 4}
LOSS = {1: 0.9, 2: 0.3, 3: 0.7, 4: 0.1, 5: 0.8}


async def test_best_n_keeps_the_best_on_disk_and_records_the_metadata(tmp_path: Path) -> None:
    async with CheckpointManager(tmp_path, best_n=2, best_metric="loss", **OPTIONS) as mgr:
        for step, loss in LOSS.items():
            assert await mgr.maybe_save(step, state_of(step), metrics={"loss": loss})
        await mgr.wait()
        listed = await mgr.steps()
    assert mgr.stats.deleted == [1, 3]  # 1 after 3 committed (2 and 3 the best, 3 newest), then 3
    assert names(tmp_path) == ["step-2", "step-4", "step-5"]  # best 4 and 2; 5 is the newest
    record = json.loads((tmp_path / "step-4" / COMMIT).read_text())
    assert record["metadata"]["metrics"] == {"loss": 0.1}
    assert record["metadata"]["asyncckpt_version"] and record["world_size"] == 1
    assert [(r.step, (r.metadata or {})["metrics"]) for r in listed] == [
        (2, {"loss": 0.3}),
        (4, {"loss": 0.1}),
        (5, {"loss": 0.8}),
    ]


async def test_the_only_committed_step_is_never_deleted(tmp_path: Path) -> None:
    async with CheckpointManager(
        tmp_path, best_n=1, best_metric="loss", keep_younger_than=1e-9, **OPTIONS
    ) as mgr:
        await mgr.maybe_save(1, state_of(1))  # no metric: never "best", and too old at once
        await mgr.wait()
    assert mgr.stats.deleted == [] and names(tmp_path) == ["step-1"]


async def test_a_record_without_metadata_stays_readable(tmp_path: Path) -> None:
    async with CheckpointManager(tmp_path, keep_last=1, **OPTIONS) as mgr:
        await mgr.maybe_save(1, state_of(1))
        await mgr.wait()
        path = tmp_path / "step-1" / COMMIT
        old = json.loads(path.read_text())
        del old["metadata"]  # as written before this release
        path.write_text(json.dumps(old))
        [record] = await mgr.steps()
        assert record.step == 1 and record.metadata is None
        await mgr.maybe_save(2, state_of(2), metrics={"loss": 1.0})
    assert names(tmp_path) == ["step-2"] and mgr.stats.deleted == [1]


async def test_milestones_off_the_cadence_are_saved_and_kept(tmp_path: Path) -> None:
    """every_n_steps=3 with keep_every_n_steps=5: steps 5 and 10 were never saved (not
    multiples of 3), so the milestone policy kept nothing and keep_last=1 left step 9 only."""
    async with CheckpointManager(
        tmp_path, every_n_steps=3, keep_every_n_steps=5, keep_last=1, **OPTIONS
    ) as mgr:
        started = [step for step in range(1, 12) if await mgr.maybe_save(step, state_of(step))]
        await mgr.wait()
    assert started == [3, 5, 6, 9, 10]
    assert mgr.stats.deleted == [3, 6, 9]
    assert names(tmp_path) == ["step-10", "step-5"]


async def test_a_milestone_is_not_skipped_while_a_save_is_pending(tmp_path: Path) -> None:
    ckpt = GatedCheckpointer(**OPTIONS)
    async with (
        ckpt,
        CheckpointManager(tmp_path, when_busy="skip", keep_every_n_steps=2, checkpointer=ckpt) as mgr,
    ):
        assert await mgr.maybe_save(1, state_of(1))  # staged; its write waits at the gate
        waiting = asyncio.create_task(mgr.maybe_save(2, state_of(2)))  # a milestone: it waits
        ckpt.gate.set()
        assert await waiting
    assert mgr.stats.skipped == [] and mgr.stats.saved == [1, 2] and [s for s, _ in mgr.stats.waited] == [2]


async def test_every_seconds_follows_the_injected_clock(tmp_path: Path) -> None:
    clock = [1000.0]
    async with CheckpointManager(tmp_path, every_seconds=60, clock=lambda: clock[0], **OPTIONS) as mgr:
        started = []
        for step, at in enumerate((1000.0, 1030.0, 1059.9, 1060.0, 1100.0, 1130.0), start=1):
            clock[0] = at
            if await mgr.maybe_save(step, state_of(step)):
                started.append(step)
            await mgr.wait()
    assert started == [1, 4, 6]  # at 1000, then 60 s after it (1060), then 70 s after that


async def test_continuous_saves_whenever_the_previous_save_is_done(tmp_path: Path) -> None:
    ckpt = GatedCheckpointer(**OPTIONS)
    async with ckpt, CheckpointManager(tmp_path, continuous=True, checkpointer=ckpt) as mgr:
        assert await mgr.maybe_save(1, state_of(1))  # its write waits at the gate
        assert not await mgr.maybe_save(2, state_of(2))  # pending: not due, neither waited nor skipped
        ckpt.gate.set()
        await mgr.wait()
        assert await mgr.maybe_save(3, state_of(3))
    assert mgr.stats.saved == [1, 3] and mgr.stats.skipped == [] and mgr.stats.waited == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"every_n_steps": 10, "every_seconds": 60},
         "choose one cadence, got every_n_steps=10 and every_seconds=60"),
        ({"best_n": 2}, "best_n and best_metric go together"),
        ({"best_n": 2, "best_metric": "loss", "best_mode": "up"},
         "best_mode must be one of min, max, got 'up'"),
        ({"keep_younger_than": "1h"}, "keep_younger_than must be a positive number of seconds, got '1h'"),
        ({"clock": 5}, "clock must be a callable returning seconds, got 5"),
    ],
)  # fmt: skip
def test_bad_policies_are_refused_before_any_io(tmp_path: Path, kwargs: dict[str, Any], message: str) -> None:
    root = tmp_path / "run"
    with pytest.raises(ConfigError, match=message):
        CheckpointManager(root, **kwargs, **OPTIONS)
    assert not root.exists()


HUGE = 10**400  # an int Python holds, a float cannot: float() and math.isfinite() overflow


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"checkpointer": 5}, "checkpointer must be an AsyncCheckpointer, got 5"),
        ({"checkpointer": "fast"}, "checkpointer must be an AsyncCheckpointer, got 'fast'"),
        ({"keep_younger_than": HUGE}, r"keep_younger_than must be a positive number of seconds, got 1000"),
        ({"every_seconds": HUGE}, r"every_seconds must .*got 10000000000000000000\.\.\. \(401 characters\)"),
        ({"save_on_signal": signal.SIGUSR1, "preempt_deadline_s": HUGE}, "preempt_deadline_s must be"),
        ({"local": "LOCAL", "drain_bandwidth": HUGE}, "drain_bandwidth must be a positive number"),
    ],
)  # fmt: skip
def test_a_wrong_type_or_a_huge_number_is_a_config_error_naming_it(
    tmp_path: Path, kwargs: dict[str, Any], message: str
) -> None:
    """checkpointer=5 raised AttributeError ('int' object has no attribute 'storage'); seconds
    of 10**400 raised OverflowError from math.isfinite."""
    if kwargs.get("local") == "LOCAL":
        kwargs = {**kwargs, "local": tmp_path / "local"}
    with pytest.raises(ConfigError, match=message):
        CheckpointManager(tmp_path / "run", **kwargs)
    assert list(tmp_path.iterdir()) == []


async def test_huge_counts_are_accepted_and_a_huge_metric_refused(tmp_path: Path) -> None:
    async with CheckpointManager(tmp_path, keep_last=HUGE, keep_every_n_steps=HUGE, **OPTIONS) as mgr:
        for step in (1, 2):
            await mgr.maybe_save(step, state_of(step))
        with pytest.raises(ConfigError, match=r"metric 'loss' must be finite, got 1000"):
            await mgr.maybe_save(3, state_of(3), metrics={"loss": HUGE})
    assert mgr.stats.saved == [1, 2] and mgr.stats.deleted == []


async def test_a_numpy_integer_step_is_a_step(tmp_path: Path) -> None:
    """``maybe_save(np.int64(step), ...)`` (a step counted in NumPy) was refused: "step must be
    a non-negative integer, got 3"."""
    async with CheckpointManager(tmp_path, keep_last=1, **OPTIONS) as mgr:
        for step in np.arange(1, 4, dtype=np.int64):
            assert await mgr.maybe_save(step, state_of(int(step)))
        with pytest.raises(ConfigError, match=r"step must be a non-negative integer, got (np\.)?True"):
            await mgr.maybe_save(np.True_, state_of(4))  # type: ignore[arg-type]
        await mgr.wait()
        assert await mgr.restore() == 3
    assert mgr.stats.saved == [1, 2, 3] and all(type(s) is int for s in mgr.stats.saved)
    assert json.loads((tmp_path / "step-3" / COMMIT).read_text())["step"] == 3


async def test_a_restart_without_restore_over_later_steps_is_refused(tmp_path: Path) -> None:
    """A second run that did not restore() saved steps 1-3 beside the first run's 4 and 5: its
    next restart restored step 5, the first run's, and this run's progress was lost."""
    async with CheckpointManager(tmp_path, keep_last=2, **OPTIONS) as first:
        for step in range(1, 6):
            await first.maybe_save(step, state_of(step))
    async with CheckpointManager(tmp_path, keep_last=2, **OPTIONS) as second:
        with pytest.raises(ConfigError, match=r"holds committed steps \[4, 5\] of an earlier run"):
            await second.maybe_save(1, state_of(1))
    assert names(tmp_path) == ["step-4", "step-5"] and second.stats.saved == []
    async with CheckpointManager(tmp_path, keep_last=2, **OPTIONS) as rolled_back:
        assert await rolled_back.restore() == 5
        assert await rolled_back.maybe_save(3, state_of(3))  # after restore(): a rollback, as asked
    assert rolled_back.stats.saved == [3]


async def test_bad_metrics_are_refused_before_any_io(tmp_path: Path) -> None:
    async with CheckpointManager(tmp_path, **OPTIONS) as mgr:
        with pytest.raises(ConfigError, match="metric 'loss' must be finite, got nan"):
            await mgr.maybe_save(1, state_of(1), metrics={"loss": math.nan})
        with pytest.raises(ConfigError, match="metric 'lr' must be a number, got '1e-3'"):
            await mgr.maybe_save(2, state_of(2), metrics={"lr": "1e-3"})
    assert names(tmp_path) == [] and mgr.stats.saved == []


async def two_steps(root: Path) -> None:
    async with CheckpointManager(root, **OPTIONS) as mgr:
        await mgr.maybe_save(1, state_of(1), metrics={"loss": 0.5, "acc": 0.25})
        await mgr.maybe_save(2, state_of(2))


def test_ls_prints_a_table_and_json(tmp_path: Path) -> None:  # not async: it waits on a child
    asyncio.run(two_steps(tmp_path))
    (tmp_path / "step-3").mkdir()  # a step that never committed
    table = run_bench("ls", str(tmp_path), cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == [
        "step",
        "state",
        "committed",
        "(UTC)",
        "ranks",
        "bytes",
        "asyncckpt",
        "metrics",
    ]
    assert lines[2].split()[:2] == ["1", "committed"] and lines[2].endswith("acc=0.25 loss=0.5")
    assert lines[4].split() == ["3", "uncommitted"]
    assert lines[-1] == f"3 step(s) under {tmp_path}, 2 committed"
    listing = run_bench("ls", str(tmp_path), "--json", cwd=tmp_path)
    doc = json.loads(listing.stdout)
    assert [(s["step"], s["committed"], s.get("metrics")) for s in doc["steps"]] == [
        (1, True, {"loss": 0.5, "acc": 0.25}),
        (2, True, {}),
        (3, False, None),
    ]
    assert doc["steps"][0]["world_size"] == 1 and doc["steps"][0]["size_bytes"] > 400_000


def test_ls_shows_a_metric_that_is_not_a_number(tmp_path: Path) -> None:
    """A record written by something else (``"loss": "n/a"``): ls died in ``{v:g}`` with a
    ValueError traceback."""
    asyncio.run(two_steps(tmp_path))
    path = tmp_path / "step-1" / COMMIT
    record = json.loads(path.read_text())
    record["metadata"]["metrics"] = {"loss": "n/a", "acc": 0.25}
    path.write_text(json.dumps(record))
    table = run_bench("ls", str(tmp_path), cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[2].endswith("acc=0.25 loss='n/a'")


async def test_a_step_whose_record_is_unreadable_is_kept_and_said_so(tmp_path: Path) -> None:
    """Its record damaged, step 1 stopped the manager's start (IntegrityError); were it read,
    retention would judge it. It is kept and listed in stats.left, and later steps are pruned."""
    async with CheckpointManager(tmp_path, **OPTIONS) as mgr:
        await mgr.maybe_save(1, state_of(1))
    (tmp_path / "step-1" / COMMIT).write_text('{"step": 1, "world_size": ')  # cut short
    async with CheckpointManager(tmp_path, keep_last=1, **OPTIONS) as mgr:
        for step in (2, 3):
            await mgr.maybe_save(step, state_of(step))
    assert mgr.stats.saved == [2, 3] and mgr.stats.deleted == [2] and mgr.stats.failed == []
    assert [step for step, _ in mgr.stats.left] == [1] and "unreadable" in mgr.stats.left[0][1]
    assert names(tmp_path) == ["step-1", "step-3"]


def test_ls_lists_an_unreadable_step_and_exits_1(tmp_path: Path) -> None:
    asyncio.run(two_steps(tmp_path))
    (tmp_path / "step-1" / COMMIT).write_text("not json")
    table = run_bench("ls", str(tmp_path), cwd=tmp_path)
    assert table.returncode == 1 and "Traceback" not in table.stderr
    lines = table.stdout.splitlines()
    assert lines[2].split() == ["1", "unreadable"] and lines[3].split()[:2] == ["2", "committed"]
    assert lines[-1] == f"2 step(s) under {tmp_path}, 1 committed, 1 unreadable"
    assert table.stderr.startswith("asyncckpt.bench ls: step 1:") and "not a JSON record" in table.stderr
    listing = run_bench("ls", str(tmp_path), "--json", cwd=tmp_path)
    assert listing.returncode == 1
    first = json.loads(listing.stdout)["steps"][0]
    assert first["step"] == 1 and not first["committed"] and "not a JSON record" in first["unreadable"]


def test_ls_of_a_missing_root_is_one_line_and_rc_2(tmp_path: Path) -> None:
    run = run_bench("ls", str(tmp_path / "nowhere"), cwd=tmp_path)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.startswith("asyncckpt.bench ls: error:") and len(run.stderr.splitlines()) == 1

"""The thread-budget rule: the library leaves its event loop a core, the bench CLI uses the
MLPerf rule (CPUs ÷ ranks on this node), and every result records which rule sized it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from asyncckpt import AsyncCheckpointer, CheckpointConfig, ConfigError
from asyncckpt.bench.cli import build_parser, plan_from_args
from asyncckpt.engine import pipeline
from asyncckpt.modes import ThreadBudgetRule, choices
from asyncckpt.node.topology import local_ranks, thread_budget, usable_cpus
from asyncckpt.results.records import SaveResult
from asyncckpt.sources.dgen import DgenSource

from .conftest import ROOT
from .result_schema import assert_valid

MiB = 2**20
T = TypeVar("T")
LAUNCHER_PREFIXES = ("OMPI_", "PMI", "SLURM_", "MV2_", "MPI_LOCAL", "LOCAL_WORLD_SIZE", "LOCAL_RANK")


@pytest.mark.parametrize(
    ("cpus", "env", "mlperf", "leave"),
    [
        (2, {}, 2, 1),  # the 2-core reference VM: one core for generation, one for the loop
        (1, {}, 1, 1),  # never below one thread
        (192, {"OMPI_COMM_WORLD_LOCAL_SIZE": "4", "OMPI_COMM_WORLD_SIZE": "64"}, 48, 47),
        (8, {"LOCAL_WORLD_SIZE": "8"}, 1, 1),
        (10, {"MPI_LOCALNRANKS": "4"}, 2, 1),  # every rank's loop keeps a core of its own share
    ],
)
def test_rules(cpus: int, env: dict[str, str], mlperf: int, leave: int) -> None:
    assert thread_budget(env=env, cpus=cpus, rule="mlperf").threads == mlperf
    budget = thread_budget(env=env, cpus=cpus, rule="leave_loop_core")
    assert (budget.threads, budget.rule, budget.rule_used) == (leave, "leave_loop_core", "leave_loop_core")
    assert thread_budget(3, env=env, cpus=cpus, rule="leave_loop_core").rule_used == "override"


def test_config_default_and_validation() -> None:
    assert CheckpointConfig().thread_budget == "leave_loop_core"
    assert choices(ThreadBudgetRule) == ("leave_loop_core", "mlperf")
    with pytest.raises(ConfigError, match="thread_budget must be one of leave_loop_core, mlperf"):
        CheckpointConfig(thread_budget="all_cores")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="unknown option"):
        AsyncCheckpointer(thread_rule="mlperf")


def _share() -> int:
    return usable_cpus() // local_ranks()[0]


async def _save(**options: object) -> SaveResult:
    async with AsyncCheckpointer(chunk_size=MiB, num_buffers=2, **options) as ckpt:
        return await ckpt.save("null://budget", 3 * MiB)


async def test_library_default_leaves_the_loop_a_core() -> None:
    result = await _save()
    m = result.metadata
    assert m.thread_budget_rule == "leave_loop_core"
    assert m.thread_budget_threads == max(1, _share() - 1)
    if _share() >= 2:  # e.g. the 2-core VM: 1 generator thread, not 2
        assert m.thread_budget_threads < _share()
    assert m.cpu_nice == 10  # fills and checksums at niceness 10 (SCHED_IDLE only if asked)
    doc = result.to_dict()
    assert doc["metadata"]["thread_budget_rule"] == "leave_loop_core"
    assert SaveResult.from_dict(json.loads(json.dumps(doc))).metadata == m


async def test_rule_and_override_are_recorded() -> None:
    mlperf = (await _save(thread_budget="mlperf")).metadata
    assert (mlperf.thread_budget_rule, mlperf.thread_budget_threads) == ("mlperf", max(1, _share()))
    forced = (await _save(gen_threads=3)).metadata
    assert (forced.thread_budget_rule, forced.thread_budget_threads) == ("override", 3)
    # (mlperf's own cpu_nice / cpu_idle: tests/test_loop_quiet.py, in a fresh process, since
    # dgen-py's pool keeps whatever priority an earlier save in this one gave it)


async def test_a_whole_object_save_records_the_shared_threads_and_a_load_records_none(tmp_path: Path) -> None:
    uri = str(tmp_path / "whole.bin")
    async with AsyncCheckpointer(chunk_size=MiB, num_buffers=2) as ckpt:
        saved = await ckpt.save(uri, 3 * MiB, method="preallocate")
        loaded = await ckpt.load(uri)
    m = saved.metadata
    assert (m.cpu_nice, m.cpu_idle, m.cpu_pinned) == (0, False, False)  # not the lowered threads
    assert (loaded.metadata.cpu_nice, loaded.metadata.cpu_idle, loaded.metadata.cpu_pinned) == (None,) * 3


def test_cli_plan_uses_the_mlperf_rule() -> None:
    parser = build_parser()
    assert plan_from_args(parser.parse_args(["null://x", "--mode", "save"])).config.thread_budget == "mlperf"
    chosen = parser.parse_args(["null://x", "--mode", "save", "--thread-budget", "leave_loop_core"])
    assert plan_from_args(chosen).config.thread_budget == "leave_loop_core"
    for switch, value in (("auto", None), ("on", True), ("off", False)):
        config = plan_from_args(
            parser.parse_args(["null://x", "--mode", "save", "--cpu-idle", switch])
        ).config
        assert config.cpu_idle is value


def test_cli_run_records_the_mlperf_rule(tmp_path: Path) -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_PREFIXES)}
    proc = subprocess.run(
        [sys.executable, "-m", "asyncckpt.bench", "null://x", "--size", "2MiB", "--chunk-size", "1MiB",
         "--mode", "save", "--json", "r.json"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
        env={**clean, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    assert_valid(doc)
    m = doc["results"][0]["metadata"]
    assert m["thread_budget_rule"] == "mlperf"
    assert m["thread_budget_threads"] == max(1, m["usable_cpus"] // m["local_ranks"])
    assert (m["cpu_nice"], m["cpu_idle"], m["cpu_pinned"]) == (0, False, False)
    assert "by the mlperf rule" in proc.stdout  # the report says which rule sized the threads
    assert "Event-loop lag:" in proc.stdout  # and the CLI reports its own lag


async def test_result_building_reads_package_metadata_once() -> None:
    """Every save builds its result on the loop thread; reading the installed distributions'
    metadata there cost ≈ 5 ms of CPU per save (a stall a training loop would feel)."""
    from asyncckpt.engine import runinfo

    await _save()
    before = runinfo._package_versions.cache_info()
    result = await _save()
    after = runinfo._package_versions.cache_info()
    assert after.misses == before.misses and after.hits > before.hits
    assert result.metadata.versions == runinfo.package_versions()
    assert runinfo.package_versions() is not runinfo.package_versions()  # callers get their own


class _Overlap:
    """Counts fills and checksums running at once. Each side, once inside, waits (briefly) for
    the other to arrive, so whenever the pipeline lets them overlap they are seen overlapping."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.active = {"fill": 0, "crc": 0}
        self.peak = 0

    def run(self, kind: str, other: str, fn: Callable[[], T]) -> T:
        with self.cond:
            self.active[kind] += 1
            self.peak = max(self.peak, sum(self.active.values()))
            self.cond.notify_all()
            self.cond.wait_for(lambda: self.active[other] > 0, timeout=0.05)
        try:
            return fn()
        finally:
            with self.cond:
                self.active[kind] -= 1


@pytest.mark.parametrize(("rule", "peak"), [("leave_loop_core", 1), ("mlperf", 2)])
async def test_fills_and_checksums_take_turns_when_the_loop_keeps_a_core(
    monkeypatch: pytest.MonkeyPatch, rule: str, peak: int
) -> None:
    """The generator's threads are the pipeline's whole CPU use under leave_loop_core: a CRC
    beside a fill would take the core the rule leaves to the event loop."""
    seen = _Overlap()
    fill, crc = DgenSource.fill_sync, pipeline.timed_crc
    monkeypatch.setattr(DgenSource, "fill_sync", lambda s, b: seen.run("fill", "crc", lambda: fill(s, b)))
    monkeypatch.setattr(pipeline, "timed_crc", lambda v: seen.run("crc", "fill", lambda: crc(v)))
    async with AsyncCheckpointer(chunk_size=MiB, num_buffers=4, thread_budget=rule) as ckpt:
        result = await ckpt.save("null://turns", 8 * MiB)
    assert result.chunks == 8 and all(r.checksum is not None for r in result.records)
    assert seen.peak == peak


def test_the_host_staging_copy_uses_the_whole_share() -> None:
    # the caller waits for that copy, so the core left to its loop would only sit idle
    lib = thread_budget(rule="leave_loop_core", env={}, cpus=8)
    assert (lib.threads, lib.share, lib.blocked_threads) == (7, 8, 8)
    assert thread_budget(rule="mlperf", env={}, cpus=8).blocked_threads == 8
    assert thread_budget(3, rule="leave_loop_core", env={}, cpus=8).blocked_threads == 3

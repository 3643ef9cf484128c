"""CPU cost per byte in every result: present, positive and consistent (each stage and their sum
no more than the total it is part of) for saves into null://, into a file, through a writer
process, and for loads. Mechanisms only: no figure is compared with a speed."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from asyncckpt import AsyncCheckpointer
from asyncckpt.cpu import CpuTally, helper_cpu, thread_cpu_call
from asyncckpt.results.records import LoadResult, RunResult, SaveResult, result_from_dict
from asyncckpt.units import MiB

CHUNK = 1 * MiB
SIZE = 24 * MiB + 5
# the stages and the total are read from different clocks (a thread's, the process's) at
# slightly different moments; a stage may exceed its total by this much and no more
SLACK_S = 0.005


def within(part: float, whole: float) -> bool:
    return part <= whole * 1.02 + SLACK_S


def assert_consistent(r: RunResult, *, stages: set[str], in_process: set[str]) -> None:
    """Fields present and positive; every stage within the CPU of the process it ran in."""
    assert r.cpu_s is not None and r.cpu_s > 0
    assert r.cpu_total_s is not None and r.cpu_s_per_gb is not None and r.cpu_s_per_gb > 0
    assert r.cpu_s_per_gb == pytest.approx(r.cpu_total_s / (r.size_bytes / 1e9))
    assert set(r.cpu_stages_s) == stages
    assert all(v > 0 for v in r.cpu_stages_s.values()), r.cpu_stages_s
    assert within(sum(r.cpu_stages_s.values()), r.cpu_total_s), (r.cpu_stages_s, r.cpu_total_s)
    here = sum(v for k, v in r.cpu_stages_s.items() if k in in_process)
    assert within(here, r.cpu_s), (r.cpu_stages_s, r.cpu_s)
    if r.writer_cpu_s is None:
        assert r.cpu_scope == "process"
    else:
        assert r.cpu_scope == "process+writer" and r.writer_cpu_s > 0
        elsewhere = sum(v for k, v in r.cpu_stages_s.items() if k not in in_process)
        assert within(elsewhere, r.writer_cpu_s), (r.cpu_stages_s, r.writer_cpu_s)
    # the JSON form carries them, and reads back to the same figures
    data = r.to_dict(include_records=True)
    assert data["cpu_s_per_gb"] == r.cpu_s_per_gb and data["cpu_scope"] == r.cpu_scope
    back = result_from_dict(data)
    assert back.cpu_stages_s == r.cpu_stages_s and back.cpu_s_per_gb == r.cpu_s_per_gb
    assert "CPU-s/GB" in str(r)


async def test_save_into_null_counts_generation_and_checksum() -> None:
    async with AsyncCheckpointer(chunk_size=CHUNK, num_buffers=3, seed=3) as ckpt:
        r = await ckpt.save("null://cpu", SIZE)
    assert isinstance(r, SaveResult) and r.writer_cpu_s is None
    # null:// does no storage work, so no storage stage is claimed
    assert_consistent(r, stages={"generation", "checksum"}, in_process={"generation", "checksum"})
    assert sum(rec.checksum_cpu_s for rec in r.records) == pytest.approx(r.cpu_stages_s["checksum"])


async def test_file_save_and_load_count_the_storage_calls(tmp_path: Path) -> None:
    target = tmp_path / "ckpt.bin"
    async with AsyncCheckpointer(chunk_size=CHUNK, num_buffers=3, seed=4) as ckpt:
        saved = await ckpt.save(target, SIZE)
        loaded = await ckpt.load(target, verify=True)
        unverified = await ckpt.load(target, verify=False)
    everything = {"generation", "checksum", "storage", "verify"}
    assert_consistent(saved, stages={"generation", "checksum", "storage"}, in_process=everything)
    assert isinstance(loaded, LoadResult)
    assert_consistent(loaded, stages={"verify", "storage"}, in_process=everything)
    assert sum(rec.verify_cpu_s for rec in loaded.records) == pytest.approx(loaded.cpu_stages_s["verify"])
    assert_consistent(unverified, stages={"storage"}, in_process=everything)


async def test_writer_process_cpu_is_counted_and_said_so(tmp_path: Path) -> None:
    target = tmp_path / "iso.bin"
    async with AsyncCheckpointer(chunk_size=CHUNK, num_buffers=3, seed=5, isolation="process") as ckpt:
        saved = await ckpt.save(target, SIZE)
        loaded = await ckpt.load(target, verify=True)
    for r, stages in ((saved, {"generation", "checksum", "storage"}), (loaded, {"verify", "storage"})):
        assert r.metadata.extra.get("isolation") == "process"
        # the writes (and reads) ran in the child: storage counts against the writer's CPU
        assert_consistent(r, stages=stages, in_process={"generation", "checksum", "verify"})
        assert r.writer_cpu_s is not None and r.cpu_total_s == pytest.approx(r.cpu_s + r.writer_cpu_s)
        assert "writer process" in str(r)


async def test_regenerate_verify_counts_the_generator_pool(tmp_path: Path) -> None:
    """dgen-py fills on its own threads: the stage must count them, not the idle caller."""
    target = tmp_path / "regen.bin"
    async with AsyncCheckpointer(chunk_size=CHUNK, num_buffers=3, seed=6) as ckpt:
        saved = await ckpt.save(target, SIZE)
        loaded = await ckpt.load(target, verify="regenerate")
    assert_consistent(loaded, stages={"verify", "storage"}, in_process={"verify", "storage"})
    # regeneration costs about what generation did; thread CPU of the calling thread alone is ~0
    assert loaded.cpu_stages_s["verify"] > 0.3 * saved.cpu_stages_s["generation"]


def test_older_results_read_with_cpu_unknown() -> None:
    """A 2.1 document has no CPU fields: they read as unknown, never as zero cost."""
    from asyncckpt.results.metrics import Percentiles
    from asyncckpt.results.records import RunMetadata

    meta = RunMetadata(
        backend="null", uri="null://x", chunk_size=1, num_buffers=1, pool_bytes=1, max_in_flight=1,
        generator="dgen", seed=1, gen_threads=1, gen_threads_requested=1, fsync=False, direct_io=False,
        direct_io_reason="", usable_cpus=1, local_ranks=1, local_ranks_source="default", event_loop="asyncio",
        hostname="h", python="3.11", versions={},
    )  # fmt: skip
    zero = Percentiles(0.0, 0.0, 0.0, 0.0)
    doc = SaveResult.from_records(
        [], gen_s=0.0, method="streaming", size_bytes=10, wall_s=1.0, open_s=0.0, close_s=0.0,
        close_detail={}, wait_free_s=0.0, wait_data_s=0.0, chunks=0, bottleneck_counts={"I/O": 0},
        chunk_latency_s=zero, loop_lag_s=zero, peak_rss_bytes=0, baseline_rss_bytes=0, metadata=meta,
    ).to_dict()  # fmt: skip
    for key in ("cpu_s", "writer_cpu_s", "cpu_scope", "cpu_stages_s", "cpu_total_s", "cpu_s_per_gb"):
        doc.pop(key)
    old = result_from_dict(doc)
    assert old.cpu_s is None and old.cpu_s_per_gb is None and old.cpu_stages_s_per_gb == {}
    assert "not measured" in str(old)


def test_thread_clock_counts_only_the_calling_thread() -> None:
    """The stage clock: busy work counts, sleeping does not, and tallies add up across calls."""
    tally = CpuTally()

    def spin(cpu_seconds: float) -> None:  # busy until this thread has used that much CPU
        end = time.thread_time() + cpu_seconds
        while time.thread_time() < end:
            pass

    _, busy = thread_cpu_call(spin, 0.02)
    _, idle = thread_cpu_call(time.sleep, 0.05)
    tally.add(busy)
    tally.add(idle)
    assert busy >= 0.02 and idle < 0.01
    assert tally.total == pytest.approx(busy + idle)
    assert helper_cpu() >= 0.0


async def test_summaries_carry_the_cost() -> None:
    """The CLI's per-phase summary and a multi-rank report's per-rank entries show it too."""
    from asyncckpt.bench.aggregate import aggregate_checkpoint
    from asyncckpt.bench.report import format_phases
    from asyncckpt.bench.runner import method_stats

    async with AsyncCheckpointer(chunk_size=CHUNK, num_buffers=2, seed=7) as ckpt:
        results = [await ckpt.save("null://sum", 4 * CHUNK) for _ in range(2)]
    stats = method_stats(list(results))
    assert stats["cpu_s_per_gb_mean"] == pytest.approx(sum(r.cpu_s_per_gb or 0 for r in results) / 2)
    assert "CPU-s/GB" in format_phases({"streaming": stats})
    ranks = aggregate_checkpoint([r.to_dict() for r in results])["per_rank"]
    assert [p["cpu_s_per_gb"] for p in ranks] == [r.cpu_s_per_gb for r in results]

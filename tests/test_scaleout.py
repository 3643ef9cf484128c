"""Plain-data parts of scale-out: aggregation math, presets, DLIO configs, rank detection."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from asyncckpt.bench.aggregate import CHECKPOINT_KEYS, aggregate_checkpoint, summarize
from asyncckpt.bench.cli import build_parser
from asyncckpt.bench.dlio import load_workload, parse_workload
from asyncckpt.bench.mpi_runner import shard_uri
from asyncckpt.bench.presets import PRESETS, get_preset
from asyncckpt.bench.scaleout import parse_with_presets
from asyncckpt.errors import ConfigError
from asyncckpt.node import topology
from asyncckpt.node.distributed import Comm, get_comm, launched_by_mpi, rank_info_from_env


def rank_result(size: int, wall: float, counts: dict[str, int]) -> dict[str, Any]:
    return {
        "size_bytes": size,
        "wall_s": wall,
        "bottleneck_counts": counts,
        "bottleneck": max(counts, key=lambda k: counts[k]),
        "metadata": {"gen_threads": 3, "local_ranks": 4},
    }


def test_mlperf_rule_uses_the_slowest_rank() -> None:
    ranks = [
        rank_result(100, 1.0, {"I/O": 3, "Generation": 1}),
        rank_result(100, 4.0, {"I/O": 0, "Generation": 4}),
        rank_result(100, 2.0, {"I/O": 4, "Generation": 0}),
    ]
    c = aggregate_checkpoint(ranks, phase_wall_s=4.2)
    assert set(CHECKPOINT_KEYS) <= set(c)
    assert c["total_bytes"] == 300
    assert c["duration_s"] == 4.0
    assert c["throughput_bps"] == 75.0  # 300 B / 4 s, not the sum of rates
    assert c["min_rank_throughput_bps"] == 25.0
    assert c["aggregate_bandwidth_bps"] == 100 + 25 + 50
    assert c["slowest_rank"]["rank"] == 1 and c["fastest_rank"]["rank"] == 0
    assert c["straggler_ratio"] == 4.0
    assert c["bottleneck_counts"] == {"I/O": 7, "Generation": 5}
    assert c["rank_bottlenecks"] == {"I/O": 2, "Generation": 1}
    assert c["per_rank"][1]["gen_threads"] == 3 and c["phase_wall_s"] == 4.2


def test_summary_mean_and_sample_stdev() -> None:
    cps = [aggregate_checkpoint([rank_result(100, w, {"I/O": 1})]) for w in (1.0, 2.0, 4.0)]
    s = summarize(cps)
    assert s["checkpoints"] == 3 and s["total_bytes"] == 100
    assert s["duration_s_mean"] == pytest.approx(7 / 3)
    assert s["duration_s_stdev"] == pytest.approx(1.5275252, rel=1e-6)
    assert s["throughput_bps_mean"] == pytest.approx((100 + 50 + 25) / 3)
    assert summarize(cps[:1])["throughput_bps_stdev"] == 0.0
    assert s["slowest_rank_counts"] == {"0": 3}
    with pytest.raises(ValueError):
        aggregate_checkpoint([])


def test_presets_shapes_and_scale() -> None:
    # the presets are MLPerf Storage's workload files (sizes: tests/test_dlio_layout.py)
    assert {n: p.ranks for n, p in PRESETS.items()} == {
        "llama3-8b": 8,
        "llama3-70b": 64,
        "llama3-405b": 512,
        "llama3-1t": 1024,
    }
    p = get_preset("llama3-70b")
    assert p.describe(0.5, 8)["written_fraction"] == 8 / 64
    with pytest.raises(ConfigError, match="--scale"):
        p.describe(0, 8)
    with pytest.raises(ConfigError, match="'llama2'"):
        get_preset("llama2")


def test_dlio_config_maps_known_keys_and_reports_the_rest(tmp_path: Path) -> None:
    f = tmp_path / "w.yaml"
    f.write_text(
        "model: {name: llama_70b}\n"
        "workflow: {checkpoint: true}\n"
        "checkpoint:\n"
        "  checkpoint_folder: s3://bucket/checkpoints\n"
        "  steps_between_checkpoints: 100\n"
        "  num_checkpoints_write: 10\n"
        "  num_checkpoints_read: 10\n"
        "  fsync: true\n"
        "  compression: zstd\n"
        "  streaming:\n"
        "    enabled: true\n"
        "    chunk_size: 33554432\n"
        "    num_buffers: 64\n"
        "    use_dgen: false\n"
        "    backend: s3dlio\n"
        "    turbo: on\n"
    )
    wl = load_workload(f)
    assert wl.defaults == {
        "target": "s3://bucket/checkpoints",
        "num_checkpoints_write": 10,
        "num_checkpoints_read": 10,
        "no_fsync": False,
        "method": "streaming",
        "chunk_size": 33554432,
        "num_buffers": 64,
        "generator": "numpy",
        "backend": "s3dlio",
    }
    assert wl.unknown == ["checkpoint.compression", "checkpoint.streaming.turbo"]
    assert "checkpoint.steps_between_checkpoints" in wl.unused and wl.model is None  # no shape: no layout
    assert any(u.startswith("model: (no num_layers") for u in wl.unused)
    unknown, unused = wl.warnings()
    assert "checkpoint.compression, checkpoint.streaming.turbo" in unknown and str(f) in unknown
    assert "model: (no num_layers" in unused and "workflow:" in unused


@pytest.mark.parametrize(
    ("doc", "match"),
    [
        ([1], "mapping at the top level"),
        ({"dataset": {}}, "no 'checkpoint:' section"),
        ({"checkpoint": {"num_checkpoints_write": "ten"}}, "num_checkpoints_write must be an integer"),
        (
            {"checkpoint": {"streaming": {"chunk_size": "32 furlongs"}}},
            "chunk_size: cannot parse '32 furlongs'",
        ),
        ({"checkpoint": {"fsync": "yes"}}, "fsync must be true or false"),
    ],
)
def test_dlio_config_bad_values(doc: object, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_workload(doc)


def test_config_and_preset_become_overridable_defaults(tmp_path: Path) -> None:
    f = tmp_path / "w.yaml"
    f.write_text(
        "checkpoint:\n  num_checkpoints_write: 3\n  num_checkpoints_read: 2\n  streaming: {num_buffers: 6}\n"
    )
    args, info = parse_with_presets(
        build_parser(), ["--config", str(f), "--model", "llama3-8b", "--scale", "0.001"]
    )
    assert (args.repeat, args.num_buffers) == (3, 6)  # the file wins over the preset's 10 writes
    if "num_checkpoints_read" in {a.dest for a in build_parser()._actions}:  # the load path is merged
        assert args.num_checkpoints_read == 2
    else:
        assert any("num_checkpoints_read=2 has no effect" in n for n in info.notes)
    assert info.preset is not None and info.preset["model"] == "llama3-8b"
    args, info = parse_with_presets(
        build_parser(), ["--config", str(f), "--num-buffers", "2", "--size", "1MiB"]
    )
    assert (args.num_buffers, args.size) == (2, 1 << 20)
    with pytest.raises(ConfigError, match="--scale applies to a --model"):
        parse_with_presets(build_parser(), ["--scale", "0.5"])


def test_rank_info_from_launcher_variables() -> None:
    ompi = {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "64", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}  # fmt: skip
    assert launched_by_mpi(ompi) and not launched_by_mpi({})
    info = rank_info_from_env(ompi)
    assert (info.rank, info.size, info.local_rank, info.local_size, info.source) == (
        5,
        64,
        1,
        4,
        "OMPI_COMM_WORLD_RANK",
    )
    mpich = rank_info_from_env(
        {"PMI_RANK": "2", "PMI_SIZE": "8", "MPI_LOCALNRANKS": "2", "MPI_LOCALRANKID": "0"}
    )
    assert (mpich.rank, mpich.size, mpich.local_size) == (2, 8, 2)
    mv2 = rank_info_from_env({"MV2_COMM_WORLD_RANK": "1", "MV2_COMM_WORLD_SIZE": "2"})
    assert (mv2.rank, mv2.size, mv2.local_size) == (1, 2, 1)
    assert rank_info_from_env({}) == rank_info_from_env({"UNRELATED": "1"})
    with pytest.raises(ConfigError, match=r"rank 9 .* world size 4"):
        rank_info_from_env({"PMI_RANK": "9", "PMI_SIZE": "4"})
    # the seed bug: budget divides by ranks on this node, never by the world size
    assert topology.thread_budget(env=ompi, cpus=192).threads == 48


def test_measured_local_size_wins_over_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "64")
    try:
        topology.set_local_ranks(4, "mpi4py COMM_TYPE_SHARED")
        expected = (48, 192, 4, "mpi4py COMM_TYPE_SHARED", False, "mlperf", 48)
        assert topology.thread_budget(cpus=192) == expected
    finally:
        topology.set_local_ranks(None)
    assert topology.thread_budget(cpus=192).threads == 3


def test_ranks_bound_by_the_launcher_divide_only_their_own_cpu_set() -> None:
    # 8 ranks on a 2-socket node, mpirun binds 4 to each socket: each sees 96 CPUs, shared by 4
    sockets = [frozenset(range(0, 96)), frozenset(range(96, 192))]
    masks = [sockets[r // 4] for r in range(8)]
    assert topology.cpu_sharers(masks[0], masks) == 4
    assert topology.cpu_sharers(frozenset({5}), [frozenset({i}) for i in range(8)]) == 1  # bound to cores
    try:
        topology.set_local_ranks(8, "mpi4py", sharers=4)
        budget = topology.thread_budget(cpus=96)
        assert (budget.threads, budget.local_ranks) == (24, 8)  # not 96 // 8 = 12
        # the library default keeps each rank's loop a core of that share
        assert topology.thread_budget(cpus=96, rule="leave_loop_core").threads == 23
        topology.set_local_ranks(8, "mpi4py", sharers=8)  # unbound: everyone shares everything
        assert topology.thread_budget(cpus=192).threads == 24
        with pytest.raises(ValueError, match=r"1\.\.8"):
            topology.set_local_ranks(8, "mpi4py", sharers=9)
    finally:
        topology.set_local_ranks(None)


def test_single_process_comm_and_missing_mpi4py(monkeypatch: pytest.MonkeyPatch) -> None:
    comm = get_comm({})
    assert type(comm) is Comm and comm.size == 1 and comm.is_root
    assert comm.gather({"ok": True}) == [{"ok": True}] and comm.bcast(3) == 3
    import sys

    monkeypatch.setitem(sys.modules, "mpi4py", None)  # as if not installed
    with pytest.raises(ImportError, match=r"asyncckpt\[mpi\]"):
        get_comm({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"})


def test_shard_layouts() -> None:
    assert shard_uri("/ckpt", "rank{rank:05d}.bin", 3, 8, 1) == "/ckpt/rank00003.bin"
    assert shard_uri("s3://b/run1/", "n{local_rank}/r{rank}-of-{size}", 3, 8, 1) == "s3://b/run1/n1/r3-of-8"
    for bad in ("{node}.bin", "/abs/{rank}", "../{rank}"):
        with pytest.raises(ConfigError, match="--layout"):
            shard_uri("/ckpt", bad, 0, 1, 0)


def test_parser_has_scaleout_options() -> None:
    dests = {a.dest for a in build_parser()._actions}
    assert {"model", "scale", "config", "layout", "mkdirs"} <= dests
    assert isinstance(build_parser(), argparse.ArgumentParser)

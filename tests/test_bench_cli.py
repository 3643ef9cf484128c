"""The benchmark command as a user runs it: a real subprocess, real files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import checkpoint_data, run_bench

bench = run_bench


def test_default_run_prints_results_and_cleans_up(tmp_path: Path) -> None:
    proc = bench("--size", "64MiB", "--chunk-size", "8MiB", "--json", str(tmp_path / "r.json"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Bottleneck:" in proc.stdout and "Throughput:" in proc.stdout
    data = json.loads((tmp_path / "r.json").read_text())
    (result,) = [r for r in data["results"] if r["operation"] == "save"]
    (load,) = [r for r in data["results"] if r["operation"] == "load"]
    assert load["size_bytes"] == 64 * 2**20  # the default mode saves, then loads with verification
    assert result["size_bytes"] == 64 * 2**20 and result["chunks"] == 8
    assert result["metadata"]["gen_threads"] >= 1
    assert sum(result["bottleneck_counts"].values()) == 8
    assert {"throughput_bps", "gen_bps", "io_bps", "gen_io_ratio", "overhead_pct"} <= result.keys()
    assert list(tmp_path.iterdir()) == [tmp_path / "r.json"]


def test_both_methods_to_explicit_target(tmp_path: Path) -> None:
    target = tmp_path / "ck.bin"
    proc = bench(
        str(target),
        "--size",
        "32MiB",
        "--chunk-size",
        "4MiB",
        "--method",
        "both",
        "--repeat",
        "2",
        "-q",
        "--keep",
        "--loop",
        "asyncio",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("streaming") >= 3 and proc.stdout.count("preallocate") >= 3
    assert len(checkpoint_data(target.read_bytes())) == 32 * 2**20


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--size", "0"], "--size must be > 0"),
        (["--size", "lots"], "cannot parse 'lots'"),
        # the option as typed, not the library's field name (it said chunk_size, num_buffers)
        (["--chunk-size", "1000"], "--chunk-size must be >= 4096, got 1000"),
        (["--num-buffers", "0"], "--num-buffers must be >= 1, got 0"),
        (["--max-in-flight", "0"], "--max-in-flight must be >= 1, got 0"),
        (["--stall-timeout", "-1"], "--stall-timeout must be in (0,"),
        (
            ["s3://b/x", "--part-size", "1"],
            "--part-size 1 B is below the S3 minimum of 5 MiB; raise --part-size",
        ),
        (["gopher://x/y"], "unsupported URI scheme 'gopher'"),
        (["/definitely/not/here/x.bin"], "'/definitely/not/here' of"),
        (["--repeat", "0"], "(--repeat) must be >= 1"),
        # its alias named too: it said --repeat to a user who typed --num-checkpoints-write
        (["--num-checkpoints-write", "0"], "--num-checkpoints-write (--repeat) must be >= 1"),
        # null:// keeps nothing: the default --mode both would fail its load after the saves
        (["null://x", "--size", "1MiB"], "--mode both: 'null://x' keeps nothing it is sent"),
        (["null://x", "--mode", "load"], "nothing to load; use --mode save"),
        # options the run would ignore: the figure was not measured as the command says
        (
            ["x.bin", "--mode", "load", "--size", "1MiB"],
            "--mode load only loads an existing checkpoint: --size",
        ),
        (
            ["x.bin", "--mode", "save", "--num-checkpoints-read", "3", "--drop-caches"],
            "--mode save only saves: --num-checkpoints-read, --drop-caches would have no effect",
        ),
        (["x.bin", "--size", "1MiB", "--layout", "{bogus}"], "--layout names each rank's shard"),
        # --local with a workload: a plain workload ran, the local tier unmentioned
        (
            ["r", "--local", ".", "--model", "llama3-8b", "--scale", "0.001"],
            "--local (a tiered run) does not take --model",
        ),
        # a library of another kind of store: the run measured the target's own, silently
        (
            ["x.bin", "--size", "1MiB", "--backend", "aiobotocore"],
            "--backend aiobotocore does not serve 'x.bin'",
        ),
        (["--size", "1MiB", "--backend", "s3dlio"], "--backend s3dlio does not serve"),
    ],
)
def test_bad_input_exits_nonzero_with_one_line(tmp_path: Path, args: list[str], fragment: str) -> None:
    proc = bench(*args, cwd=tmp_path)
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and not ln.startswith("usage:")]
    assert len(lines) == 1, proc.stderr
    assert fragment in lines[0]
    assert proc.stdout == ""  # before any I/O: no run, no table

"""``compare`` on recorded result files with controlled noise (generated here, seeded), and the
statistics under it checked against values worked out by hand."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from asyncckpt.bench.compare import NO_DIFFERENCE, bootstrap_ci, judge, mann_whitney_p, min_p
from asyncckpt.results.schema import SCHEMA_VERSION

from .result_schema import assert_valid

ROOT = Path(__file__).resolve().parent.parent
GiB = 2**30


def _pct(p50: float, p99: float) -> dict[str, float]:
    return {"p50": p50, "p90": (p50 + p99) / 2, "p99": p99, "max": p99 * 1.1}


def fake_result(rng: np.random.Generator, *, slowdown: float = 1.0, noise: float = 0.04) -> dict[str, Any]:
    """One save as the bench records it: 1 GiB at ~1.5 GB/s, every time figure jittered by
    ``noise`` (relative sd) and storage times multiplied by ``slowdown``."""

    def jit(x: float) -> float:
        return float(x * (1 + rng.normal(0, noise)))

    size = GiB
    write = jit(0.70) * slowdown
    close = jit(0.006)
    wall = write + close + jit(0.01)
    gen = jit(0.18)
    return {
        "schema_version": SCHEMA_VERSION,
        "operation": "save",
        "method": "streaming",
        "size_bytes": size,
        "wall_s": wall,
        "open_s": 0.004,
        "gen_s": gen,
        "write_s": write,
        "close_s": close,
        "close_detail": {"fsync_s": close, "rename_s": 0.0},
        "wait_free_s": jit(0.35),
        "wait_data_s": jit(0.005),
        "chunks": 32,
        "bottleneck_counts": {"I/O": 32, "Generation": 0},
        "chunk_latency_s": _pct(jit(0.18), jit(0.19)),
        "write_latency_s": _pct(jit(0.021) * slowdown, jit(0.036) * slowdown),
        "loop_lag_s": _pct(jit(0.00013), jit(0.0036)),
        "peak_rss_bytes": 300 * 2**20,
        "baseline_rss_bytes": 300 * 2**20 - int(jit(2**20)),
        "metadata": {
            "backend": "file",
            "uri": "/data/ck.bin",
            "direct_io": True,
            "direct_io_reason": "O_DIRECT accepted",
            "chunk_size": 32 * 2**20,
            "num_buffers": 8,
            "pool_bytes": 256 * 2**20,
            "max_in_flight": 1,
            "generator": "dgen",
            "seed": 24301,
            "gen_threads": 2,
            "gen_threads_requested": 2,
            "usable_cpus": 2,
            "local_ranks": 1,
            "local_ranks_source": "default",
            "fsync": True,
            "event_loop": "uvloop",
            "hostname": "vm",
            "python": "3.11.7",
            "versions": {"asyncckpt": "0.1.0"},
            "extra": {},
        },
        "checksum_s": jit(0.13),
        "throughput_bps": size / wall,
        "gen_bps": size / gen,
        "io_bps": size / (write + close),
        "io_s": write + close,
        "gen_io_ratio": (write + close) / gen,
        "checksum_bps": 8e9,
        "overhead_pct": 1.0,
        "bottleneck": "I/O",
        "pool_peak_over_baseline_bytes": 2**20,
    }


def recorded(path: Path, seed: int, runs: int, slowdown: float = 1.0) -> Path:
    rng = np.random.default_rng(seed)
    results = [fake_result(rng, slowdown=slowdown) for _ in range(runs)]
    doc = {
        "schema_version": SCHEMA_VERSION,
        "mode": "single",
        "size_bytes": GiB,
        "target": "/data/ck.bin",
        "summary": {},
        "results": results,
    }
    assert_valid(doc)  # the files are what the bench would have written
    path.write_text(json.dumps(doc))
    return path


def compare(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "asyncckpt.bench", "compare", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def verdicts(stdout: str) -> dict[str, str]:
    """metric label → verdict column of the first candidate."""
    out = {}
    for line in stdout.splitlines()[2:]:
        cells = [c for c in line.split("  ") if c.strip()]
        if len(cells) >= 6:
            out[cells[1].strip()] = cells[-1].strip()
    return out


def test_same_configuration_is_no_measurable_difference(tmp_path: Path) -> None:
    a = recorded(tmp_path / "a.json", seed=1, runs=8)
    b = recorded(tmp_path / "b.json", seed=2, runs=8)
    proc = compare(str(a), str(b), "--fail-on-regression", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = verdicts(proc.stdout)
    assert len(found) == 7 and set(found.values()) == {NO_DIFFERENCE}, proc.stdout
    assert "0 metric(s) worse" in proc.stdout


def test_injected_30_percent_slowdown_is_flagged(tmp_path: Path) -> None:
    a = recorded(tmp_path / "a.json", seed=1, runs=8)
    b = recorded(tmp_path / "slow.json", seed=2, runs=8, slowdown=1.3)
    proc = compare(str(a), str(b), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    found = verdicts(proc.stdout)
    assert found["throughput (open to end)"] == "WORSE"
    assert found["duration"] == "WORSE"
    assert found["write/read latency p99"] == "WORSE"
    assert found["event-loop lag p99"] == NO_DIFFERENCE  # not touched by the slowdown
    row = next(line for line in proc.stdout.splitlines() if "duration" in line)
    change, lo, hi = (float(x) for x in re.findall(r"([+-][\d.]+)%", row))
    assert 25 < change < 32 and 0 < lo < change < hi  # storage is ~97 % of the wall time
    assert compare(str(a), str(b), "--fail-on-regression", cwd=tmp_path).returncode == 1
    # the other way round it is an improvement, not a regression
    faster = verdicts(compare(str(b), str(a), cwd=tmp_path).stdout)
    assert faster["throughput (open to end)"] == "better"


def test_too_few_runs_get_no_verdict(tmp_path: Path) -> None:
    a3 = recorded(tmp_path / "a3.json", seed=1, runs=3)
    b3 = recorded(tmp_path / "b3.json", seed=2, runs=3, slowdown=1.3)
    found = verdicts(compare(str(a3), str(b3), cwd=tmp_path).stdout)
    assert found["throughput (open to end)"].startswith(
        "no verdict: n=3 vs 3 is too few for 95% confidence over 7 metric(s) (need 6+ each)"
    )
    a1 = recorded(tmp_path / "a1.json", seed=1, runs=1)
    found = verdicts(compare(str(a1), str(b3), cwd=tmp_path).stdout)
    assert found["duration"] == "no verdict: n=1 vs 3, no noise estimate"


def test_files_pooled_with_commas_give_the_rank_test_enough_runs(tmp_path: Path) -> None:
    parts = [str(recorded(tmp_path / f"a{i}.json", seed=10 + i, runs=2)) for i in range(3)]
    slow = recorded(tmp_path / "slow.json", seed=2, runs=6, slowdown=1.3)
    proc = compare(",".join(parts), str(slow), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert verdicts(proc.stdout)["throughput (open to end)"] == "WORSE"
    assert "(n=6)" in proc.stdout


def test_compare_bad_input_is_one_line(tmp_path: Path) -> None:
    a = recorded(tmp_path / "a.json", seed=1, runs=2)
    for args, fragment in (
        ([str(a)], "at least two results"),
        ([str(a), "missing.json"], "no result file"),
        ([str(a), str(a), "--alpha", "2"], "--alpha must be between 0 and 1"),
        ([str(a), str(a), "+x=1"], "compare takes no overrides"),
    ):
        proc = compare(*args, cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and fragment in proc.stderr, proc.stderr


def test_mann_whitney_exact_values() -> None:
    # worked by hand: U distribution for n=4,4 has 70 arrangements
    assert mann_whitney_p([1, 2, 3, 4], [5, 6, 7, 8]) == pytest.approx(2 / 70)
    assert mann_whitney_p([1, 3, 5, 7], [2, 4, 6, 8]) == pytest.approx(48 / 70)
    assert mann_whitney_p([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) == pytest.approx(2 / 252)
    assert mann_whitney_p([1.0, 1.0], [1.0, 1.0]) == 1.0  # all tied: nothing to see
    assert min_p(3, 3) == pytest.approx(0.1) and min_p(4, 4) == pytest.approx(2 / 70)


def test_normal_approximation_agrees_with_exact_for_larger_samples() -> None:
    rng = np.random.default_rng(3)
    a = list(rng.normal(10, 1, 25))
    b = list(rng.normal(11, 1, 25))
    exact = mann_whitney_p(a[:20], b[:20])  # n1 + n2 <= 40: exact
    approx = mann_whitney_p(a, b)  # 50: normal approximation
    assert 0 < exact < 0.05 and 0 < approx < 0.05


def test_bootstrap_is_deterministic_and_brackets_the_change() -> None:
    a = [1.0, 1.02, 0.98, 1.01, 0.99]
    b = [1.30, 1.31, 1.29, 1.32, 1.28]
    lo, hi = bootstrap_ci(a, b)
    assert (lo, hi) == bootstrap_ci(a, b)
    assert lo < 0.30 < hi and lo > 0.25
    v = judge(a, b, higher_is_better=False)
    assert v.text == "WORSE" and v.regression and v.p == pytest.approx(2 / 252)

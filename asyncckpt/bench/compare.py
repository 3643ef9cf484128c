"""Comparing saved results: which metric changed, by how much, and whether that is noise.

Storage numbers drift ±15 % run to run, so a bare "−8 %" means nothing. Each metric is
sampled once per repeated checkpoint; the verdict comes from a two-sided Mann–Whitney rank
test (no normality assumed, robust to one wild run) at ``alpha``, and the change is shown
with a bootstrap confidence interval of the ratio of means. Too few repeats for the test to
ever reach ``alpha`` is said as such, never dressed up as a verdict. Plain data in and out.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

NO_DIFFERENCE = "no measurable difference"
ALPHA = 0.05
BOOTSTRAP_ROUNDS = 4000


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    unit: str  # how the value prints: "GB/s", "s", "ms", "MiB", "x"
    higher_is_better: bool


SINGLE_METRICS = (
    Metric("throughput_bps", "throughput (open to end)", "GB/s", True),
    Metric("wall_s", "duration", "s", False),
    Metric("io_bps", "I/O rate", "GB/s", True),
    Metric("io_p50", "write/read latency p50", "ms", False),
    Metric("io_p99", "write/read latency p99", "ms", False),
    Metric("lag_p99", "event-loop lag p99", "ms", False),
    Metric("rss_delta", "memory growth", "MiB", False),
)
MPI_METRICS = (
    Metric("throughput_bps", "throughput (total ÷ slowest rank)", "GB/s", True),
    Metric("duration_s", "duration (slowest rank)", "s", False),
    Metric("min_rank_throughput_bps", "min rank throughput", "GB/s", True),
    Metric("straggler_ratio", "straggler ratio", "x", False),
)


def _single_values(r: Mapping[str, Any]) -> dict[str, float | None]:
    """One result's figures; a load's I/O side is its reads (rate while a read was in flight)."""
    load = r["operation"] == "load"
    latency = r["read_latency_s" if load else "write_latency_s"]
    return {
        "throughput_bps": r["throughput_bps"],
        "wall_s": r["wall_s"],
        "io_bps": r["read_bps" if load else "io_bps"],
        "io_p50": latency["p50"],
        "io_p99": latency["p99"],
        "lag_p99": r["loop_lag_s"]["p99"],
        "rss_delta": r["peak_rss_bytes"] - r["baseline_rss_bytes"],
    }


def samples(doc: Mapping[str, Any]) -> dict[str, dict[str, list[float]]]:
    """``{group: {metric: [one value per checkpoint]}}`` of one result document.

    Groups are phase + method (``save streaming``), plus the backend when one file holds
    several (``--compare-backends``).
    """
    out: dict[str, dict[str, list[float]]] = {}
    if doc.get("mode") == "mpi":
        for ph in doc["phases"]:
            group = out.setdefault(f"{ph['phase']} {ph['method']}", {})
            for c in ph["checkpoints"]:
                for m in MPI_METRICS:
                    group.setdefault(m.key, []).append(float(c[m.key]))
        return out
    backends = {r["metadata"]["backend"] for r in doc["results"]}
    for r in doc["results"]:
        name = f"{r['operation']} {r['method']}"
        if len(backends) > 1:
            name += f" [{r['metadata']['backend']}]"
        group = out.setdefault(name, {})
        for key, value in _single_values(r).items():
            if value is not None:
                group.setdefault(key, []).append(float(value))
    return out


def metrics_for(doc: Mapping[str, Any]) -> tuple[Metric, ...]:
    return MPI_METRICS if doc.get("mode") == "mpi" else SINGLE_METRICS


# -- statistics ---------------------------------------------------------------------------


def _u_counts(n1: int, n2: int) -> list[int]:
    """Number of arrangements giving each Mann–Whitney U (0..n1*n2), no ties."""
    # f[i][j][u]: ways with i from the first sample and j from the second giving U=u
    table: dict[tuple[int, int], list[int]] = {}

    def f(i: int, j: int) -> list[int]:
        if (i, j) in table:
            return table[(i, j)]
        if i == 0 or j == 0:
            res = [1]
        else:
            a = f(i - 1, j)  # largest element from the first sample: beats all j of the second
            b = f(i, j - 1)
            res = [0] * (i * j + 1)
            for u, n in enumerate(a):
                res[u + j] += n
            for u, n in enumerate(b):
                res[u] += n
        table[(i, j)] = res
        return res

    return f(n1, n2)


def mann_whitney_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p-value of the Mann–Whitney U test: exact without ties for small samples,
    else the normal approximation with tie correction."""
    n1, n2 = len(a), len(b)
    if n1 == 0 or n2 == 0:
        return 1.0
    pooled = sorted((v, k) for k, vs in enumerate((a, b)) for v in vs)
    ranks: list[float] = [0.0] * len(pooled)
    i = 0
    ties = 0.0
    while i < len(pooled):
        j = i
        while j + 1 < len(pooled) and pooled[j + 1][0] == pooled[i][0]:
            j += 1
        for k in range(i, j + 1):
            ranks[k] = (i + j) / 2 + 1
        t = j - i + 1
        ties += t**3 - t
        i = j + 1
    r1 = sum(rank for rank, (_, k) in zip(ranks, pooled, strict=True) if k == 0)
    u1 = r1 - n1 * (n1 + 1) / 2
    u = min(u1, n1 * n2 - u1)
    if ties == 0 and n1 + n2 <= 40:
        counts = _u_counts(n1, n2)
        total = sum(counts)
        p = 2 * sum(counts[: math.floor(u) + 1]) / total
        return min(1.0, p)
    n = n1 + n2
    sigma = math.sqrt(n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1))))
    if sigma == 0:
        return 1.0
    z = (abs(u1 - n1 * n2 / 2) - 0.5) / sigma
    return min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2)))


def min_p(n1: int, n2: int) -> float:
    """The smallest two-sided p the exact rank test can give with these sample sizes."""
    return 2 / math.comb(n1 + n2, n1) if n1 and n2 else 1.0


def bootstrap_ci(
    a: Sequence[float],
    b: Sequence[float],
    *,
    rounds: int = BOOTSTRAP_ROUNDS,
    level: float = 0.95,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of mean(b) / mean(a) − 1 (fixed seed: same files, same
    interval)."""
    rng = np.random.default_rng(seed)
    xa, xb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    ma = xa[rng.integers(0, len(xa), (rounds, len(xa)))].mean(axis=1)
    mb = xb[rng.integers(0, len(xb), (rounds, len(xb)))].mean(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = mb / ma - 1
    ratio = ratio[np.isfinite(ratio)]
    if ratio.size == 0:
        return (math.nan, math.nan)
    lo, hi = np.quantile(ratio, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm–Bonferroni adjusted p-values: with several metrics tested at once, the chance
    that *any* "worse" in the table is noise stays below alpha (7 metrics at 5 % each would
    otherwise flag a pure-noise comparison about a third of the time)."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda k: pvalues[k])
    out = [1.0] * m
    running = 0.0
    for step, k in enumerate(order):
        running = max(running, min(1.0, (m - step) * pvalues[k]))
        out[k] = running
    return out


def runs_needed(alpha: float) -> int:
    """Smallest n (each side) with which the exact rank test can reach ``alpha``."""
    n = 2
    while min_p(n, n) > alpha:
        n += 1
    return n


@dataclass(frozen=True)
class Verdict:
    change: float  # mean(b) / mean(a) − 1
    ci: tuple[float, float] | None
    p: float | None  # raw rank-test p-value
    p_adjusted: float | None  # after Holm over the metrics tested together
    text: str  # NO_DIFFERENCE, "better", "WORSE", or why no verdict is possible
    regression: bool


def testable(a: Sequence[float], b: Sequence[float]) -> bool:
    return len(a) >= 2 and len(b) >= 2


def judge(
    a: Sequence[float],
    b: Sequence[float],
    higher_is_better: bool,
    alpha: float = ALPHA,
    *,
    tests: int = 1,
    p_adjusted: float | None = None,
) -> Verdict:
    """Is ``b`` different from ``a`` beyond run-to-run noise? ``tests``: metrics judged
    together, ``p_adjusted`` this one's Holm-adjusted p-value among them."""
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    change = mb / ma - 1 if ma else (0.0 if mb == ma else math.inf)
    if not testable(a, b):
        return Verdict(
            change, None, None, None, f"no verdict: n={len(a)} vs {len(b)}, no noise estimate", False
        )
    ci = bootstrap_ci(a, b)
    if min_p(len(a), len(b)) > alpha / tests:
        why = (
            f"no verdict: n={len(a)} vs {len(b)} is too few for {1 - alpha:.0%} confidence over "
            f"{tests} metric(s) (need {runs_needed(alpha / tests)}+ each)"
        )
        return Verdict(change, ci, None, None, why, False)
    p = mann_whitney_p(a, b)
    adj = p if p_adjusted is None else p_adjusted
    if adj >= alpha or (ci[0] <= 0 <= ci[1]):
        return Verdict(change, ci, p, adj, NO_DIFFERENCE, False)
    better = (change > 0) == higher_is_better
    return Verdict(change, ci, p, adj, "better" if better else "WORSE", not better)


# -- the comparison table -----------------------------------------------------------------

_SCALE: dict[str, Callable[[float], str]] = {
    "GB/s": lambda v: f"{v / 1e9:.3f} GB/s",
    "s": lambda v: f"{v:.3f} s",
    "ms": lambda v: f"{v * 1e3:.2f} ms",
    "MiB": lambda v: f"{v / 2**20:.1f} MiB",
    "x": lambda v: f"{v:.2f}x",
}


def describe(values: Sequence[float], unit: str) -> str:
    fmt = _SCALE[unit]
    if len(values) == 1:
        return f"{fmt(values[0])} (n=1)"
    return f"{fmt(statistics.fmean(values))} ± {fmt(statistics.stdev(values))} (n={len(values)})"


def _pct(x: float) -> str:
    return f"{x:+.1%}" if math.isfinite(x) else "n/a"


@dataclass(frozen=True)
class Row:
    group: str
    metric: Metric
    cells: list[str]  # baseline, then per candidate: value, change, verdict
    verdicts: list[Verdict | None]


def compare_docs(docs: Sequence[Mapping[str, Any]], alpha: float = ALPHA) -> list[Row]:
    """Each metric of each group: the first document is the baseline. Within each candidate
    the metrics are judged together (Holm), so the table as a whole keeps ``alpha``."""
    if len(docs) < 2:
        raise ValueError("compare needs at least two results")
    kinds = {d.get("mode") for d in docs}
    if len(kinds) > 1:
        raise ValueError(f"cannot compare an MPI run with a single-process run ({sorted(map(str, kinds))})")
    all_samples = [samples(d) for d in docs]
    keys = [
        (group, m) for group, base in all_samples[0].items() for m in metrics_for(docs[0]) if m.key in base
    ]
    columns: list[list[Verdict | None]] = []
    for other in all_samples[1:]:
        pairs = [(all_samples[0][g][m.key], other.get(g, {}).get(m.key) or []) for g, m in keys]
        tested = [k for k, (a, b) in enumerate(pairs) if testable(a, b)]
        adjusted = dict(zip(tested, holm([mann_whitney_p(*pairs[k]) for k in tested]), strict=True))
        column: list[Verdict | None] = []
        for k, ((_, m), (a, b)) in enumerate(zip(keys, pairs, strict=True)):
            if not b:
                column.append(None)
                continue
            column.append(
                judge(a, b, m.higher_is_better, alpha, tests=max(1, len(tested)), p_adjusted=adjusted.get(k))
            )
        columns.append(column)
    rows = []
    for k, (group, m) in enumerate(keys):
        cells = [describe(all_samples[0][group][m.key], m.unit)]
        verdicts = [col[k] for col in columns]
        for other, verdict in zip(all_samples[1:], verdicts, strict=True):
            if verdict is None:
                cells += ["missing", "", ""]
                continue
            ci = f" [{_pct(verdict.ci[0])}, {_pct(verdict.ci[1])}]" if verdict.ci else ""
            cells += [describe(other[group][m.key], m.unit), _pct(verdict.change) + ci, verdict.text]
        rows.append(Row(group, m, cells, verdicts))
    return rows

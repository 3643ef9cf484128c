"""PNG plots of a result document (``--plots DIR``, ``--report FILE.html``).

matplotlib (the ``[plots]`` extra), not plotly: the output must be static PNGs that embed
in one self-contained HTML file and open offline; plotly's interactive HTML needs its
~3 MB JavaScript bundle inlined or fetched from a CDN. Only the bench imports this module,
and matplotlib only when a plot is asked for: the library core never needs it.
"""

from __future__ import annotations

import io
import statistics
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from ..errors import MissingDependencyError
from ..results.metrics import percentiles

Doc = Mapping[str, Any]
Draw = Callable[[Any], Any]


def _plt() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise MissingDependencyError("matplotlib", "plots", "--plots / --report") from None
    matplotlib.use("Agg")  # no display, no GUI toolkit
    import matplotlib.pyplot as plt

    return plt


def _title(r: Mapping[str, Any], i: int) -> str:
    m = r["metadata"]
    return f"#{i + 1} {r['operation']} {r['method']} [{m['backend']}] {r['size_bytes'] / 2**30:.3f} GiB"


def _stamps(recs: Sequence[Mapping[str, Any]]) -> float:
    return min(float(rec["t_acquire"]) for rec in recs)


#: per-chunk keys of each side's work, storage call, its stamps and the CRC32C beside it
_KEYS = {
    "save": dict(work="fill_s", io="write_s", start="t_write_start", end="t_write_end", crc="checksum_s"),
    "load": dict(work="consume_s", io="read_s", start="t_read_start", end="t_read_end", crc="verify_s"),
}
#: the same, summed over a result
_TOTALS = {
    "save": {"work": "gen_s", "storage": "write_s"},
    "load": {"work": "consume_s", "storage": "read_s"},
}


def timeline(plt: Any, r: Mapping[str, Any], i: int) -> Any:
    """Per chunk: waiting for a buffer, filling, queued, writing, checksumming: where the
    pipeline overlapped and where it stalled."""
    recs, t0, k = r["records"], _stamps(r["records"]), _KEYS[r["operation"]]
    fig, ax = plt.subplots(figsize=(10, max(3.0, min(12.0, 0.12 * len(recs) + 2))))
    spans: dict[str, list[tuple[float, float]]] = {k: [] for k in ("wait", "fill", "queued", "io", "crc")}
    ys = []
    for rec in recs:
        start = rec["t_acquire"] - t0
        fill0 = start + rec["wait_free_s"]
        ws, we, work = rec[k["start"]] - t0, rec[k["end"]] - t0, rec[k["work"]]
        spans["wait"].append((start, rec["wait_free_s"]))
        spans["fill"].append((fill0, work))
        spans["queued"].append((fill0 + work, max(0.0, ws - fill0 - work)))
        spans["io"].append((ws, we - ws))
        spans["crc"].append((ws, rec[k["crc"]]))
        ys.append(rec["index"])
    load = r["operation"] == "load"
    style = {
        "wait": ("#bbbbbb", "waiting for a buffer"),
        "fill": ("#1f77b4", "consumer (verify + caller)" if load else "generation (fill)"),
        "queued": ("#e8e8f8", "queued"),
        "io": ("#ff7f0e", "read" if load else "write"),
        "crc": ("#2ca02c", "verify" if load else "CRC32C"),
    }
    for key, (color, label) in style.items():
        for y, (x, w) in zip(ys, spans[key], strict=True):
            h = 0.35 if key == "crc" else 0.8
            ax.broken_barh([(x, w)], (y - h / 2, h), facecolors=color, label=label)
            label = "_nolegend_"
    ax.set_xlabel("seconds since the first buffer was requested")
    ax.set_ylabel("chunk")
    ax.invert_yaxis()
    ax.set_title(f"Per-chunk timeline: {_title(r, i)}")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    return fig


def throughput(plt: Any, r: Mapping[str, Any], i: int) -> Any:
    """Bytes completed per time window: stalls and ramp-up that a mean hides."""
    recs, t0, end = r["records"], _stamps(r["records"]), _KEYS[r["operation"]]["end"]
    ends = sorted((rec[end] - t0, rec["nbytes"]) for rec in recs)
    span = max(ends[-1][0], 1e-9)
    bins = max(1, min(50, len(ends) // 2))
    width = span / bins
    totals = [0.0] * bins
    for t, n in ends:
        totals[min(bins - 1, int(t / width))] += n
    fig, ax = plt.subplots(figsize=(10, 3.5))
    rates = [b / width / 1e9 for b in totals]
    ax.step([k * width for k in range(bins + 1)], [*rates, rates[-1]], where="post", label="per window")
    ax.axhline(r["throughput_bps"] / 1e9, color="gray", linestyle="--", label="open to end")
    ax.set_xlabel("seconds")
    ax.set_ylabel("GB/s completed")
    ax.set_title(f"Throughput over time ({width * 1e3:.0f} ms windows): {_title(r, i)}")
    ax.legend(fontsize="small")
    return fig


def latency(plt: Any, r: Mapping[str, Any], i: int) -> Any:
    """Write (or read) latency per chunk: histogram and CDF, p50 and p99 marked."""
    values = [rec[_KEYS[r["operation"]]["io"]] * 1e3 for rec in r["records"]]
    pct = percentiles(values)
    fig, (h, c) = plt.subplots(1, 2, figsize=(10, 3.5))
    h.hist(values, bins=min(50, max(5, len(values) // 2)), color="#ff7f0e")
    ordered = sorted(values)
    c.plot(ordered, [(k + 1) / len(ordered) for k in range(len(ordered))], drawstyle="steps-post")
    for ax in (h, c):
        for name, v, style in (("p50", pct.p50, "--"), ("p99", pct.p99, ":")):
            ax.axvline(v, color="black", linestyle=style, label=f"{name} {v:.2f} ms")
        ax.set_xlabel("ms per " + ("read" if r["operation"] == "load" else "write"))
    h.set_ylabel("chunks")
    c.set_ylabel("fraction ≤ x")
    h.legend(fontsize="small")
    fig.suptitle(f"Latency distribution: {_title(r, i)}")
    return fig


def waits(plt: Any, doc: Doc) -> Any:
    """Where each run's time went: work on each side and each side's waiting."""
    rs = doc["results"]
    parts = (
        ("work", "generation / consumer", "#1f77b4"),
        ("storage", "storage busy", "#ff7f0e"),
        ("close_s", "close", "#9467bd"),
        ("wait_free_s", "producer waited for buffers", "#bbbbbb"),
        ("wait_data_s", "writers waited for data / consumer for reads", "#d62728"),
    )
    fig, ax = plt.subplots(figsize=(10, max(2.5, 0.5 * len(rs) + 1.5)))
    labels = [f"#{k + 1} {r['operation']} {r['method']}" for k, r in enumerate(rs)]
    for j, (key, label, color) in enumerate(parts):
        values = [r[_TOTALS[r["operation"]].get(key, key)] for r in rs]
        ax.barh([y + j * 0.15 for y in range(len(rs))], values, 0.15, label=label, color=color)
    ax.set_yticks([y + 0.3 for y in range(len(rs))], labels)
    ax.invert_yaxis()
    ax.set_xlabel("seconds (waits summed over chunks)")
    ax.set_title("Work and wait breakdown per run")
    ax.legend(fontsize="small")
    return fig


def bars(plt: Any, title: str, labels: Sequence[str], values: Sequence[float], xlabel: str) -> Any:
    fig, ax = plt.subplots(figsize=(10, max(2.5, 0.35 * len(labels) + 1.5)))
    ax.barh(range(len(labels)), values, color="#1f77b4")
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    return fig


def ranks(plt: Any, ph: Mapping[str, Any]) -> Any:
    """Per-rank throughput, averaged over the phase's checkpoints; the straggler (the rank
    most often slowest) in red."""
    per: dict[int, list[float]] = {}
    for c in ph["checkpoints"]:
        for pr in c["per_rank"]:
            per.setdefault(int(pr["rank"]), []).append(float(pr["throughput_bps"]))
    order = sorted(per)
    means = [statistics.fmean(per[k]) / 1e9 for k in order]
    counts = ph["summary"]["slowest_rank_counts"]
    straggler = int(max(counts, key=lambda k: counts[k]))
    fig = bars(
        plt,
        f"{ph['phase']} {ph['method']}: per-rank throughput (mean of {len(ph['checkpoints'])} checkpoint(s))",
        [f"rank {k}" for k in order],
        means,
        "GB/s",
    )
    ax = fig.axes[0]
    ax.patches[order.index(straggler)].set_color("#d62728")
    ax.patches[order.index(straggler)].set_label(f"straggler (most often slowest): rank {straggler}")
    mean_min = ph["summary"]["min_rank_throughput_bps_mean"] / 1e9
    ax.axvline(mean_min, color="gray", linestyle=":", label="min rank throughput (mean)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    return fig


def checkpoints(plt: Any, ph: Mapping[str, Any]) -> Any:
    cs = ph["checkpoints"]
    return bars(
        plt,
        f"{ph['phase']} {ph['method']}: job throughput per checkpoint (total ÷ slowest rank)",
        [f"checkpoint {k + 1}" for k in range(len(cs))],
        [c["throughput_bps"] / 1e9 for c in cs],
        "GB/s",
    )


def figures(doc: Doc) -> list[tuple[str, str, Draw]]:
    """(file stem, title, draw) for every plot the document supports."""
    out: list[tuple[str, str, Draw]] = []
    if doc.get("mode") == "mpi":
        for k, ph in enumerate(doc["phases"]):
            stem = f"{k + 1}-{ph['phase']}-{ph['method']}"
            out.append((f"ranks-{stem}", "Per-rank throughput", partial(ranks, ph=ph)))
            out.append((f"checkpoints-{stem}", "Per checkpoint", partial(checkpoints, ph=ph)))
        return out
    rs = doc["results"]
    for i, r in enumerate(rs):
        if not r.get("records"):
            continue
        for stem, title, fn in (
            ("timeline", "Per-chunk timeline", timeline),
            ("throughput", "Throughput over time", throughput),
            ("latency", "Latency distribution", latency),
        ):
            out.append((f"{stem}-{i + 1}", title, partial(fn, r=r, i=i)))
        per = r["metadata"]["extra"].get("endpoints")
        if per:
            out.append(
                (
                    f"endpoints-{i + 1}",
                    "Per endpoint",
                    partial(
                        bars,
                        title=f"Bytes per endpoint: {_title(r, i)}",
                        labels=[e["endpoint"] for e in per],
                        values=[e["bytes"] / 2**30 for e in per],
                        xlabel="GiB",
                    ),
                )
            )
    if rs:
        out.append(("waits", "Work and waits", partial(waits, doc=doc)))
    if len({r["metadata"]["backend"] for r in rs}) > 1:
        labels = [f"{r['metadata']['backend']} {r['operation']}" for r in rs]
        values = [r["throughput_bps"] / 1e9 for r in rs]
        out.append(
            (
                "backends",
                "Per backend",
                partial(bars, title="Throughput per backend", labels=labels, values=values, xlabel="GB/s"),
            )
        )
    return out


def render(doc: Doc) -> list[tuple[str, str, bytes]]:
    """Every supported plot as (file stem, title, PNG bytes)."""
    plt = _plt()
    out = []
    for stem, title, draw in figures(doc):
        fig = draw(plt)
        try:
            fig.tight_layout()
            buf = io.BytesIO()
            fig.savefig(buf, format="png", dpi=100)
        finally:
            plt.close(fig)
        out.append((stem, title, buf.getvalue()))
    return out


def not_plotted(doc: Doc) -> list[str]:
    """What the reader might look for and why it is absent."""
    notes = []
    if doc.get("mode") != "mpi" and not any(r.get("records") for r in doc["results"]):
        notes.append("per-chunk timeline, throughput over time and latency plots need --records")
    notes.append("event-loop lag and memory over time: not recorded (the JSON keeps percentiles and peaks)")
    return notes


def write_pngs(pngs: Sequence[tuple[str, str, bytes]], directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for stem, _, data in pngs:
        path = directory / f"{stem}.png"
        tmp = directory / f".{stem}.png.part"  # never a half-written PNG under the real name
        tmp.write_bytes(data)
        tmp.replace(path)
        paths.append(path)
    return paths

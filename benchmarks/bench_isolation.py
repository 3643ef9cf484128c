"""In-process vs writer-process saves: what isolation costs, measured in one run.

For each target (a file on ``--dir``, and ``null://`` which discards and so shows the
pipeline/IPC ceiling) it saves the same seeded checkpoint with ``isolation="none"`` (the
baseline) and with a writer process per start method, interleaving the modes run by run so
drift hits all of them alike. The child's start-up lands in ``open_s`` and is part of the
end-to-end wall time, as it is for a user. Prints a table, then JSON.

    python benchmarks/bench_isolation.py --size 4GiB --dir /nvme/tmp --repeat 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from _common import directory

from asyncckpt import AsyncCheckpointer, SaveResult, parse_size
from asyncckpt.results.text import format_table, gbps, ms

MODES = {"none": ("none", None), "fork": ("process", "fork"), "forkserver": ("process", "forkserver")}
MODES["spawn"] = ("process", "spawn")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="1GiB", help="checkpoint size (default 1GiB)")
    p.add_argument("--chunk-size", default="32MiB")
    p.add_argument("--num-buffers", type=int, default=8)
    p.add_argument("--max-in-flight", type=int, default=None)
    p.add_argument(
        "--dir", type=directory, default=None, help="directory for the file target (default: a temp dir)"
    )
    p.add_argument("--targets", default="file,null", help="comma list of file,null")
    p.add_argument("--modes", default="none,fork,forkserver", help=f"comma list of {','.join(MODES)}")
    p.add_argument("--repeat", type=int, default=3, help="measured saves per mode (after one warm-up)")
    p.add_argument("--no-fsync", action="store_true")
    p.add_argument("--json", default=None, help="also write the JSON to this file")
    return p.parse_args(argv)


def _run_facts(r: SaveResult) -> dict[str, float]:
    return {
        "wall_s": r.wall_s,
        "throughput_bps": r.throughput_bps,
        "open_s": r.open_s,
        "write_s": r.write_s,
        "close_s": r.close_s,
        "gen_s": r.gen_s,
    }


async def bench(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    size, chunk = parse_size(args.size), parse_size(args.chunk_size, name="chunk-size")
    targets = [t for t in args.targets.split(",") if t]
    modes = [m for m in args.modes.split(",") if m]
    for m in modes:
        if m not in MODES:
            raise SystemExit(f"unknown mode {m!r}; choose from {', '.join(MODES)}")
    common = {
        "chunk_size": chunk,
        "num_buffers": args.num_buffers,
        "max_in_flight": args.max_in_flight,
        "fsync": not args.no_fsync,
    }
    runs: dict[tuple[str, str], list[dict[str, float]]] = {(t, m): [] for t in targets for m in modes}
    meta: dict[tuple[str, str], dict[str, Any]] = {}
    ckpts = {}
    for t in targets:
        for m in modes:
            isolation, method = MODES[m]
            ckpts[t, m] = AsyncCheckpointer(isolation=isolation, mp_start_method=method, **common)
    try:
        for rnd in range(args.repeat + 1):  # round 0 warms up: pool touch, forkserver start
            for t in targets:
                for m in modes:
                    uri = str(workdir / f"ckpt-{m}.bin") if t == "file" else f"null://{m}"
                    result = await ckpts[t, m].save(uri, size)
                    if t == "file":
                        await ckpts[t, m].delete(uri)
                    if rnd:
                        runs[t, m].append(_run_facts(result))
                        extra = result.metadata.extra
                        meta[t, m] = {
                            "isolation": extra.get("isolation"),
                            "mp_start_method": extra.get("mp_start_method"),
                            "direct_io": result.metadata.direct_io,
                            "max_in_flight": result.metadata.max_in_flight,
                        }
    finally:
        for c in ckpts.values():
            await c.aclose()
    rows = []
    for t in targets:
        base = statistics.median(r["throughput_bps"] for r in runs[t, modes[0]]) if modes else 0.0
        for m in modes:
            med = statistics.median(r["throughput_bps"] for r in runs[t, m])
            rows.append(
                {
                    "target": t,
                    "mode": m,
                    **meta[t, m],
                    "throughput_bps_median": med,
                    "ratio_vs_first_mode": med / base if base else None,
                    "open_s_median": statistics.median(r["open_s"] for r in runs[t, m]),
                    "write_s_median": statistics.median(r["write_s"] for r in runs[t, m]),
                    "runs": runs[t, m],
                }
            )
    return {"size_bytes": size, "config": common, "baseline_mode": modes[0], "results": rows}


def table(report: dict[str, Any]) -> str:
    size = report["size_bytes"]
    rows = [
        (
            r["target"],
            r["mode"],
            gbps(r["throughput_bps_median"]),
            "n/a" if r["ratio_vs_first_mode"] is None else f"{r['ratio_vs_first_mode']:.3f}x",
            ms(r["open_s_median"]),
            gbps(size / r["write_s_median"] if r["write_s_median"] > 0 else None),
            len(r["runs"]),
        )
        for r in report["results"]
    ]
    headers = (
        "target",
        "mode",
        "save (median)",
        f"vs {report['baseline_mode']}",
        "open",
        "write busy",
        "runs",
    )
    return format_table(headers, rows)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-isolation-", dir=args.dir) as tmp:
        report = asyncio.run(bench(args, Path(tmp)))
    print(table(report))
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":  # required: spawn/forkserver children import this module
    sys.exit(main())

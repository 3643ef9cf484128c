"""A fresh checkpointer's first save against its next one, on the caller's clock.

Issue 29 (part 2): ``AsyncCheckpointer()`` then a first 2 GiB ``save()`` took 1.52 s on the
caller's clock, the next 1.28 s; 0.60 s of the first was the pool's first touch (huge pages
the kernel may have to compact memory for), outside ``wall_s``. The pool is now faulted in
buffer by buffer beside the first save. Target: first ≤ 1.1 × next, the median of per-run
ratios with its 95 % bootstrap interval wholly below (``_common.ratio_verdict``: 5 runs at
least).

Each run is a fresh Python process (so nothing is warm but the page cache): it imports
asyncckpt, makes ``AsyncCheckpointer()`` (defaults), times ``await ckpt.save`` twice into
two new paths (the caller's clock), and prints both results' ``wall_s`` and ``setup_s``. The
files are deleted between runs, untimed. ``--tree DIR`` runs the same child against another
source tree (for example a checkout of the commit before the change), alternating with this
one run by run, so both meet the same machine.

    python benchmarks/bench_first_save.py --size 2GiB --runs 7 --dir /var/tmp [--tree /path/to/old]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _common import bootstrap_ci, directory, emit, median, ratio_verdict

from asyncckpt import parse_size

TARGET = 1.1
HERE = Path(__file__).resolve().parent.parent

CHILD = r"""
import asyncio, json, os, sys, time
t_import = time.perf_counter()
from asyncckpt import AsyncCheckpointer
import_s = time.perf_counter() - t_import

async def main(directory, size):
    t0 = time.perf_counter()
    ckpt = AsyncCheckpointer()
    out = {"import_s": import_s}
    for name in ("first", "next"):
        t = time.perf_counter()
        result = await ckpt.save(os.path.join(directory, name + ".bin"), size)
        out[name + "_s"] = time.perf_counter() - (t0 if name == "first" else t)
        out[name + "_wall_s"] = result.wall_s
        out[name + "_setup_s"] = getattr(result, "setup_s", None)
    await ckpt.aclose()
    print(json.dumps(out))

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


def one_run(tree: Path, directory: Path, size: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(directory), str(size)], env=env, capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise SystemExit(f"the child failed (rc {proc.returncode}): {proc.stderr.strip()[-2000:]}")
    for name in ("first.bin", "next.bin"):
        (directory / name).unlink(missing_ok=True)
    row: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    row["ratio"] = row["first_s"] / row["next_s"]
    return row


def summarise(label: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    ratios = [r["ratio"] for r in rows]
    low, high = bootstrap_ci(ratios)
    keys = ("first_s", "next_s", "first_wall_s", "next_wall_s", "import_s")
    out: dict[str, Any] = {"tree": label, "run": "median", **{k: median([r[k] for r in rows]) for k in keys}}
    setups = [r["first_setup_s"] for r in rows if r.get("first_setup_s") is not None]
    out["first_setup_s"] = median(setups) if setups else None
    out.update(ratio=median(ratios), ci95=[round(low, 4), round(high, 4)])
    return out


def verdict_of(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ratios = [r["ratio"] for r in rows]
    if len(ratios) < 5:  # a check that it runs; a verdict needs 5 runs
        return {"pairs": len(ratios), "target": f"<= {TARGET}", "verdict": "too few runs for a verdict"}
    return ratio_verdict(ratios, TARGET, at_most=True)


def main(args: argparse.Namespace) -> None:
    size = parse_size(args.size)
    trees = {"this": HERE, **({"other": Path(args.tree).resolve()} if args.tree else {})}
    rows: dict[str, list[dict[str, Any]]] = {label: [] for label in trees}
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="asyncckpt-first-save-") as tmp:
        for run in range(args.runs):
            order = list(trees) if run % 2 == 0 else list(reversed(trees))
            for label in order:
                rows[label].append({"tree": label, "run": run + 1, **one_run(trees[label], Path(tmp), size)})
    table = [row for label in trees for row in (*rows[label], summarise(label, rows[label]))]
    headers = ("tree", "run", "first_s", "next_s", "ratio", "first_wall_s", "next_wall_s")
    headers += ("first_setup_s", "import_s")
    emit(
        "first_vs_next_save",
        table,
        headers,
        {
            "size_bytes": size,
            "dir": args.dir,
            "trees": {k: str(v) for k, v in trees.items()},
            "verdicts": {label: verdict_of(rows[label]) for label in trees},
        },
    )


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="2GiB")
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--dir", type=directory, default="/var/tmp", help="directory on the device under test")
    p.add_argument("--tree", help="another source tree to run alternately (e.g. the commit before)")
    main(p.parse_args())

"""Overwrite vs fresh path: a save over an existing checkpoint against one into a new path.

Issue 29 (part 5): saving 2 GiB over an existing 2 GiB file took a third longer than into a
fresh path, because ext4 freed the replaced file's extents inside the rename. The file sink now
links the old file aside first and unlinks that name in a worker thread after the save
returned. Target: overwrite ≤ 1.03 × fresh, the median of per-pair ratios with its 95 %
bootstrap interval wholly below (``_common.ratio_verdict``: 5 pairs at least).

One warm checkpointer (defaults) makes every save, as ``--repeat`` and a training loop do.
Each pair is one fresh-path save and one save over the same existing path, in alternating
order (fresh first, then overwrite first) so drift hits both alike. Timed: the caller's clock
around ``await ckpt.save`` (``save_s``), and the result's ``close_s`` (fsync, link, rename,
directory fsync). Untimed, between saves: ``ckpt.storage.settle()`` (the background unlink of
the replaced file: ``settle_s``) and the deletion of the fresh file (``delete_s``, which frees
as much as the rename used to), so no save shares the disk with the previous one's freeing;
then, before each save, ``sync``, so the journal commits of those frees land before it, not
inside it. (Without the ``sync``, 2026-12-04: an overwrite right after the previous pair's
clean-up ran 5-16 % slower than one after a fresh save, which skewed pairs by their order.)

    python benchmarks/bench_overwrite.py --size 2GiB --pairs 5 --dir /var/tmp
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import bootstrap_ci, directory, emit, median, ratio_verdict

from asyncckpt import AsyncCheckpointer, parse_size

TARGET = 1.03


async def timed_save(ckpt: AsyncCheckpointer, path: Path, size: int) -> dict[str, float]:
    """One save on the caller's clock, then its background work settled (timed apart). Before
    it, untimed, ``sync``: the journal commits of the previous frees land before the save."""
    t_sync = time.perf_counter()
    await asyncio.to_thread(os.sync)
    sync_s = time.perf_counter() - t_sync
    t0 = time.perf_counter()
    result = await ckpt.save(path, size)
    save_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    await ckpt.storage.settle()
    settle_s = time.perf_counter() - t1
    return {"save_s": save_s, "close_s": result.close_s, "settle_s": settle_s, "sync_s": sync_s}


async def delete(path: Path) -> float:
    t0 = time.perf_counter()
    await asyncio.to_thread(os.unlink, path)
    return time.perf_counter() - t0


async def one_pair(ckpt: AsyncCheckpointer, directory: Path, pair: int, size: int) -> dict[str, Any]:
    fresh_path, over_path = directory / f"fresh-{pair}.bin", directory / "overwrite.bin"
    order = ("fresh", "overwrite") if pair % 2 == 0 else ("overwrite", "fresh")
    runs: dict[str, dict[str, float]] = {}
    for kind in order:
        runs[kind] = await timed_save(ckpt, fresh_path if kind == "fresh" else over_path, size)
        if kind == "fresh":
            runs[kind]["delete_s"] = await delete(fresh_path)
    fresh, over = runs["fresh"], runs["overwrite"]
    return {
        "pair": pair + 1,
        "order": "/".join(order),
        "fresh_s": fresh["save_s"],
        "overwrite_s": over["save_s"],
        "ratio": over["save_s"] / fresh["save_s"],
        "fresh_close_s": fresh["close_s"],
        "overwrite_close_s": over["close_s"],
        "aside_unlink_s": over["settle_s"],
        "fresh_delete_s": fresh["delete_s"],
    }


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ratios = [r["ratio"] for r in rows]
    out: dict[str, Any] = {key: median([r[key] for r in rows]) for key in rows[0] if key.endswith("_s")}
    low, high = bootstrap_ci(ratios)
    out.update(pair="median", ratio=median(ratios), ci95=[round(low, 4), round(high, 4)])
    return out


async def main(args: argparse.Namespace) -> None:
    size = parse_size(args.size)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="asyncckpt-overwrite-") as tmp:
        directory = Path(tmp)
        async with AsyncCheckpointer() as ckpt:
            await timed_save(ckpt, directory / "overwrite.bin", size)  # warm-up; what is overwritten
            await timed_save(ckpt, directory / "warm.bin", size)
            await delete(directory / "warm.bin")
            for pair in range(args.pairs):
                rows.append(await one_pair(ckpt, directory, pair, size))
    med = summary(rows)
    ratios = [r["ratio"] for r in rows]
    if len(ratios) >= 5:
        verdict = ratio_verdict(ratios, TARGET, at_most=True)
    else:  # a check that it runs; a verdict needs 5 pairs
        verdict = {"pairs": len(ratios), "target": f"<= {TARGET}", "verdict": "too few pairs for a verdict"}
    headers = (
        "pair",
        "order",
        "fresh_s",
        "overwrite_s",
        "ratio",
        "fresh_close_s",
        "overwrite_close_s",
        "aside_unlink_s",
        "fresh_delete_s",
    )
    emit(
        "overwrite_vs_fresh",
        [*rows, med],
        headers,
        {"size_bytes": size, "dir": args.dir, "median_ratio": med["ratio"], "ci95": med["ci95"], **verdict},
    )


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="2GiB")
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--dir", type=directory, default="/var/tmp", help="directory on the device under test")
    asyncio.run(main(p.parse_args()))

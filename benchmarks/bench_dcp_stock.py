"""Can stock DCP read it? A writer mode in DCP's stock layout against a converter, measured.

One process (no process group), a state of ``--state-size`` float32 tensors of 32 MiB. Per
round, in alternating order, each arm saves the same state with ``dcp.save`` into a fresh
directory (fsync'd files for every arm):

- ``asyncckpt``: ``AsyncCkptStorageWriter`` as it ships (raw tensor bytes + a sealed footer);
- ``stock_mode``: a prototype writer mode in DCP's stock layout: the same writer, but each
  tensor ``torch.save``\\ d into memory first (DCP's reader ``torch.load``\\ s every item) and
  ``.metadata`` holding DCP's own ``_StorageInfo``;
- ``convert``: ``asyncckpt``'s save, then ``asyncckpt.integrations.dcp_convert.to_stock`` into
  another directory (the converter's time alone is ``convert_s``);
- ``filesystem``: DCP's own ``FileSystemWriter(sync_files=True)``, for reference.

Reported per arm: median seconds to durable, bytes on disk, ``held_MiB`` (memory the arm holds
beyond the pool, counted, not sampled: the mode every serialised tensor of its rank until they
are written, the converter its largest item); ratios per round with a 95 %
bootstrap interval: ``stock_mode / asyncckpt`` (what the mode would cost every save) and
``convert_s / asyncckpt`` (what one conversion costs). Every stock-layout result is loaded
once, untimed, with torch's ``FileSystemReader`` and compared bit for bit.

    python benchmarks/bench_dcp_stock.py [--state-size 256MiB] [--pairs 5] [--dir /var/tmp]
"""

from __future__ import annotations

import argparse
import io
import pickle
import random
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from _common import bootstrap_ci, directory, emit, median
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.planner import WriteItemType
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from asyncckpt import parse_size
from asyncckpt.integrations.dcp import METADATA, AsyncCkptStorageWriter, join
from asyncckpt.integrations.dcp_convert import to_stock

ARMS = ("asyncckpt", "stock_mode", "convert", "filesystem")
TENSOR = 32 << 20


class StockModeWriter(AsyncCkptStorageWriter):
    """The prototype mode: items as DCP's FileSystemWriter lays them out, through asyncckpt."""

    def write_data(self, plan: Any, planner: Any) -> Future[list[WriteResult]]:
        name = f"{plan.storage_data}0.distcp"
        pieces: list[memoryview] = []
        results, offset = [], 0
        for item in sorted(plan.items, key=lambda i: i.type != WriteItemType.BYTE_IO):
            data = planner.resolve_data(item)
            if not isinstance(data, io.BytesIO):
                buffer = io.BytesIO()
                torch.save(data.detach().contiguous(), buffer)
                data = buffer
            view = data.getbuffer()
            pieces.append(view)
            results.append(WriteResult(item.index, len(view), _StorageInfo(name, offset, len(view))))
            offset += len(view)
        self.held = offset  # every serialised tensor of the rank, in memory until written
        uri, size, done = join(self.path, name), offset, Future()

        async def save(ckpt: Any) -> list[WriteResult]:
            await ckpt.save(uri, size, data=pieces)
            return results

        def settle(f: Any) -> None:
            if f.exception() is not None:
                done.set_exception(f.exception())
            else:
                done.set_result(f.result())

        self.thread.submit(save).add_done_callback(settle)
        return done

    def finish(self, metadata: Any, results: list[list[WriteResult]]) -> None:
        metadata.storage_data = {r.index: r.storage_data for rank in results for r in rank}
        blob = pickle.dumps(metadata)

        async def commit(ckpt: Any) -> None:
            await ckpt.save(join(self.path, METADATA), len(blob), data=blob)

        self.thread.run(commit)


def make_state(size: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(7)
    n = max(1, size // TENSOR)
    return {"model": {f"w{i}": torch.randn(TENSOR // 4, generator=g) for i in range(n)}, "step": 3}


def disk_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def check_stock(path: Path, state: dict[str, Any]) -> None:
    into = {"model": {k: torch.zeros_like(v) for k, v in state["model"].items()}, "step": 0}
    dcp.load(into, storage_reader=dcp.FileSystemReader(str(path)))
    assert into["step"] == state["step"]
    assert all(torch.equal(into["model"][k], v) for k, v in state["model"].items()), path


def run_arm(arm: str, state: dict[str, Any], base: Path, writers: dict[str, Any]) -> dict[str, Any]:
    target = base / arm
    shutil.rmtree(target, ignore_errors=True)
    t0 = time.perf_counter()
    if arm == "filesystem":
        dcp.save(state, storage_writer=dcp.FileSystemWriter(str(target), sync_files=True))
    else:
        dcp.save(
            state,
            storage_writer=writers["stock_mode" if arm == "stock_mode" else "asyncckpt"],
            checkpoint_id=target,
        )
    saved = time.perf_counter() - t0
    out: dict[str, Any] = {"save_s": saved, "bytes": disk_bytes(target)}
    # memory beyond the pool held by the arm: the mode's serialised copies; the converter's item
    out["held_MiB"] = writers["stock_mode"].held / 2**20 if arm == "stock_mode" else 0.0
    stock = target
    if arm == "convert":
        stock = base / "converted"
        shutil.rmtree(stock, ignore_errors=True)
        done = to_stock(target, stock)
        out["convert_s"] = done.seconds
        out["stock_bytes"] = disk_bytes(stock)
        out["held_MiB"] = max(t.nbytes for t in state["model"].values()) / 2**20
    if arm != "asyncckpt":
        check_stock(stock, state)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--state-size", type=parse_size, default=parse_size("256MiB"))
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument(
        "--dir", type=directory, default=None, help="where to write (default: a temporary directory)"
    )
    args = p.parse_args()
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    state = make_state(args.state_size)
    base = Path(tempfile.mkdtemp(prefix="asyncckpt-dcp-stock-", dir=args.dir))
    options = {"chunk_size": 32 << 20, "num_buffers": 8}
    writers = {
        "asyncckpt": AsyncCkptStorageWriter(base / "asyncckpt", **options),
        "stock_mode": StockModeWriter(base / "stock_mode", **options),
    }
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
    rng = random.Random(1)
    try:
        for arm in ARMS:  # warm-up round, not counted: pools, page cache, imports
            run_arm(arm, state, base, writers)
        for _ in range(args.pairs):
            order = list(ARMS)
            rng.shuffle(order)
            for arm in order:
                runs[arm].append(run_arm(arm, state, base, writers))
    finally:
        for w in writers.values():
            w.close()
        shutil.rmtree(base, ignore_errors=True)
    rows = []
    for arm in ARMS:
        mine = runs[arm]
        row: dict[str, Any] = {
            "arm": arm,
            "save_s": median([r["save_s"] for r in mine]),
            "bytes": mine[-1]["bytes"],
            "held_MiB": max(r["held_MiB"] for r in mine),
        }
        if arm == "convert":
            row["convert_s"] = median([r["convert_s"] for r in mine])
            row["stock_bytes"] = mine[-1]["stock_bytes"]
        rows.append(row)
    ratios = {
        "stock_mode/asyncckpt": [
            m["save_s"] / a["save_s"] for m, a in zip(runs["stock_mode"], runs["asyncckpt"], strict=True)
        ],
        "convert_s/asyncckpt": [
            c["convert_s"] / a["save_s"] for c, a in zip(runs["convert"], runs["asyncckpt"], strict=True)
        ],
        "filesystem/asyncckpt": [
            f["save_s"] / a["save_s"] for f, a in zip(runs["filesystem"], runs["asyncckpt"], strict=True)
        ],
    }
    summary = {k: {"median": median(v), "ci95": bootstrap_ci(v), "values": v} for k, v in ratios.items()}
    headers = ["arm", "save_s", "convert_s", "bytes", "stock_bytes", "held_MiB"]
    emit("dcp_stock", rows, headers, {"state_bytes": args.state_size, "pairs": args.pairs, "ratios": summary})
    for k, v in summary.items():
        print(
            f"{k}: median {v['median']:.3f}  95% CI [{v['ci95'][0]:.3f}, {v['ci95'][1]:.3f}]", file=sys.stderr
        )


if __name__ == "__main__":
    main()

"""How fast is each read of a freshly saved file, by its position after the save?

``bench_fio.py`` once compared one fio read and one asyncckpt load per pair, in alternating
order, and its load ratio swung from pair to pair (0.88, 1.01, 0.88, ...). This asks why: in
each round, asyncckpt saves a fresh file (its defaults), then one reader reads it ``--reads``
times in a row (fio's best read job from huge-page buffers, or asyncckpt's default load, which
verifies CRC32C), and each read's rate is recorded by its position. The readers alternate
which goes first, round by round. The table gives each reader's median rate per position and
asyncckpt ÷ fio per position. On this VM the second read after a save came out about 7 %
slower than the others for both readers, so ``bench_fio.py`` now reads twice, untimed, before
its timed loads.

    python benchmarks/bench_read_position.py --size 2GiB --rounds 4 --reads 5 --dir /var/tmp

Needs fio (``apt-get install fio``); huge pages for fio's buffers are reserved as root and
given back as in ``bench_fio.py`` (``--no-huge-pages`` to use malloc'd buffers).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path
from typing import Any

from _common import directory, emit, median, positive_int
from bench_fio import Fio, fio_binary, reserved_huge_pages, unlink

from asyncckpt import AsyncCheckpointer, CheckpointConfig, parse_size

READERS = ("fio", "asyncckpt")


async def measure(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    binary = fio_binary()
    if binary is None:
        raise SystemExit("bench_read_position: fio not found (apt-get install fio)")
    chunk = CheckpointConfig().chunk_size
    path = root / "saved.ckpt"
    rates: dict[str, list[list[float]]] = {r: [] for r in READERS}
    with reserved_huge_pages(not args.no_huge_pages, chunk, args.depth) as huge:
        fio = Fio(binary, args.size, chunk, False, huge.page_bytes)
        iomem = "shmhuge" if huge.ready else "malloc"
        async with AsyncCheckpointer() as ckpt:
            for i in range(args.rounds):
                for reader in READERS if i % 2 == 0 else READERS[::-1]:
                    unlink(path)
                    await ckpt.save(path, args.size)
                    seq = []
                    for _ in range(args.reads):
                        if reader == "fio":
                            seq.append(await fio.read(path, args.engine, args.depth, iomem))
                        else:
                            seq.append((await ckpt.load(path)).throughput_bps)
                    rates[reader].append(seq)
                    shown = ", ".join(f"{r / 1e9:.3f}" for r in seq)
                    print(f"round {i + 1} {reader}: {shown} GB/s", file=sys.stderr, flush=True)
        unlink(path)
    rows = []
    for k in range(args.reads):
        at = {r: median([seq[k] for seq in rates[r]]) for r in READERS}
        rows.append(
            {
                "position": k + 1,
                "fio_GBps": at["fio"] / 1e9,
                "asyncckpt_GBps": at["asyncckpt"] / 1e9,
                "ratio": at["asyncckpt"] / at["fio"],
            }
        )
    return {
        "rows": rows,
        "extra": {
            "size_bytes": args.size,
            "fio_read": {"engine": args.engine, "depth": args.depth, "iomem": iomem},
            "fio_huge_pages": huge.report(),
            "asyncckpt_load": "defaults (CRC32C verified)",
            "rates_bps": rates,
        },
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=lambda s: parse_size(s, name="--size"), default="2GiB")
    p.add_argument("--rounds", type=positive_int, default=4)
    p.add_argument("--reads", type=positive_int, default=5, help="reads per reader after each save")
    p.add_argument("--engine", default="io_uring", help="fio's read engine")
    p.add_argument("--depth", type=positive_int, default=8, help="fio's read queue depth")
    p.add_argument("--no-huge-pages", action="store_true", help="fio from malloc'd buffers")
    p.add_argument("--dir", type=directory, default=tempfile.gettempdir())
    args = p.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="asyncckpt-readpos-") as tmp:
        out = asyncio.run(measure(args, Path(tmp)))
    emit("read_position", out["rows"], ["position", "fio_GBps", "asyncckpt_GBps", "ratio"], out["extra"])
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""CPU cost per byte: the pipeline against its kernels, measured in the same run (issue 12, goal 5).

For each target (``null://`` and a file on tmpfs, ``/dev/shm``) and each pair, alternating the
order pair by pair:

- **pipeline**: one default streaming save of ``--size`` bytes; its CPU-s/GB is the result's
  own ``cpu_s_per_gb`` (process CPU from open to published, ``time.process_time``);
- **kernels**: the work the pipeline cannot avoid, in the same process, timed with the same
  clock: dgen-py filling the same number of same-size pooled buffers (its pool is the one
  the pipeline uses, so the same thread count), CRC32C over them (``asyncckpt.checksum.crc``,
  the pipeline's checksum) and, for the file, a ``memcpy`` of every chunk (a tmpfs ``write``
  copies the bytes into the page cache; ``null://`` copies nothing).

For the file a second, informative baseline replaces the memcpy with what any writer pays on
that file system: a plain buffered ``pwrite`` of the same chunks into a new file there and its
``unlink`` (``kern_write``; ``ratio_vs_write``). On tmpfs that costs several times a memcpy:
pages are allocated (and freed when a save replaces the previous file) besides the copy.

``--prime`` (the default; ``--no-prime`` to see without): before each arm into tmpfs, a file
of the save's size plus 512 MiB is written there and unlinked, untimed. In a VM, a page the
guest freed may have been handed back to the host, and a tmpfs write that lands on it costs
several times more (the host faults it in). Without priming that hit either arm at random,
and the ratios swung between 1.1 and 2.0 from pair to pair. Primed, both arms allocate pages
that were just freed, so the ratio compares the work, not where the VM's pages happen to be.

ratio = pipeline CPU-s/GB ÷ kernels CPU-s/GB per pair; target ≤ 1.25 (verdict from
``_common.ratio_verdict``: "met" only when the whole 95 % interval is at or below it).
The table also splits the pipeline's CPU by stage (from the result) so the overhead shows
where it goes: ``other`` = total − the stages (event loop, hand-offs, the monitor, syscalls
outside the storage call such as fallocate/fsync/rename/unlink).

    python benchmarks/bench_cpu_cost.py --size 2GiB --pairs 7 [--targets null,tmpfs] [--no-prime]
                                        [--profile FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import ctypes
import mmap
import os
import pstats
import tempfile
import time
from pathlib import Path
from typing import Any

import dgen_py
from _common import directory, emit, median, ratio_verdict

from asyncckpt import AsyncCheckpointer, parse_size
from asyncckpt.checksum import crc
from asyncckpt.sources.dgen import pool_threads

GB = 1e9
TARGET = 1.25


def kernels(
    views: list[memoryview], size: int, chunk: int, *, copy: bool, seed: int, write_dir: str | None
) -> dict[str, float]:
    """CPU seconds per GB of each kernel over ``size`` bytes in ``chunk``-sized buffers; with
    ``write_dir``, also a plain buffered write of the chunks into a new file there, then its
    unlink (what any writer pays on that file system, page allocation and freeing included)."""
    gen = dgen_py.Generator(size=size, seed=seed)
    scratch = mmap.mmap(-1, chunk)
    dst = ctypes.addressof(ctypes.c_char.from_buffer(scratch))
    scratch[:] = bytes(chunk)  # touched before timing, as the pool is
    out = {"gen": 0.0, "crc": 0.0, "copy": 0.0, "write": 0.0}
    fd = -1
    if write_dir is not None:
        path = os.path.join(write_dir, "kernel-write.bin")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        for i, offset in enumerate(range(0, size, chunk)):
            view = views[i % len(views)][: min(chunk, size - offset)]
            t = time.process_time()
            gen.fill_chunk(view)
            out["gen"] += time.process_time() - t
            t = time.process_time()
            crc(view)
            out["crc"] += time.process_time() - t
            if copy:
                src = ctypes.addressof(ctypes.c_char.from_buffer(view))
                t = time.process_time()
                ctypes.memmove(dst, src, len(view))  # memcpy, GIL released
                out["copy"] += time.process_time() - t
            if fd >= 0:
                t = time.process_time()
                os.pwrite(fd, view, offset)
                out["write"] += time.process_time() - t
        if fd >= 0:
            t = time.process_time()
            os.close(fd)
            fd = -1
            os.unlink(path)
            out["write"] += time.process_time() - t
    finally:
        if fd >= 0:
            os.close(fd)
            os.unlink(path)
        del dst
        scratch.close()
    return {k: v / (size / GB) for k, v in out.items()}


def prime(directory: str, nbytes: int, chunk: int) -> None:
    """Write ``nbytes`` of zeros into a new file in ``directory`` and unlink it (untimed): the
    next allocation of that many tmpfs pages gets pages just freed, which the VM still backs."""
    block = bytes(chunk)
    path = os.path.join(directory, "prime.bin")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        for offset in range(0, nbytes, chunk):
            os.pwrite(fd, block, offset)
    finally:
        os.close(fd)
        os.unlink(path)


async def pipeline(
    ckpt: AsyncCheckpointer, uri: str, size: int, profile: cProfile.Profile | None
) -> dict[str, Any]:
    if profile is not None:
        profile.enable()
    r = await ckpt.save(uri, size)
    if profile is not None:
        profile.disable()
    assert r.cpu_s_per_gb is not None
    stages = r.cpu_stages_s_per_gb
    return {
        "pipe_cpu_s_per_gb": r.cpu_s_per_gb,
        "pipe_gen": stages.get("generation", 0.0),
        "pipe_crc": stages.get("checksum", 0.0),
        "pipe_storage": stages.get("storage"),
        "pipe_other": r.cpu_s_per_gb - sum(stages.values()),
        "pipe_GBps": r.throughput_bps / GB,
        "direct_io": r.metadata.direct_io,
        "direct_io_reason": r.metadata.direct_io_reason,
        "gen_threads": r.metadata.gen_threads,
        "max_in_flight": r.metadata.max_in_flight,
    }


async def run_target(
    name: str, uri: str, args: argparse.Namespace, profile: cProfile.Profile | None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    size, chunk = parse_size(args.size), parse_size(args.chunk_size)
    rows: list[dict[str, Any]] = []
    ratios: list[float] = []
    write_ratios: list[float] = []
    write_dir = os.path.dirname(uri) if name != "null" else None
    reserve = args.reserve_space == "on"
    async with AsyncCheckpointer(
        chunk_size=chunk, num_buffers=args.num_buffers, seed=1, reserve_space=reserve
    ) as ckpt:
        await ckpt.save(uri, min(size, 4 * chunk))  # warm-up: pool pre-touched, dgen pool started
        pool = await ckpt.runtime.pool()
        views = [b.view for b in pool.buffers]

        def primed() -> None:
            if write_dir is not None and args.prime:
                prime(write_dir, size + 512 * 2**20, chunk)

        for pair in range(args.pairs):
            kernels_first = pair % 2 == 0  # A B, B A, ...: drift hits both sides alike
            if kernels_first:
                primed()
                k = kernels(views, size, chunk, copy=name != "null", seed=pair + 2, write_dir=write_dir)
            primed()
            p = await pipeline(ckpt, uri, size, profile)
            if not kernels_first:
                primed()
                k = kernels(views, size, chunk, copy=name != "null", seed=pair + 2, write_dir=write_dir)
            k_total = k["gen"] + k["crc"] + k["copy"]
            ratio = p["pipe_cpu_s_per_gb"] / k_total
            ratios.append(ratio)
            if write_dir is not None:
                write_ratios.append(p["pipe_cpu_s_per_gb"] / (k["gen"] + k["crc"] + k["write"]))
            rows.append(
                {
                    "target": name,
                    "pair": pair + 1,
                    "kern_gen": k["gen"],
                    "kern_crc": k["crc"],
                    "kern_copy": k["copy"],
                    "kern_write": k["write"] if write_dir is not None else None,
                    "kern_cpu_s_per_gb": k_total,
                    **p,
                    "ratio": ratio,
                    "ratio_vs_write": write_ratios[-1] if write_dir is not None else None,
                }
            )
    verdict = ratio_verdict(ratios, TARGET, at_most=True)
    verdict["pipe_cpu_s_per_gb_median"] = round(median([r["pipe_cpu_s_per_gb"] for r in rows]), 4)
    verdict["kern_cpu_s_per_gb_median"] = round(median([r["kern_cpu_s_per_gb"] for r in rows]), 4)
    if write_ratios:  # informative: the kernels with a real write in place of the memcpy
        verdict["vs_plain_write"] = ratio_verdict(write_ratios, TARGET, at_most=True)
    return rows, verdict


async def main(args: argparse.Namespace) -> None:
    profile = cProfile.Profile() if args.profile else None
    rows: list[dict[str, Any]] = []
    verdicts: dict[str, Any] = {}
    for name in args.targets.split(","):
        if name == "null":
            r, v = await run_target(name, "null://cpu-cost", args, profile)
        elif name == "tmpfs":
            with tempfile.TemporaryDirectory(dir=args.tmpfs, prefix="asyncckpt-cpu-") as tmp:
                r, v = await run_target(name, os.fspath(Path(tmp) / "ckpt.bin"), args, profile)
        else:
            raise SystemExit(f"unknown target {name!r} (null, tmpfs)")
        rows += r
        verdicts[name] = v
    emit(
        "cpu_cost",
        rows,
        (
            "target",
            "pair",
            "kern_gen",
            "kern_crc",
            "kern_copy",
            "kern_cpu_s_per_gb",
            "pipe_gen",
            "pipe_crc",
            "pipe_storage",
            "pipe_other",
            "pipe_cpu_s_per_gb",
            "ratio",
            "kern_write",
            "ratio_vs_write",
            "pipe_GBps",
            "direct_io",
        ),
        {
            "size_bytes": parse_size(args.size),
            "chunk_size": parse_size(args.chunk_size),
            "dgen_pool_threads": pool_threads()[0],
            "reserve_space": args.reserve_space,
            "tmpfs_primed": args.prime,
            "unit": "CPU seconds per 1e9 bytes (time.process_time)",
            "target": f"pipeline <= {TARGET} x kernels",
            "verdicts": verdicts,
        },
    )
    if profile is not None:
        profile.dump_stats(args.profile)
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="2GiB")
    p.add_argument("--chunk-size", default="32MiB")
    p.add_argument("--num-buffers", type=int, default=8)
    p.add_argument("--pairs", type=int, default=7)
    p.add_argument("--targets", default="null,tmpfs")
    p.add_argument(
        "--reserve-space", choices=("on", "off"), default="on", help="fallocate files up front (default: on)"
    )
    p.add_argument(
        "--tmpfs", type=directory, default="/dev/shm", help="a tmpfs directory for the file target"
    )
    p.add_argument(
        "--prime",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="before each tmpfs arm, write and unlink a file of the save's size + 512 MiB (untimed)",
    )
    p.add_argument("--profile", default=None, help="cProfile the saves (loop thread) into FILE")
    asyncio.run(main(p.parse_args()))

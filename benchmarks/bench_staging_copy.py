"""The staging copy's kernel: how fast one copy of a state lands in a staging area, by kernel.

``save_state(staging="host")`` blocks for one copy of the state into its page-aligned staging
area. The library copies with ``np.copyto`` in pieces of at most 8 MiB shared by two worker
threads. This compares that with torch's own ``copy_`` (its intra-op threads, every core)
into the same area and into ordinary ``empty_like`` tensors (the training bench's memcpy
baseline). A state of 2048 × 2048 float32 tensors; arms alternate; medians.

    python benchmarks/bench_staging_copy.py [--state-size 1GiB] [--repeats 7]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from _common import emit, median

from asyncckpt import parse_size
from asyncckpt.pool import private_mapping

PIECE = 8 << 20  # the library's largest copy piece
SHAPE = (2048, 2048)


def arms(nbytes: int) -> dict[str, Callable[[], float]]:
    import numpy as np
    import torch

    cores = os.cpu_count() or 1
    src = [torch.randn(SHAPE) for _ in range(max(1, nbytes // (4 * SHAPE[0] * SHAPE[1])))]
    total = sum(t.numel() * t.element_size() for t in src)
    area = private_mapping(total)  # as the staging area: anonymous, MADV_HUGEPAGE
    flat = np.frombuffer(area, np.uint8)
    flat[:] = 1  # faulted in, as reserve_staging leaves it
    as_torch = torch.frombuffer(area, dtype=torch.uint8)
    like = [torch.empty_like(t) for t in src]
    for d, s in zip(like, src, strict=True):
        d.copy_(s)
    pieces: list[tuple[int, Any]] = []
    offset = 0
    for t in src:
        raw = t.reshape(-1).view(torch.uint8).numpy()
        pieces += [(offset + a, raw[a : a + PIECE]) for a in range(0, len(raw), PIECE)]
        offset += len(raw)
    shares = [pieces[i::cores] for i in range(cores)]
    pool = ThreadPoolExecutor(cores)

    def numpy_pieces(share: list[tuple[int, Any]]) -> None:
        for at, piece in share:
            np.copyto(flat[at : at + len(piece)], piece)

    def library_kernel() -> float:
        t0 = time.perf_counter()
        list(pool.map(numpy_pieces, shares))
        return time.perf_counter() - t0

    torch_shares = [
        [(as_torch[at : at + len(piece)], torch.from_numpy(piece)) for at, piece in share] for share in shares
    ]

    def torch_pieces(share: list[tuple[Any, Any]]) -> None:
        for dst, piece in share:
            dst.copy_(piece)

    def torch_kernel_pieces() -> float:
        torch.set_num_threads(1)  # as a training on one thread per core leaves it: no intra-op pool
        t0 = time.perf_counter()
        list(pool.map(torch_pieces, torch_shares))
        return time.perf_counter() - t0

    def memmove_pieces(share: list[tuple[int, Any]]) -> None:
        base = ctypes.addressof(ctypes.c_char.from_buffer(area))
        for at, piece in share:
            ctypes.memmove(base + at, piece.ctypes.data, len(piece))

    def memmove_kernel() -> float:
        t0 = time.perf_counter()
        list(pool.map(memmove_pieces, shares))
        return time.perf_counter() - t0

    def torch_into(destinations: list[Any]) -> float:
        torch.set_num_threads(cores)
        t0 = time.perf_counter()
        for d, s in zip(destinations, src, strict=True):
            d.copy_(s)
        return time.perf_counter() - t0

    views, at = [], 0
    for t in src:
        n = t.numel() * t.element_size()
        views.append(as_torch[at : at + n].view(torch.float32).view(t.shape))
        at += n
    return {
        "np.copyto, 8 MiB pieces, worker threads -> area (the library)": library_kernel,
        "torch copy_, 8 MiB pieces, worker threads -> area": torch_kernel_pieces,
        "memmove (libc), 8 MiB pieces, worker threads -> area": memmove_kernel,
        "torch copy_, intra-op threads -> area": lambda: torch_into(views),
        "torch copy_, intra-op threads -> empty_like (bench_training's memcpy)": lambda: torch_into(like),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--state-size", type=parse_size, default=parse_size("1GiB"))
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    copies = arms(args.state_size)
    times: dict[str, list[float]] = {k: [] for k in copies}
    names = list(copies)
    for i in range(args.repeats):
        for name in names if i % 2 == 0 else names[::-1]:
            times[name].append(copies[name]())
    base = median(times[names[0]])
    rows = [
        {"kernel": k, "median_s": median(v), "min_s": min(v), "vs_library": median(v) / base}
        for k, v in times.items()
    ]
    emit(
        "staging_copy",
        rows,
        ["kernel", "median_s", "min_s", "vs_library"],
        {"times": times, "state_bytes": args.state_size},
    )


if __name__ == "__main__":
    main()

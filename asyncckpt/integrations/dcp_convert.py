"""Convert a DCP checkpoint of :class:`AsyncCkptStorageWriter` into DCP's stock layout.

``python -m asyncckpt.integrations.dcp_convert SRC DST`` (or :func:`to_stock`) writes into the
local directory ``DST`` what torch's ``FileSystemWriter`` would have written for the same save:
one ``__<rank>_0.distcp`` per object of ``SRC`` with each item as DCP's reader expects it
(tensors ``torch.save``\\ d, ``BYTE_IO`` items as they are), and a ``.metadata`` whose storage
entries are DCP's own. Torch's ``FileSystemReader`` then loads it without asyncckpt.

Why a converter rather than a writer mode: measured in ``benchmarks/bench_dcp_stock.py``
(``docs/interop.md``). Every object of ``SRC`` is read verified (chunk CRC32C) and streamed:
memory is the pool plus the largest item. Each object is written under a temporary name,
fsynced and renamed; ``.metadata`` last, so ``DST`` is loadable only once complete. Names that
already exist in ``DST`` are refused before anything is written; on failure, what this run
created is removed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pickle
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO, Any, NoReturn

from ..blocking import Offload, run_blocking
from ..checkpointer import AsyncCheckpointer
from ..config import CheckpointConfig
from ..errors import (
    AsyncCkptError,
    ConfigError,
    ManifestError,
    ManifestMissingError,
    MissingDependencyError,
    TargetNotFoundError,
    map_os_error,
)
from ..sinks import local_path
from .dcp import METADATA, ItemLocation, join, parse_metadata, read_small, saved_tensor

try:
    import torch
    from torch.distributed.checkpoint.filesystem import _StorageInfo  # what FileSystemReader unpickles
    from torch.distributed.checkpoint.metadata import MetadataIndex
except ImportError:  # pragma: no cover - the [torch] extra
    raise MissingDependencyError("torch", "torch", "the PyTorch DCP converter") from None


_SAVE_OVERHEAD = 2048  # torch.save's zip framing of one tensor, about 1.2 KiB here: an upper bound


@dataclass(frozen=True)
class ConvertResult:
    """What a conversion did: objects and items, bytes read and written, wall seconds."""

    objects: int
    items: int
    read_bytes: int
    written_bytes: int  # every file of DST, .metadata included
    seconds: float


class _Output:
    """One file of DST: written under ``.NAME.partial``, published by ``commit()``."""

    def __init__(self, directory: str, name: str, estimate: int = 0) -> None:
        self.final = os.path.join(directory, name)
        self.temp = os.path.join(directory, f".{name}.partial")
        self.file: IO[bytes] = open(self.temp, "xb")  # noqa: SIM115 - closed by commit/discard
        if estimate:  # allocated up front: buffered writes into a growing file were 3-5x slower
            os.posix_fallocate(self.file.fileno(), 0, estimate)

    def commit(self) -> int:
        self.file.flush()
        size = self.file.tell()
        os.ftruncate(self.file.fileno(), size)  # the allocation's unused tail
        os.fsync(self.file.fileno())
        self.file.close()
        os.replace(self.temp, self.final)
        return size

    def discard(self) -> None:
        self.file.close()
        for path in (self.temp, self.final):
            if os.path.exists(path):
                os.unlink(path)


def _copy(buf: bytearray, at: int, src: memoryview) -> None:
    buf[at : at + len(src)] = src


def _write_item(out: IO[bytes], loc: ItemLocation, buf: bytearray) -> tuple[int, int]:
    """(offset, length) of one item in ``out``: a tensor ``torch.save``d, bytes as they are."""
    start = out.tell()
    if loc.dtype is None or loc.shape is None:
        out.write(buf)
    else:
        torch.save(saved_tensor(buf, loc.dtype, loc.shape), out)
    return start, out.tell() - start


async def _convert_object(
    ckpt: AsyncCheckpointer,
    uri: str,
    out: _Output,
    items: Sequence[tuple[MetadataIndex, ItemLocation]],
    offload: Offload,
) -> dict[MetadataIndex, Any]:
    """Stream ``uri`` once, verified; each item, once whole, goes to ``out`` in a thread."""
    entries: dict[MetadataIndex, Any] = {}
    pending = sorted(items, key=lambda pair: pair[1].offset)
    name = os.path.basename(out.final)
    pos, at = 0, 0
    buf = bytearray(pending[0][1].length) if pending else bytearray()
    filled = 0  # bytes of buf already copied

    async def emit() -> None:
        nonlocal at, buf, filled
        index, loc = pending[at]
        offset, length = await run_blocking(offload, _write_item, out.file, loc, buf)
        entries[index] = _StorageInfo(relative_path=name, offset=offset, length=length)
        at, filled = at + 1, 0
        buf = bytearray(pending[at][1].length) if at < len(pending) else bytearray()

    while at < len(pending) and pending[at][1].length == 0:
        await emit()
    if at == len(pending):  # only empty items: a rank with nothing to write wrote no object
        return entries
    async with ckpt.iter_load(uri) as stream:
        async for view in stream:
            end = pos + len(view)
            while at < len(pending):
                loc = pending[at][1]
                lo, hi = max(pos, loc.offset + filled), min(end, loc.offset + loc.length)
                if lo < hi:  # a memcpy of up to a chunk: off the loop
                    await run_blocking(offload, _copy, buf, filled, view[lo - pos : hi - pos])
                    filled += hi - lo
                if filled < loc.length:
                    break
                await emit()
            pos = end
            if at == len(pending):
                break
    if at < len(pending):
        raise ManifestError(f"{uri!r} ended at byte {pos} before every item was read")
    return entries


def _check_destination(dst: str, names: Sequence[str]) -> str:
    directory = local_path(dst)
    if directory is None:
        raise ConfigError(
            f"destination {dst!r} must be a local directory (torch's FileSystemReader reads files)"
        )
    if os.path.lexists(directory) and not os.path.isdir(directory):
        raise ConfigError(
            f"destination {dst!r} exists and is not a directory: choose a new or empty directory"
        )
    taken = [n for n in names if os.path.lexists(os.path.join(directory, n))]
    if taken:
        raise ConfigError(f"destination {dst!r} already holds {', '.join(taken)}: choose an empty directory")
    return os.fspath(directory)


async def convert(src: str, dst: str, config: CheckpointConfig) -> ConvertResult:
    """See :func:`to_stock`."""
    t0 = time.perf_counter()
    async with AsyncCheckpointer(config) as ckpt:
        uri = join(src, METADATA)
        try:
            metadata = parse_metadata(await read_small(ckpt, uri), uri)
        except TargetNotFoundError as exc:
            raise TargetNotFoundError(
                exc.errno, f"no committed asyncckpt DCP checkpoint at {src!r}: {uri!r} does not exist"
            ) from exc
        except ManifestMissingError as exc:  # a stock DCP checkpoint, or another file named .metadata
            raise ConfigError(
                f"{src!r} is not an asyncckpt DCP checkpoint: its {METADATA} has no asyncckpt manifest "
                f"(a stock DCP checkpoint loads with torch's FileSystemReader as it is): {exc}"
            ) from exc
        per_object: dict[str, list[tuple[MetadataIndex, ItemLocation]]] = {}
        for index, loc in metadata.storage_data.items():
            per_object.setdefault(loc.relative_path, []).append((index, loc))
        directory = _check_destination(dst, [METADATA, *per_object])
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as exc:
            raise map_os_error(exc, f"create {directory}") from exc
        made: list[_Output] = []
        written, offload = 0, Offload(1)
        try:
            storage: dict[MetadataIndex, Any] = {}
            for name, items in sorted(per_object.items()):
                estimate = sum(loc.length + _SAVE_OVERHEAD for _, loc in items)
                made.append(out := await run_blocking(offload, _Output, directory, name, estimate))
                storage.update(await _convert_object(ckpt, join(src, name), out, items, offload))
                written += await run_blocking(offload, out.commit)
            metadata.storage_data = storage
            made.append(meta := await run_blocking(offload, _Output, directory, METADATA))
            await run_blocking(offload, pickle.dump, metadata, meta.file)
            written += await run_blocking(offload, meta.commit)
        except BaseException as exc:
            for out in made:
                out.discard()
            if isinstance(exc, OSError) and not isinstance(exc, AsyncCkptError):
                raise map_os_error(exc, f"convert into {directory}") from exc
            raise
    read = sum(loc.length for items in per_object.values() for _, loc in items)
    return ConvertResult(len(per_object), len(metadata.storage_data), read, written, time.perf_counter() - t0)


def to_stock(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    config: CheckpointConfig | None = None,
    **options: Any,
) -> ConvertResult:
    """Convert the asyncckpt DCP checkpoint at ``src`` (a directory or ``s3://`` prefix) into
    DCP's stock layout in the local directory ``dst``; blocking (runs its own event loop)."""
    if config is not None and options:
        raise ConfigError("pass either config= or keyword options, not both")
    cfg = config if config is not None else CheckpointConfig.from_options(**options)
    return asyncio.run(convert(os.fspath(src), os.fspath(dst), cfg))


class _Parser(argparse.ArgumentParser):
    """Bad arguments: one line on stderr and exit code 2, as any other bad input."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"asyncckpt: {message} (usage: {self.format_usage().strip().removeprefix('usage: ')})\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = _Parser(
        prog="python -m asyncckpt.integrations.dcp_convert",
        description="Convert an asyncckpt DCP checkpoint into DCP's stock layout (torch's FileSystemReader).",
    )
    parser.add_argument("src", help="the asyncckpt DCP checkpoint: a directory or s3://bucket/prefix")
    parser.add_argument("dst", help="a new local directory for the stock checkpoint")
    args = parser.parse_args(argv)
    try:
        done = to_stock(args.src, args.dst)
    except (AsyncCkptError, OSError) as exc:
        print(f"asyncckpt: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, (ConfigError, TargetNotFoundError)) else 1
    print(
        f"converted {done.objects} object(s), {done.items} item(s): read {done.read_bytes} bytes, "
        f"wrote {done.written_bytes} bytes in {done.seconds:.3f} s to {args.dst}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

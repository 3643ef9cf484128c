"""Do the library defaults reach the device? asyncckpt's default save and load against fio's best.

fio (Debian's package) is the baseline: sequential O_DIRECT writes and reads of the same size
in blocks of asyncckpt's default chunk size, in the same directory. First a sweep over engines
(libaio, io_uring), queue depths (1-8) and fio's buffer memory (malloc'd, and huge pages:
``--iomem=shmhuge``) finds fio's best configuration for writing and for reading; then at least
5 alternating pairs run that best fio job and asyncckpt with *no tuning*
(``AsyncCheckpointer()``: the library's defaults; ``save(path, size)``, ``load(path)``), the
order flipped every round, and each pair gives one ratio asyncckpt / fio. A pair's loads begin
with two untimed fio reads of the saved file, then read twice per side in mirrored order (fio,
asyncckpt, asyncckpt, fio, then the other way round in the next pair), each side's two reads
taken together: on this VM the second read after a save runs about 7 % slower than the others
for either reader, which one read each in alternating order turned into a pair-to-pair swing
of the ratio (0.88, 1.01, 0.88, ...). The verdict comes
from ``_common.ratio_verdict`` (target 0.97: "met" only when the whole 95 % bootstrap interval
of the median ratio clears it).

Huge pages (issue 29): asyncckpt's pool is huge-page memory, so fio gets the same advantage.
As root the script reserves enough 2 MiB pages for fio's largest buffer (deepest queue x block
size, fio's alignment, a margin) by raising /proc/sys/vm/nr_hugepages, reads the value back,
and puts the previous value back when the measurements end, whatever ends them (an error,
fio failing, SIGINT, SIGTERM; not SIGKILL). The JSON (``fio_huge_pages``) and the table say
whether huge pages were used and, if not, why: ``--no-huge-pages``, not root, the kernel gave
fewer pages than asked, or fio refused them.

Fair to fio, hence strict for asyncckpt: fio's write job ``fallocate``s outside its timing and
its figure is fio's own bandwidth (``bw_bytes``: the job's I/O phase including ``end_fsync``,
without process start or file layout); asyncckpt's figure is end to end (open with fallocate,
generation with dgen-py, CRC32C per chunk, writes, the sealed manifest, fsync, rename,
directory fsync; a load reads the footer, then the data, verifying CRC32C, its default). Each
side writes a fresh file (deleted outside the timing). fio reads the file asyncckpt saved (its
first ``size`` bytes), so both read the same extents. O_DIRECT keeps the page cache out of
both; ``--drop-caches`` also writes 3 to /proc/sys/vm/drop_caches before every read (root
only; it affects everything else on the machine, so it is off by default).

    python benchmarks/bench_fio.py --size 2GiB --pairs 7 --dir /var/tmp
    python benchmarks/bench_fio.py --size 256MiB --pairs 5 --depths 1,4   # a quick look
    python benchmarks/bench_fio.py --size 2GiB --max-in-flight 1   # how the old default compares
    python benchmarks/bench_fio.py --size 2GiB --engines libaio --depths 7 --write-loop

``--write-loop`` adds a third arm to each save pair: a plain loop of the save's O_DIRECT writes
(as many in flight, from a pool-like area, no generation, checksums or rename), timed like the
save. In the same minute as fio, loop / fio is the device (and the write path) alone and
save / loop what the save adds to its writes, so a device in a fast or slow phase is told
apart from the save's own cost.

Prints progress on stderr, then a table and one JSON document. Exit status 2 when fio is not
installed, 1 when no fio configuration ran, 128 + N when stopped by signal N.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import mmap
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, get_args

from _common import directory, emit, ratio_verdict, rotation

from asyncckpt import AsyncCheckpointer
from asyncckpt.config import CheckpointConfig
from asyncckpt.errors import AsyncCkptError, ConfigError
from asyncckpt.modes import ThreadBudgetRule
from asyncckpt.results.records import RunResult
from asyncckpt.sinks import backend_class
from asyncckpt.units import parse_size

INSTALL_HINT = (
    "fio is not installed. Install Debian's package as root:\n"
    "    apt-get update && apt-get install -y fio\n"
    "then run this benchmark again."
)
TARGET = 0.97
LOADS_PER_PAIR = 2  # each side reads twice per pair (A B B A)
DROP_CACHES = Path("/proc/sys/vm/drop_caches")
NR_HUGEPAGES = Path("/proc/sys/vm/nr_hugepages")  # pages of the default huge page size
MEMINFO = Path("/proc/meminfo")
HUGE_MARGIN_PAGES = 2  # beyond what fio 3.33 is computed to take (fio_huge_pages)
FIO_STOP_S = 30.0  # how long a stopped fio gets to free its buffers before it is killed
T = TypeVar("T")


class FioError(RuntimeError):
    """fio failed, or none of its configurations ran."""


class Stopped(Exception):
    """SIGINT or SIGTERM arrived; everything the run held has been given back."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def fio_binary() -> str | None:
    return shutil.which("fio")


def drop_caches() -> None:
    os.sync()
    DROP_CACHES.write_text("3\n")


def unlink(path: Path) -> None:
    path.unlink(missing_ok=True)


def huge_page_bytes() -> int:
    """The default huge page size (the unit of nr_hugepages); 0 if the kernel has none."""
    for line in MEMINFO.read_text().splitlines():
        if line.startswith("Hugepagesize:"):
            return int(line.split()[1]) * 1024
    return 0


def fio_huge_pages(block: int, depth: int, page: int) -> int:
    """Huge pages fio's ``shmhuge`` buffers take at this depth: fio 3.33 sizes them as depth x
    block plus a page of alignment rounded up to a huge page (backend.c ``init_io_u``), adds a
    page of alignment again (memory.c), and shmget rounds up once more. Measured: depth 2 x
    32 MiB runs with 34 pages and fails with 33."""

    def up(n: int) -> int:
        return -(-n // page) * page

    small = os.sysconf("SC_PAGE_SIZE")
    return up(up(depth * block + small - 1) + small - 1) // page


def read_nr_hugepages() -> int:
    return int(NR_HUGEPAGES.read_text())


@dataclass
class HugePages:
    """What the huge-page arm had: pages asked, nr_hugepages before / during / after, and
    ``reason`` when fio could not use them (the JSON's ``fio_huge_pages``)."""

    pages: int = 0
    page_bytes: int = 0
    ready: bool = False  # pages reserved (and read back): the sweep runs the shmhuge arm
    used: bool = False  # a shmhuge fio job succeeded
    reason: str | None = None
    nr_hugepages_before: int | None = None
    nr_hugepages_during: int | None = None
    nr_hugepages_after: int | None = None
    fio_errors: list[str] = field(default_factory=list)

    def report(self) -> dict[str, Any]:
        return {
            "used": self.used,
            "reason": None if self.used else self.reason,
            "page_bytes": self.page_bytes,
            "pages": self.pages,
            "nr_hugepages_before": self.nr_hugepages_before,
            "nr_hugepages_during": self.nr_hugepages_during,
            "nr_hugepages_after": self.nr_hugepages_after,
        }

    def row(self) -> dict[str, Any]:
        """The table's line: used or not, and why."""
        if self.used:
            note = (
                f"used: nr_hugepages {self.nr_hugepages_before} -> {self.nr_hugepages_during},"
                f" restored to {self.nr_hugepages_after}"
            )
        else:
            note = f"not used: {self.reason}"
        size = f"{self.pages} x {self.page_bytes >> 20} MiB pages" if self.pages else "none"
        return {"phase": "setup", "op": "huge pages", "config": f"fio shmhuge: {size}", "note": note}


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def why_no_huge_pages(enabled: bool, page: int) -> str | None:
    """Why the huge-page arm cannot even be tried, else None."""
    if not enabled:
        return "off (--no-huge-pages)"
    if os.geteuid() != 0:
        return f"not root: reserving huge pages means writing {NR_HUGEPAGES}"
    if page == 0:
        return f"the kernel has no huge pages (no Hugepagesize in {MEMINFO})"
    return None


def restore_nr_hugepages(huge: HugePages, before: int) -> None:
    """Put the previous nr_hugepages back and read it back; say so loudly if that failed."""
    try:
        NR_HUGEPAGES.write_text(f"{before}\n")
        huge.nr_hugepages_after = read_nr_hugepages()
    except OSError as exc:
        say(f"huge pages: could not restore nr_hugepages to {before} ({exc}); as root run:")
        say(f"    echo {before} > {NR_HUGEPAGES}")
        return
    if huge.nr_hugepages_after != before:
        say(f"huge pages: nr_hugepages reads back {huge.nr_hugepages_after} after restoring {before}")
    else:
        say(f"huge pages: nr_hugepages restored to {before}")


def reserve(huge: HugePages, before: int) -> None:
    """Raise nr_hugepages by ``huge.pages`` and read it back; ``huge.ready`` if the kernel gave
    them all, else ``huge.reason`` says why not."""
    try:
        NR_HUGEPAGES.write_text(f"{before + huge.pages}\n")
        huge.nr_hugepages_during = got = read_nr_hugepages()
    except OSError as exc:
        huge.reason = f"could not raise nr_hugepages: {exc}"
        return
    say(f"huge pages: nr_hugepages {before} -> {got} ({huge.pages} asked for fio's buffers)")
    if got < before + huge.pages:
        huge.reason = f"the kernel gave {got - before} of the {huge.pages} huge pages asked"
    huge.ready = huge.reason is None


@contextlib.contextmanager
def reserved_huge_pages(enabled: bool, block: int, depth: int) -> Iterator[HugePages]:
    """Huge pages for fio's buffers while the body runs: nr_hugepages raised by what fio needs at
    ``depth`` (plus a margin) and read back, then the previous value put back on every exit
    (exceptions and cancellation included; SIGINT/SIGTERM cancel the run, see ``until_signal``).
    Fewer pages than asked are given back at once: fio runs from malloc'd buffers only."""
    page = huge_page_bytes() if enabled else 0
    huge = HugePages(page_bytes=page, reason=why_no_huge_pages(enabled, page))
    if huge.reason is None:
        huge.pages = fio_huge_pages(block, depth, page) + HUGE_MARGIN_PAGES
        before = huge.nr_hugepages_before = read_nr_hugepages()
        try:
            reserve(huge, before)
        finally:
            if not huge.ready:
                restore_nr_hugepages(huge, before)
    if not huge.ready:
        yield huge
        return
    try:
        yield huge
    finally:
        restore_nr_hugepages(huge, before)


async def stop(proc: asyncio.subprocess.Process) -> None:
    """End a fio that is still running the way fio cleans up after itself (SIGTERM: it stops its
    jobs and removes its shared memory segments); SIGKILL only if it does not exit in time."""
    if proc.returncode is not None:
        return
    proc.terminate()
    try:
        await asyncio.wait_for(proc.wait(), FIO_STOP_S)
    except TimeoutError:
        say(f"fio (pid {proc.pid}) did not stop within {FIO_STOP_S:.0f} s of SIGTERM: killed")
        proc.kill()
        await proc.wait()


@dataclass(frozen=True)
class Fio:
    """fio jobs of one size and block size: sequential, O_DIRECT, one job."""

    binary: str
    size: int
    block: int
    drop: bool  # drop the page cache before each read
    huge_page: int = 0  # huge page size for ``shmhuge`` buffers

    def args(self, rw: str, path: Path, engine: str, depth: int, iomem: str) -> list[str]:
        args = [
            self.binary,
            "--name=asyncckpt-fio",
            f"--filename={path}",
            f"--rw={rw}",
            f"--bs={self.block}",
            f"--size={self.size}",
            "--direct=1",
            f"--ioengine={engine}",
            f"--iodepth={depth}",
            "--numjobs=1",
            f"--iomem={iomem}",
            "--output-format=json",
        ]
        if iomem == "shmhuge":
            args.append(f"--hugepage-size={self.huge_page}")
        return args + (["--fallocate=native", "--end_fsync=1"] if rw == "write" else ["--readonly"])

    async def job(self, rw: str, path: Path, engine: str, depth: int, iomem: str) -> float:
        """One fio job; its bandwidth in bytes/s (FioError if fio failed)."""
        proc = await asyncio.create_subprocess_exec(
            *self.args(rw, path, engine, depth, iomem),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await proc.communicate()
        finally:
            await stop(proc)  # cancelled (a signal): fio frees its huge pages before they are released
        what = f"fio {rw} {engine} depth {depth} {iomem}"
        if proc.returncode != 0:
            raise FioError(f"{what} failed: {err.decode(errors='replace').strip()}")
        text = out.decode(errors="replace")
        job = json.loads(text[text.index("{") :])["jobs"][0]  # fio may print notes before the JSON
        if job.get("error"):
            raise FioError(f"{what}: error {job['error']}")
        if job[rw]["io_bytes"] != self.size:
            raise FioError(f"{what} moved {job[rw]['io_bytes']} bytes, not {self.size}")
        return float(job[rw]["bw_bytes"])

    async def write(self, path: Path, engine: str, depth: int, iomem: str) -> float:
        unlink(path)  # a fresh file, as a save writes one
        try:
            return await self.job("write", path, engine, depth, iomem)
        finally:
            unlink(path)

    async def read(self, path: Path, engine: str, depth: int, iomem: str) -> float:
        if self.drop:
            drop_caches()
        return await self.job("read", path, engine, depth, iomem)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


async def sweep(
    fio: Fio,
    args: argparse.Namespace,
    paths: tuple[Path, Path],
    huge: HugePages,
    rows: list[dict[str, Any]],
) -> dict[str, dict[str, Any]]:
    """fio over every engine, depth and buffer memory, for writes and reads; the best (median
    GB/s) of each. ``paths``: where writes go, and the file reads read."""
    mems = ["malloc", "shmhuge"] if huge.ready else ["malloc"]
    best: dict[str, dict[str, Any]] = {}
    for rw in ("write", "read"):
        for engine in args.engines:
            for depth in args.depths:
                for iomem in mems:
                    config = f"{engine} depth {depth} {iomem}"
                    row: dict[str, Any] = {"phase": "sweep", "op": rw, "config": config}
                    rows.append(row)
                    say(f"sweep: {rw} {config}")
                    rates: list[float] = []
                    try:
                        for _ in range(args.sweep_reps):
                            if rw == "write":
                                rates.append(await fio.write(paths[0], engine, depth, iomem))
                            else:
                                rates.append(await fio.read(paths[1], engine, depth, iomem))
                    except FioError as exc:  # e.g. io_uring disabled by a sandbox, no huge pages
                        say(f"skipped: {exc}")
                        row["note"] = "failed"
                        if iomem == "shmhuge":
                            huge.fio_errors.append(first_line(exc))
                        continue
                    huge.used = huge.used or iomem == "shmhuge"
                    row["fio_GBps"] = gbps = statistics.median(rates) / 1e9
                    if rw not in best or gbps > best[rw]["GBps"]:
                        best[rw] = {"engine": engine, "depth": depth, "iomem": iomem, "GBps": gbps}
    if huge.ready and not huge.used:
        huge.reason = f"fio refused them: {huge.fio_errors[0]}" if huge.fio_errors else "no shmhuge job ran"
    return best


@dataclass
class WriteLoop:
    """``--write-loop``: the save's writes without the save, timed like it (open with
    fallocate to fsync'd). Synchronous O_DIRECT ``pwrite``s of ``block`` bytes on ``threads``
    threads (the save's writes in flight), from an area like the pool (transparent huge pages,
    random bytes written once): no generation, no checksum, no manifest, no rename. Beside fio
    in the same minute it splits the device's drift (loop ÷ fio) from what the save adds to its
    writes (save ÷ loop)."""

    size: int
    block: int
    threads: int
    area_bytes: int

    def __post_init__(self) -> None:
        self.area = mmap.mmap(-1, self.area_bytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.huge_pages_advised = False  # no THP here: 4 KiB pages (the JSON says which)
        with contextlib.suppress(AttributeError, OSError):
            self.area.madvise(mmap.MADV_HUGEPAGE)
            self.huge_pages_advised = True
        view = memoryview(self.area)
        for at in range(0, self.area_bytes, self.block):
            view[at : at + self.block] = os.urandom(self.block)
        self.buffers = [view[at : at + self.block] for at in range(0, self.area_bytes, self.block)]

    def run(self, path: Path) -> float:
        """One file of ``size`` bytes written and fsync'd; bytes/s, open to fsync."""
        unlink(path)
        start = time.perf_counter()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_DIRECT, 0o600)
        try:
            os.posix_fallocate(fd, 0, self.size)

            def write(k: int) -> None:
                offset = k * self.block
                view = self.buffers[k % len(self.buffers)][: min(self.block, self.size - offset)]
                if os.pwrite(fd, view, offset) != len(view):
                    raise OSError(f"short write at offset {offset} of {path}")

            with ThreadPoolExecutor(self.threads, thread_name_prefix="write-loop") as pool:
                list(pool.map(write, range(-(-self.size // self.block))))
            os.fsync(fd)
        finally:
            os.close(fd)
        seconds = time.perf_counter() - start
        unlink(path)
        return self.size / seconds


def fio_config(cfg: dict[str, Any]) -> str:
    return f"fio {cfg['engine']} depth {cfg['depth']} {cfg['iomem']}"


def combined(size: int, rates: Sequence[float]) -> float:
    """The rate of several runs of ``size`` bytes taken together: all bytes over all time."""
    return size * len(rates) / sum(size / r for r in rates)


def pair_row(
    i: int,
    op: str,
    fio_cfg: dict[str, Any],
    order: str,
    size: int,
    fio_bps: Sequence[float],
    ours: Sequence[RunResult],
) -> dict[str, Any]:
    """A pair's line of ``op``: each side's runs in the pair (one, or two for loads) taken together."""
    rate, fio_rate = combined(size, [r.throughput_bps for r in ours]), combined(size, fio_bps)
    # what held asyncckpt back, from its own per-chunk records (Generation means the CPU)
    held = ", ".join(sorted({r.bottleneck for r in ours}))
    io = " and ".join(f"{r.io_bps / 1e9:.2f}" for r in ours)
    return {
        "phase": f"pair {i + 1}",
        "op": op,
        "config": f"{fio_config(fio_cfg)} {order}",
        "fio_GBps": fio_rate / 1e9,
        "asyncckpt_GBps": rate / 1e9,
        "ratio": rate / fio_rate,
        "note": f"bottleneck {held}, I/O {io} GB/s",
    }


def verdict_rows(
    save_verdict: dict[str, Any],
    load_verdict: dict[str, Any],
    tuning: dict[str, Any],
    load_tuning: dict[str, Any],
) -> list[dict[str, Any]]:
    rows = []
    for op, verdict, tuned in (("save", save_verdict, tuning), ("load", load_verdict, load_tuning)):
        note = f"{verdict['verdict']} (target {verdict['target']})"
        rows.append(
            verdict_row(
                "verdict", op, verdict, note + (f", TUNED {tuned}, not the defaults" if tuned else "")
            )
        )
    return rows


def verdict_row(phase: str, op: str, verdict: dict[str, Any], note: str) -> dict[str, Any]:
    """A table line of one ratio verdict: its median, 95 % interval and ``note``."""
    low, high = verdict["ci95"]
    return {
        "phase": phase,
        "op": op,
        "config": f"median of {verdict['pairs']}, 95 % CI {low:.3f}-{high:.3f}",
        "ratio": verdict["median_ratio"],
        "note": note,
    }


@dataclass
class Measured:
    """What the sweep and the pairs measured."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    best: dict[str, dict[str, Any]] = field(default_factory=dict)
    saves: list[RunResult] = field(default_factory=list)
    loads: list[RunResult] = field(default_factory=list)  # LOADS_PER_PAIR per pair
    fio_w: list[float] = field(default_factory=list)
    fio_r: list[float] = field(default_factory=list)  # LOADS_PER_PAIR per pair
    loops: list[float] = field(default_factory=list)  # --write-loop, bytes/s per pair
    facts: dict[str, Any] = field(default_factory=dict)


async def measure(
    args: argparse.Namespace,
    fio: Fio,
    ckpt: AsyncCheckpointer,
    directory: Path,
    huge: HugePages,
    loop: WriteLoop | None = None,
) -> Measured:
    """The sweep, then the alternating pairs of fio's best and asyncckpt's default save/load."""
    m = Measured()
    ckpt_path = directory / "asyncckpt.ckpt"
    fio_path = directory / "fio.bin"
    m.best = await sweep(fio, args, (fio_path, ckpt_path), huge, m.rows)
    if "write" not in m.best or "read" not in m.best:
        raise FioError("no fio configuration ran; see the messages above")
    bw, br = m.best["write"], m.best["read"]

    async def fio_save() -> None:
        m.fio_w.append(await fio.write(fio_path, bw["engine"], bw["depth"], bw["iomem"]))

    async def ckpt_save() -> None:
        unlink(ckpt_path)
        m.saves.append(await ckpt.save(ckpt_path, args.size))

    async def fio_load() -> None:
        m.fio_r.append(await fio.read(ckpt_path, br["engine"], br["depth"], br["iomem"]))

    async def ckpt_load() -> None:
        if args.drop_caches:
            drop_caches()
        # default verification (CRC32C) unless --no-verify, default readers
        result = await ckpt.load(ckpt_path, verify=not args.no_verify)
        m.loads.append(result)
        m.facts["reads_in_flight"] = result.metadata.max_in_flight
        m.facts["read_direct_io"] = result.metadata.direct_io_reason
        m.facts["load_verified"] = not args.no_verify

    writes = [fio_save, ckpt_save]
    if loop is not None:
        loop_path = directory / "loop.bin"

        async def loop_write() -> None:
            m.loops.append(await asyncio.to_thread(loop.run, loop_path))

        writes.append(loop_write)
    for i in range(args.pairs):
        say(f"pair {i + 1} of {args.pairs}")
        fio_first = i % 2 == 0  # the order flips every round: drift favours neither side
        order = rotation(len(writes), i)  # two arms: fio first in even rounds, as the loads
        for k in order:
            await writes[k]()
        # On this VM the second read of a freshly saved file runs about 7 % slower than the
        # first and the third to fifth, for fio and asyncckpt alike (by position, medians of 4
        # rounds); one read each in alternating order put whichever came second at that loss
        # (ratios 0.88 and 1.01 in turn). So two untimed reads go first, then A B B A.
        for _ in range(2):
            await fio.read(ckpt_path, br["engine"], br["depth"], br["iomem"])
        first, second = (fio_load, ckpt_load) if fio_first else (ckpt_load, fio_load)
        for step in (first, second, second, first):  # LOADS_PER_PAIR each
            await step()
        saved = "first" if order.index(0) < order.index(1) else "second"  # fio before the save?
        m.rows.append(pair_row(i, "save", bw, saved, args.size, m.fio_w[-1:], m.saves[-1:]))
        read = "(fio, asyncckpt x 2, fio)" if fio_first else "(asyncckpt, fio x 2, asyncckpt)"
        n = LOADS_PER_PAIR
        m.rows.append(pair_row(i, "load", br, read, args.size, m.fio_r[-n:], m.loads[-n:]))
        if loop is not None:
            m.rows.append(loop_row(i, bw, m.fio_w[-1], m.loops[-1], m.saves[-1]))
    return m


def loop_row(
    i: int, fio_cfg: dict[str, Any], fio_bps: float, loop_bps: float, save: RunResult
) -> dict[str, Any]:
    """``--write-loop``'s line of a pair: the loop beside fio, and the save beside the loop."""
    return {
        "phase": f"pair {i + 1}",
        "op": "write loop",
        "config": f"{fio_config(fio_cfg)}; the loop in the asyncckpt column",
        "fio_GBps": fio_bps / 1e9,
        "asyncckpt_GBps": loop_bps / 1e9,
        "ratio": loop_bps / fio_bps,
        "note": f"save / loop {save.throughput_bps / loop_bps:.3f}",
    }


def ratios(size: int, ours: list[RunResult], fio_bps: list[float], per_pair: int = 1) -> list[float]:
    """asyncckpt / fio, pair by pair, each side's ``per_pair`` runs of a pair taken together."""
    return [
        combined(size, [r.throughput_bps for r in ours[k : k + per_pair]])
        / combined(size, fio_bps[k : k + per_pair])
        for k in range(0, len(ours), per_pair)
    ]


async def run(args: argparse.Namespace, binary: str, directory: Path) -> dict[str, Any]:
    # the defaults under test (what AsyncCheckpointer() uses), or one override to compare with
    tuning: dict[str, Any] = {} if args.max_in_flight is None else {"max_in_flight": args.max_in_flight}
    if args.thread_budget is not None:
        tuning["thread_budget"] = args.thread_budget
    config = CheckpointConfig(**tuning)
    file_sink = backend_class("file")
    ckpt_path = directory / "asyncckpt.ckpt"
    async with AsyncCheckpointer(**tuning) as ckpt:  # without --max-in-flight: no tuning at all
        # warm-up (not timed): faults the pool in, and leaves a file for the read sweep
        first = await ckpt.save(ckpt_path, args.size)
        facts: dict[str, Any] = {"writes_in_flight": first.metadata.max_in_flight}
        facts["direct_io"] = first.metadata.direct_io_reason
        loop = None
        if args.write_loop:
            in_flight = first.metadata.max_in_flight
            loop = WriteLoop(args.size, config.chunk_size, in_flight, config.pool_bytes)
        # huge pages are reserved for the fio measurements only, and given back however they end
        with reserved_huge_pages(args.huge_pages, config.chunk_size, max(args.depths)) as huge:
            fio = Fio(binary, args.size, config.chunk_size, args.drop_caches, huge.page_bytes)
            m = await measure(args, fio, ckpt, directory, huge, loop)
    unlink(ckpt_path)
    splits: dict[str, dict[str, Any]] = {}
    loop_facts: dict[str, Any] = {}
    if loop is not None:
        splits["loop_vs_fio"] = ratio_verdict([a / f for a, f in zip(m.loops, m.fio_w, strict=True)], TARGET)
        splits["save_vs_loop"] = ratio_verdict(
            [s.throughput_bps / a for s, a in zip(m.saves, m.loops, strict=True)], TARGET
        )
        facts_of_loop = {"threads": loop.threads, "area_bytes": loop.area_bytes}
        facts_of_loop["huge_pages_advised"] = loop.huge_pages_advised
        loop_facts["write_loop"] = {**facts_of_loop, **splits}
    save_verdict = ratio_verdict(ratios(args.size, m.saves, m.fio_w), TARGET)
    load_verdict = ratio_verdict(ratios(args.size, m.loads, m.fio_r, LOADS_PER_PAIR), TARGET)
    shown = {**tuning, "verify": False} if args.no_verify else tuning
    rows = [huge.row(), *m.rows, *verdict_rows(save_verdict, load_verdict, tuning, shown)]
    for op, split in splits.items():
        what = "the device's drift" if op == "loop_vs_fio" else "what the save adds to its writes"
        rows.append(verdict_row("split", op.replace("_vs_", " / "), split, what))
    return {
        "rows": rows,
        "extra": {
            "directory": str(directory),
            "size_bytes": args.size,
            "block_bytes": config.chunk_size,
            "asyncckpt": {
                "tuning": shown or "none: library defaults",
                "chunk_size": config.chunk_size,
                "num_buffers": config.num_buffers,
                "pool_bytes": config.pool_bytes,
                "file_default_in_flight": file_sink.default_in_flight,
                **facts,
                **m.facts,
            },
            "fio_best": m.best,
            "fio_huge_pages": huge.report(),
            "fio_bandwidth": "fio's bw_bytes: its I/O phase incl. end_fsync, no start-up or layout",
            "asyncckpt_throughput": "size / wall, open (fallocate) to published (fsync, rename, dir fsync)",
            "drop_caches": bool(args.drop_caches),
            "save": save_verdict,
            "load": load_verdict,
            **loop_facts,
        },
    }


async def until_signal(work: Callable[[], Awaitable[T]]) -> T:
    """Run ``work``; the first SIGINT or SIGTERM cancels it (raising ``Stopped`` once it has
    unwound), so fio is stopped, nr_hugepages restored and files deleted before the exit."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    got: list[int] = []

    def on_signal(signum: int) -> None:
        if not got:  # a second signal must not cut the clean-up short
            got.append(signum)
            say(f"{signal.Signals(signum).name}: stopping fio and giving back what the run holds")
            task.cancel()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        return await work()
    except asyncio.CancelledError:
        if got:
            raise Stopped(got[0]) from None
        raise
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)


def _ints(text: str) -> list[int]:
    out = sorted({int(x) for x in text.split(",") if x.strip()})
    if not out or out[0] < 1:
        raise argparse.ArgumentTypeError(f"depths must be positive integers, got {text!r}")
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=lambda s: parse_size(s, name="--size"), default="2GiB")
    p.add_argument(
        "--dir",
        type=directory,
        default=None,
        help="directory on the file system to measure (default: $TMPDIR)",
    )
    p.add_argument("--pairs", type=int, default=7, help="alternating pairs (at least 5)")
    p.add_argument(
        "--thread-budget",
        choices=get_args(ThreadBudgetRule),
        default=None,
        help="asyncckpt's thread-budget rule instead of the library default (a tuned comparison)",
    )
    p.add_argument("--engines", type=lambda s: [e for e in s.split(",") if e], default="libaio,io_uring")
    p.add_argument("--depths", type=_ints, default="1,2,3,4,5,6,7,8", help="queue depths to sweep")
    p.add_argument("--sweep-reps", type=int, default=3, help="fio runs per sweep configuration (median)")
    p.add_argument(
        "--huge-pages",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also sweep fio with huge-page buffers (--iomem=shmhuge), reserving the pages through "
        "/proc/sys/vm/nr_hugepages while fio measures (root; the previous value is put back)",
    )
    p.add_argument(
        "--max-in-flight",
        type=int,
        default=None,
        help="run asyncckpt with this many writes/reads in flight instead of its defaults (to compare)",
    )
    p.add_argument(
        "--no-verify",
        action="store_true",
        help="load without checking the CRC32C (verify=False), to price the check against fio, "
        "which checks nothing; the verdict is then marked as not the defaults",
    )
    p.add_argument(
        "--write-loop",
        action="store_true",
        help="also time, in each pair, a plain loop of the save's O_DIRECT writes (as many in "
        "flight, from a pool-like area, no generation or checksums): loop / fio is the device's "
        "drift, save / loop what the save adds to its writes",
    )
    p.add_argument(
        "--drop-caches",
        action="store_true",
        help="also write 3 to /proc/sys/vm/drop_caches before each read (root; machine-wide)",
    )
    return p


def check(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Bad input stops here, before anything is measured or written."""
    if args.pairs < 5:
        p.error("--pairs must be at least 5 (a verdict needs 5 alternating pairs)")
    if args.sweep_reps < 1:
        p.error("--sweep-reps must be at least 1")
    if args.max_in_flight is not None:
        try:
            CheckpointConfig(max_in_flight=args.max_in_flight)
        except ConfigError as exc:
            p.error(f"--max-in-flight: {exc}")
    if args.drop_caches and not os.access(DROP_CACHES, os.W_OK):
        p.error(f"--drop-caches: {DROP_CACHES} is not writable (root only)")


def main() -> int:
    p = parser()
    args = p.parse_args()
    fio = fio_binary()
    if fio is None:
        say(INSTALL_HINT)
        return 2
    check(p, args)
    try:
        with tempfile.TemporaryDirectory(prefix="asyncckpt-fio-", dir=args.dir) as tmp:
            out = asyncio.run(until_signal(lambda: run(args, fio, Path(tmp))))
    except Stopped as exc:
        say(f"bench_fio: stopped by {exc}; nothing measured is reported")
        return 128 + exc.signum
    except (FioError, AsyncCkptError) as exc:
        say(f"bench_fio: {first_line(exc)}")
        return 1
    emit(
        "fio",
        out["rows"],
        ["phase", "op", "config", "fio_GBps", "asyncckpt_GBps", "ratio", "note"],
        out["extra"],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Checkpointing a real CPU training loop: torch.save, DCP, DCP async, asyncckpt (DCP writer, save_state),
DeepSpeed's FastPersist writer (optional: skipped when deepspeed is not importable).

A torch MLP trained with Adam (model + optimizer state ≈ ``--state-size``) checkpoints every
``--every`` steps. Per method, in a fresh child process each (so peak RSS is its own):

- ``blocked_s``: how long the training loop stood still per checkpoint (for background methods:
  the call until it returned, plus any wait for the previous write before the next one);
- ``slowdown``: median step time while a checkpoint was being written in the background, over
  the median step time with none in flight, minus 1 (blocking methods write no step meanwhile);
- ``slowdown_vs_sham`` (``--sham``): every checkpoint is followed, ``--every`` steps later, by a
  sham one that does all the same (the paired memcpy, the state dict, the reference output)
  but save; the steps a real checkpoint's write overlapped, over the steps at the same offsets
  after the sham one that follows it, minus 1. The plain ``slowdown`` compares a checkpoint's
  early steps with its late ones, and on this VM a step's time also depends on where it falls
  in the interval (with one training thread, steps beside a capped drain ran 1-20 % *faster*
  than the later, quiet ones), which the sham interval cancels. For ``no_checkpoint`` (the
  control: no moment saves anything) it compares every step after one sham moment with the
  step at the same offset after the next: the figure a write that costs nothing would get, the
  noise floor of this machine and repeat count;
- ``GB/s``: state bytes / (checkpoint start → durable) — fsync'd files for every method;
- ``peak over training``: peak RSS (VmHWM) at the end minus the peak before the first checkpoint;
  ``over control``: that minus the same figure of ``no_checkpoint`` (the same loop saving
  nothing: Adam's temporaries and the allocator still raise the peak after the first mark);
- ``identical``: a fresh model restored from the last checkpoint gives bit-identical outputs.

``÷ memcpy``: each checkpoint's blocked time over a memcpy of the same state into preallocated
tensors (torch ``copy_``, every core) timed in the same process after the training step before
that checkpoint, with nothing in flight (the staging copy's conditions: it too follows a
training step; this VM's memory bandwidth drifts); the median over the steady checkpoints
(the first faults its buffers in). A separate ``memcpy`` child also times that copy in a
tight loop (``memcpy_s``, the faster of torch and one NumPy thread): the column
``÷ child memcpy``. Methods alternate within each repeat; medians over
repeats are reported.

``deepspeed_fastpersist``: ``torch.save`` into DeepSpeed's ``FastFileWriter`` (DeepNVMe's libaio
op, O_DIRECT from a page-locked double buffer; its ``close`` fsyncs), synchronous like
``torch_save``. It needs ``deepspeed`` and libaio in this Python (not the project's
dependencies; docs/benchmarks.md says how); without them the row is skipped with the reason.
``DS_ACCELERATOR`` defaults to ``cpu`` for it.

    python benchmarks/bench_training.py [--state-size 256MiB] [--repeats 3] [--dir /var/tmp]
        [--train-threads N] [--tiered-server files] [--drain-bandwidth 100MB] [--sham]
        [--server-cpus 1] [--train-cpus 0]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from _common import bootstrap_ci, emit, median

from asyncckpt import parse_size
from asyncckpt.servers.embedded import start_for_bench

METHODS = (
    "no_checkpoint",  # the control: the same loop, nothing saved (the training's own RSS drift)
    "torch_save",
    "dcp_save",
    "dcp_async_save",
    "asyncckpt_dcp",
    "asyncckpt_dcp_async",
    # DCP's process-based async_save (a checkpoint daemon per rank), staged by a DefaultStager in
    # shared memory in the background: DCP's own FileSystemWriter, then asyncckpt's writer
    "dcp_async_process",
    "asyncckpt_dcp_process",
    "save_state_none",
    "save_state_host",
    "save_state_tiered",  # a tiered CheckpointManager: local commit, then a drain to --tiered-server
    "deepspeed_fastpersist",  # torch.save through DeepSpeed's FastFileWriter (libaio); optional
)
FASTPERSIST = "deepspeed_fastpersist"
WIDTH = 2048
BATCH = 32
GiB = 1 << 30


def status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


# -- the training job -------------------------------------------------------------------------
def build(state_size: int, seed: int) -> tuple[Any, Any]:
    """An MLP of WIDTH×WIDTH layers whose weights + Adam's two moments ≈ ``state_size`` bytes."""
    import torch

    torch.manual_seed(seed)
    layers = max(1, round(state_size / (12 * (WIDTH * WIDTH + WIDTH))))
    blocks: list[Any] = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU()]
    model = torch.nn.Sequential(*blocks)
    return model, torch.optim.Adam(model.parameters(), lr=1e-4)


def train_step(model: Any, opt: Any, batch: Any) -> None:
    opt.zero_grad(set_to_none=True)
    model(batch).square().mean().backward()
    opt.step()


def state_bytes(state: Any) -> int:
    import torch

    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(state_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(state_bytes(v) for v in state)
    return 0


# -- one method per child -----------------------------------------------------------------------
class Method:
    """start(state, path) -> a future when the write goes on in the background, else None."""

    def __init__(
        self, name: str, chunk: int, buffers: int, remote: str = "", drain_bandwidth: float | None = None
    ) -> None:
        self.name, self.chunk, self.buffers = name, chunk, buffers
        self.drain_bandwidth = drain_bandwidth
        self.thread: Any = None
        self.writer: Any = None
        self.stager: Any = None
        if name.endswith("_process"):
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

            single_rank_group()
            # shared memory, staged in the background (the call returns before the copy ends)
            self.stager = DefaultStager(StagingOptions(False, True, True, False))
        self.mgr: Any = None  # save_state_tiered: its CheckpointManager, made in the loop thread
        self.aio: Any = None  # deepspeed_fastpersist: DeepNVMe's aio handle and its locked buffer
        self.aio_buffer: Any = None
        self.each: list[dict[str, float]] = []  # deepspeed_fastpersist: the writer's own stats
        if name == FASTPERSIST:
            self.aio = fastpersist_handle()
        self.remote = remote
        if name.startswith("save_state"):
            from asyncckpt.config import CheckpointConfig
            from asyncckpt.integrations.loop_thread import CheckpointerThread

            # tiered: moto, a Python server, answers slowly beside a training loop on every core of
            # a 2-core VM (a part went unacknowledged for 20 s, the default stall_timeout, in two
            # runs): this measures the slowdown, not the stall detection
            stall = {"stall_timeout": 300.0} if name == "save_state_tiered" else {}
            config = CheckpointConfig(chunk_size=chunk, num_buffers=buffers, **stall)
            self.thread = CheckpointerThread(config, "bench")
        elif name.startswith("asyncckpt_dcp"):
            from asyncckpt.integrations.dcp import AsyncCkptStorageWriter

            self.writer = AsyncCkptStorageWriter(os.devnull, chunk_size=chunk, num_buffers=buffers)

    def start(self, state: dict[str, Any], path: Path) -> Future[Any] | None:
        import torch
        import torch.distributed.checkpoint as dcp

        if self.name == "no_checkpoint":
            return None
        if self.name == "torch_save":
            with open(path, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())
            return None
        if self.name == FASTPERSIST:
            self.fastpersist(state, path)
            return None
        if self.name.endswith("_process"):
            from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

            if self.writer is not None:
                self.writer.reset(path)
            response = dcp.async_save(
                state, checkpoint_id=path, async_stager=self.stager,
                # DCP's best documented CPU configuration: two writer threads, fsync'd files
                storage_writer=self.writer or dcp.FileSystemWriter(path, thread_count=2, sync_files=True),
                async_checkpointer_type=AsyncCheckpointerType.PROCESS,
            )  # fmt: skip
            response.staging_completion.result()  # the training may change its tensors now
            upload: Future[Any] = response.upload_completion
            return upload
        if self.name in ("dcp_save", "dcp_async_save"):
            writer = dcp.FileSystemWriter(path)  # sync_files=True: fsync'd, as asyncckpt's
            if self.name == "dcp_save":
                dcp.save(state, storage_writer=writer)
                return None
            return dcp.async_save(state, storage_writer=writer)  # type: ignore[return-value]
        if self.name.startswith("asyncckpt_dcp"):
            self.writer.reset(path)
            if self.name == "asyncckpt_dcp":
                dcp.save(state, storage_writer=self.writer, checkpoint_id=path)
                return None
            return dcp.async_save(state, storage_writer=self.writer, checkpoint_id=path)  # type: ignore[return-value]
        if self.name == "save_state_tiered":
            return self.start_tiered(state, path)
        staging = "host" if self.name == "save_state_host" else "none"

        async def save(ckpt: Any) -> Any:
            return await ckpt.save_state(str(path), state, staging=staging)

        handle = self.thread.run(save)
        if staging == "none":
            return None

        async def durable(_: Any) -> Any:
            return await handle

        fut: Future[Any] = self.thread.submit(durable)
        return fut

    def start_tiered(self, state: dict[str, Any], path: Path) -> Future[Any]:
        """maybe_save returns once the state is copied; the future: the step remote-committed
        (its local commit, then its drain to ``self.remote``)."""
        from asyncckpt import CheckpointManager

        step = int(path.name.split("-")[1])

        async def save(ckpt: Any) -> None:
            if self.mgr is None:
                local = path.parent / "local"
                local.mkdir(exist_ok=True)
                self.mgr = CheckpointManager(
                    self.remote,
                    local=local,
                    checkpointer=ckpt,
                    keep_last=2,
                    drain_bandwidth=self.drain_bandwidth,
                )
            await self.mgr.maybe_save(step, state)

        self.thread.run(save)

        async def durable(_: Any) -> Any:
            await self.mgr.wait()
            stats = self.mgr.stats.tiers
            if stats.steps[step].state != "remote-committed":
                raise RuntimeError(f"step {step} was not remote-committed: {stats.steps[step]}")
            return stats.steps[step]

        fut: Future[Any] = self.thread.submit(durable)
        return fut

    def fastpersist(self, state: dict[str, Any], path: Path) -> None:
        """torch.save through DeepSpeed's FastFileWriter, as its checkpoint engine does with
        ``writer.type: FAST`` (CheckpointWriterFactory): one rank, no data-parallel split."""
        import torch
        from deepspeed.io import FastFileWriter, FastFileWriterConfig
        from deepspeed.runtime.model_checkpointing.constants import (
            CHECKPOINT_IO_BUFFER_DOUBLE_DEFAULT,
            CHECKPOINT_IO_BUFFER_SIZE_DEFAULT,
        )

        if self.aio_buffer is None:  # at the first checkpoint, so its memory counts as the others'
            # a CUDA-pinned buffer needs CUDA: DeepNVMe's own page-locked allocation on the CPU
            # (posix_memalign + mlock), as its CPU benchmark does (nvme/test_ds_aio_utils.py)
            self.aio_buffer = self.aio.new_cpu_locked_tensor(
                CHECKPOINT_IO_BUFFER_SIZE_DEFAULT, torch.empty(0, dtype=torch.uint8)
            )
        config = FastFileWriterConfig(
            dnvme_handle=self.aio,
            pinned_tensor=self.aio_buffer,
            double_buffer=CHECKPOINT_IO_BUFFER_DOUBLE_DEFAULT,
        )
        writer = FastFileWriter(str(path), config)
        torch.save(state, writer)
        writer.close()  # drains the buffers, appends the unaligned tail, fsyncs the file
        keys = ("write_secs", "aio_write_secs", "fill_buffer_secs", "slow_bytes")
        stats = vars(writer)["_stats"]  # DeepSpeed's own counters (it has no public accessor)
        self.each.append({k: stats[k] for k in keys})

    def reserve(self, state: dict[str, Any]) -> float:
        """save_state_host: the staging area made before the first checkpoint, as
        CheckpointManager does (the training waits for it here: its seconds)."""
        if self.name not in ("save_state_host", "save_state_tiered"):
            return 0.0
        t0 = time.perf_counter()

        async def reserve(ckpt: Any) -> int:
            return int(await ckpt.reserve_staging(state))

        self.thread.run(reserve)
        return time.perf_counter() - t0

    def restore(self, model: Any, opt: Any, path: Path) -> None:
        import torch
        import torch.distributed.checkpoint as dcp

        state = {"model": model.state_dict(), "optim": opt.state_dict()}
        if self.name in ("torch_save", FASTPERSIST):
            state = torch.load(path, weights_only=True)
        elif self.name.startswith("dcp"):
            dcp.load(state, storage_reader=dcp.FileSystemReader(path))
        elif self.name.startswith("asyncckpt_dcp"):
            from asyncckpt.integrations.dcp import AsyncCkptStorageReader

            with AsyncCkptStorageReader(path, chunk_size=self.chunk, num_buffers=self.buffers) as reader:
                dcp.load(state, storage_reader=reader)
        elif self.mgr is not None:  # the tiered manager's restore: the newest step, nearest tier

            async def restore(_: Any) -> Any:
                await self.mgr.restore(into=state)
                return state

            state = self.thread.run(restore)
        else:

            async def load(ckpt: Any) -> Any:
                return (await ckpt.load_state(str(path), into=state)).state

            state = self.thread.run(load)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])

    def close(self) -> None:
        if self.mgr is not None:  # its remote steps go too (the local ones go with the run's dir)

            async def remove(ckpt: Any) -> None:
                from asyncckpt.steps import delete_step, steps_under

                await self.mgr.aclose()
                for step in await steps_under(ckpt, self.remote):
                    await delete_step(ckpt, self.remote, step)

            self.thread.run(remove)
        for owner in (self.thread, self.writer, self.stager):
            if owner is not None:
                owner.close()
        if self.aio_buffer is not None:
            self.aio.free_cpu_locked_tensor(self.aio_buffer)
            self.aio_buffer = None


def fastpersist_handle() -> Any:
    """DeepNVMe's aio handle with the defaults of DeepSpeed's ``aio`` config (JIT-builds the
    ``async_io`` op against libaio the first time: minutes)."""
    import deepspeed.io.fast_file_writer as ffw
    from deepspeed.ops.op_builder import AsyncIOBuilder
    from deepspeed.ops.op_builder.utils import UtilsBuilder
    from deepspeed.runtime.swap_tensor import constants as c

    if ffw.UtilsBuilder.NAME != UtilsBuilder.NAME:
        # DS_ACCELERATOR=cpu maps UtilsBuilder to a builder whose load() raises "This op had
        # not been implemented on CPU backend", and FastFileWriter loads it in __init__ (for
        # cast_to_byte_tensor, which only its storage-list path uses, not torch.save's
        # write()): the generic builder's C++ op builds on the CPU
        ffw.UtilsBuilder = UtilsBuilder
    aio = AsyncIOBuilder().load(verbose=False)
    return aio.aio_handle(
        c.AIO_BLOCK_SIZE_DEFAULT,
        c.AIO_QUEUE_DEPTH_DEFAULT,
        c.AIO_SINGLE_SUBMIT_DEFAULT,
        c.AIO_OVERLAP_EVENTS_DEFAULT,
        c.AIO_INTRA_OP_PARALLELISM_DEFAULT,
    )


def fastpersist_unavailable() -> str:
    """Why the deepspeed_fastpersist row cannot run in this Python, or ''."""
    import importlib.util

    if importlib.util.find_spec("deepspeed") is None:
        return (
            "deepspeed is not installed in this Python (optional, not a dependency of the "
            "project; docs/benchmarks.md, 'DeepSpeed FastPersist', says how to install it)"
        )
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # the children inherit it
    probe = (
        "from deepspeed.ops.op_builder import AsyncIOBuilder; import sys; "
        "sys.exit(0 if AsyncIOBuilder().is_compatible(verbose=True) else 3)"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    if proc.returncode:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return f"DeepSpeed's async_io op cannot be built here (libaio-dev missing?): {' | '.join(tail)}"
    return ""


def single_rank_group() -> None:
    """A 1-rank gloo group: DCP's process-based async_save needs one (its daemon joins it)."""
    import socket

    import torch.distributed as dist

    if dist.is_initialized():
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
    dist.init_process_group("gloo")


class PairedCopy:
    """One memcpy of the state into like tensors (torch ``copy_`` on every core), timed in the
    training process just before each checkpoint: the same memory at the same moment as the
    checkpoint's own copy (this VM's memory bandwidth drifts from second to second), so each
    checkpoint's blocked time has its own baseline."""

    def __init__(self, state: dict[str, Any]) -> None:
        import torch

        self.copies = [torch.empty_like(t) for t in _tensors(state)]
        self.run(state)  # faults the copies in

    def run(self, state: dict[str, Any]) -> float:
        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(os.cpu_count() or 1)
        try:
            t0 = time.perf_counter()
            for dst, src in zip(self.copies, _tensors(state), strict=True):
                dst.copy_(src)
            return time.perf_counter() - t0
        finally:
            torch.set_num_threads(threads)


def _tensors(state: Any) -> list[Any]:
    return [t for t in leaves(state) if t.numel() > 1]


def cpu_list(text: str) -> list[int]:
    """``--server-cpus`` / ``--train-cpus``: CPUs this process may run on, comma-separated."""
    try:
        cpus = sorted({int(c) for c in text.split(",")})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected CPU numbers separated by commas, got {text!r}") from None
    allowed = os.sched_getaffinity(0)
    if not cpus or not set(cpus) <= allowed:
        raise argparse.ArgumentTypeError(f"{text!r}: this process may run on CPUs {sorted(allowed)} only")
    return cpus


async def started_checkpointer(_: Any) -> None:
    """A job that only starts a checkpointer thread (and its checkpointer)."""


def run_method(args: argparse.Namespace, name: str) -> dict[str, Any]:
    import torch

    if args.train_threads:  # every method alike, the control too: only the cores left differ
        torch.set_num_threads(args.train_threads)
    torch.manual_seed(0)
    model, opt = build(args.state_size, seed=1)
    probe_input = torch.randn(4, WIDTH)
    batches = [torch.randn(BATCH, WIDTH) for _ in range(4)]
    root = Path(tempfile.mkdtemp(prefix=f"bench-training-{name}-", dir=args.dir))
    if args.tiered_remote:  # an S3 prefix of the parent's server: this run's own part of it
        remote = f"{args.tiered_remote}/{root.name}"
    else:  # a directory beside the local tier
        (root / "remote").mkdir()
        remote = str(root / "remote")
    method = Method(name, args.chunk_size, args.num_buffers, remote, args.drain_bandwidth)
    if args.train_cpus:  # this thread only (Linux affinity is per thread): pinned after the
        if method.thread is not None:  # checkpointer's thread started, which keeps every CPU
            method.thread.run(started_checkpointer)
        os.sched_setaffinity(0, args.train_cpus)
    steps: list[tuple[float, bool]] = []  # (seconds, a background write was in flight)
    moments: list[tuple[int, bool]] = []  # (index into steps, real) of each checkpoint moment
    blocked: list[float] = []
    write_s: list[float] = []
    pending: Future[Any] | None = None
    durable = threading.Event()
    started = done_at = 0.0
    last: Path | None = None
    reference = None
    train_peak = nbytes = 0
    copier: PairedCopy | None = None
    memcpy_s: list[float] = []  # the paired memcpy before each checkpoint
    inside: list[dict[str, float]] = []  # save_state's blocked, copy and wait times, per checkpoint
    reserve_s = 0.0  # reserve_staging before the first checkpoint (save_state_host, --reserve)

    def finished(_: Future[Any]) -> None:
        nonlocal done_at
        done_at = time.perf_counter()
        durable.set()

    def wait_durable() -> None:
        assert pending is not None
        durable.wait()
        result = pending.result()  # its error, if any
        write_s.append(done_at - started)
        if hasattr(result, "copy_s"):  # save_state's own account of the time the caller waited
            inside.append({"blocked_s": result.blocked_s, "copy_s": result.copy_s, "wait_s": result.waited_s})

    def step_once(i: int) -> None:
        busy = pending is not None and not durable.is_set()
        t0 = time.perf_counter()
        train_step(model, opt, batches[i % len(batches)])
        steps.append((time.perf_counter() - t0, busy))

    def checkpoint_at(step: int) -> bool:
        return bool(step >= args.warmup - 1 and (step - args.warmup + 1) % args.every == 0)

    def real_at(step: int) -> bool:  # --sham: every other moment saves nothing
        return not args.sham or (step - args.warmup + 1) // args.every % 2 == 0

    moments_in_run = 2 * args.checkpoints if args.sham else args.checkpoints
    # with --sham, the last sham interval is whole too: every step up to the moment after it
    total = args.warmup + (moments_in_run - 1) * args.every + (args.every - 1 if args.sham else 0)

    waited = 0.0  # the wait for the previous write, counted in the next checkpoint's blocked time

    def drain() -> None:
        nonlocal pending, waited
        t0 = time.perf_counter()
        if pending is not None:  # the previous write must be durable before the next starts
            wait_durable()
            pending = None
        waited += time.perf_counter() - t0

    try:
        for step in range(total):
            step_once(step)
            if copier is None:  # after the first step (Adam's state exists), before the steps
                # whose peak the mark below takes: its memory counts as the training's own
                copier = PairedCopy({"model": model.state_dict(), "optim": opt.state_dict()})
            if checkpoint_at(step + 1) and not checkpoint_at(step):
                # the paired memcpy, one step before the checkpoint: like the checkpoint's own
                # copy it follows a training step, with nothing in flight (run back to back, the
                # second of two 1 GiB copies was the slower on this VM: 1.17 vs 1.08 x)
                drain()
                copied = copier.run({"model": model.state_dict(), "optim": opt.state_dict()})
                if real_at(step + 1) and step + 1 < total:  # a sham copies too, unpaired
                    memcpy_s.append(copied)
                if not train_peak:  # the training's own peak, before any checkpoint's memory
                    train_peak = status_bytes("VmHWM")
                    if args.reserve:
                        reserve_s = method.reserve({"model": model.state_dict(), "optim": opt.state_dict()})
            if not checkpoint_at(step):
                continue
            train_peak = train_peak or status_bytes("VmHWM")  # the training's own, before any checkpoint
            drain()
            state = {"model": model.state_dict(), "optim": opt.state_dict()}
            nbytes = state_bytes(state)
            if real_at(step) and len(memcpy_s) < len(blocked) + 1:  # consecutive checkpoints (--every 1)
                memcpy_s.append(copier.run(state))
            with torch.no_grad():
                output = model(probe_input)  # what the checkpoint about to be taken computes
            moments.append((len(steps), real_at(step)))
            if not real_at(step):  # a sham checkpoint: all of the above, then no save
                continue
            reference = output
            last = root / f"step-{step}{'.pt' if name in ('torch_save', FASTPERSIST) else ''}"
            durable.clear()
            started = time.perf_counter()
            pending = method.start(state, last)
            returned = time.perf_counter()
            blocked.append(waited + returned - started)
            waited = 0.0
            if pending is None:
                write_s.append(returned - started)
            else:
                pending.add_done_callback(finished)
        moments.append((len(steps), True))  # where the last sham interval ends
        # the last write: train on while it runs (these steps count), then wait for it
        while pending is not None and not durable.is_set() and len(steps) < 10 * args.every + args.warmup:
            step_once(len(steps))
        if pending is not None:
            wait_durable()
        peak = status_bytes("VmHWM")
        assert last is not None and reference is not None
        identical = None
        if name != "no_checkpoint":
            fresh, fresh_opt = build(args.state_size, seed=2)
            train_step(fresh, fresh_opt, batches[0])  # Adam's state exists, to be loaded into
            method.restore(fresh, fresh_opt, last)
            with torch.no_grad():
                identical = bool(torch.equal(fresh(probe_input), reference))
    finally:
        method.close()
        shutil.rmtree(root, ignore_errors=True)
    quiet = [s for s, busy in steps[args.warmup :] if not busy]
    busy = [s for s, b in steps[args.warmup :] if b]
    beside, sham = versus_sham(steps, moments, control=name == "no_checkpoint") if args.sham else ([], [])
    return {
        "method": name,
        "state_bytes": nbytes,
        "blocked_s": median(blocked),
        "blocked_each_s": blocked,
        "blocked_steady_s": median(blocked[1:]) if len(blocked) > 1 else None,  # buffers already faulted in
        "blocked_first_s": blocked[0],
        "reserve_s": reserve_s,
        "memcpy_each_s": memcpy_s,
        "library_each": inside or method.each,
        "steady_vs_paired_memcpy": median([b / m for b, m in zip(blocked[1:], memcpy_s[1:], strict=True)])
        if len(blocked) > 1
        else None,
        "write_s": median(write_s),
        "throughput_bps": None if name == "no_checkpoint" else nbytes / median(write_s),
        "step_s": median(quiet) if quiet else None,
        "step_s_writing": median(busy) if busy else None,
        "slowdown": (median(busy) / median(quiet) - 1) if busy and quiet else None,
        "slowdown_vs_sham": (median(beside) / median(sham) - 1) if beside and sham else None,
        "steps_vs_sham": len(beside),
        "steps_writing": len(busy),
        "train_peak_rss": train_peak,
        "peak_rss": peak,
        "peak_over_training": peak - train_peak,
        "identical": identical,
        "checkpoints": len(blocked),
    }


def versus_sham(
    steps: list[tuple[float, bool]], moments: list[tuple[int, bool]], *, control: bool = False
) -> tuple[list[float], list[float]]:
    """The steps a real checkpoint's write overlapped, and the steps at the same offsets after
    the sham moment that follows it (only where that sham interval is whole). ``control``
    (``no_checkpoint``, whose "real" moments save nothing either): every step of the interval,
    sham against sham, the measurement's own noise floor."""
    beside: list[float] = []
    sham: list[float] = []
    for (at, real), (then, then_real), (end, _) in zip(moments, moments[1:], moments[2:], strict=False):
        if not real or then_real:  # a real moment followed by its sham
            continue
        for k in range(min(then - at, end - then)):
            if control or steps[at + k][1]:  # a write in flight beside this step
                beside.append(steps[at + k][0])
                sham.append(steps[then + k][0])
    return beside, sham


def run_memcpy(args: argparse.Namespace) -> dict[str, Any]:
    """One copy of the whole state into preallocated, already faulted-in memory: the floor of a
    staging copy. The faster of torch ``copy_`` into like tensors (torch's threads: every core)
    and a single-threaded NumPy copy into one flat buffer, over 5 passes after one that faults
    pages in: ``memcpy_s`` is its median pass (what a staged save's median is compared with),
    ``memcpy_best_s`` its fastest."""
    import numpy as np
    import torch

    model, opt = build(args.state_size, seed=1)
    train_step(model, opt, torch.randn(BATCH, WIDTH))
    state = {"model": model.state_dict(), "optim": opt.state_dict()}
    sources = [t.reshape(-1).view(torch.uint8).numpy() for t in _tensors(state)]
    nbytes = sum(len(s) for s in sources)
    paired = PairedCopy(state)  # the same torch copy the training processes time
    flat = np.empty(nbytes, np.uint8)

    def torch_copy() -> None:
        paired.run(state)

    def numpy_copy() -> None:
        offset = 0
        for src in sources:
            np.copyto(flat[offset : offset + len(src)], src)
            offset += len(src)

    passes: dict[str, list[float]] = {}
    for label, copy in (("torch", torch_copy), ("numpy", numpy_copy)):
        times = []
        for _ in range(6):
            t0 = time.perf_counter()
            copy()
            times.append(time.perf_counter() - t0)
        passes[label] = times[1:]
    fastest = min(passes.values(), key=median)
    return {
        "method": "memcpy",
        "state_bytes": nbytes,
        "memcpy_s": median(fastest),
        "memcpy_best_s": min(fastest),
        "copies_s": passes,
    }


def leaves(state: Any) -> list[Any]:
    import torch

    if isinstance(state, torch.Tensor):
        return [state]
    if isinstance(state, dict):
        return [x for v in state.values() for x in leaves(v)]
    if isinstance(state, (list, tuple)):
        return [x for v in state for x in leaves(v)]
    return []


# -- the parent -------------------------------------------------------------------------------
def child(args: argparse.Namespace, name: str) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", name, *sys.argv[1:]]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{name} failed:\n{proc.stderr[-3000:]}")
    row: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return row


def summarize(rows: list[dict[str, Any]], memcpy_s: float, memcpy_best_s: float) -> list[dict[str, Any]]:
    control = [r["peak_over_training"] for r in rows if r["method"] == "no_checkpoint"]
    drift = median(control) if control else 0.0  # what the training alone adds after the first mark
    out = []
    for name in METHODS:
        mine = [r for r in rows if r["method"] == name]
        if not mine:
            continue

        def med(key: str, runs: list[dict[str, Any]] = mine) -> float | None:
            values = [r[key] for r in runs if r[key] is not None]
            return median(values) if values else None

        blocked = med("blocked_s")
        steady = med("blocked_steady_s")
        out.append(
            {
                "method": name,
                "blocked_s": blocked,
                "blocked_steady_s": steady,  # the first checkpoint also faults in its buffers
                "blocked_first_s": med("blocked_first_s"),
                "reserve_s": med("reserve_s"),
                "steady_vs_memcpy": med("steady_vs_paired_memcpy"),
                "steady_vs_child_memcpy": steady / memcpy_s if steady is not None else None,
                "steady_vs_best_memcpy": steady / memcpy_best_s if steady is not None else None,
                "GB/s": None if name == "no_checkpoint" else (med("throughput_bps") or 0) / 1e9,
                "step_s": med("step_s"),
                "slowdown": med("slowdown"),
                "slowdown_vs_sham": med("slowdown_vs_sham"),
                "peak_over_training_MiB": (med("peak_over_training") or 0) / 2**20,
                "over_control_MiB": ((med("peak_over_training") or 0) - drift) / 2**20,
                "identical": None if name == "no_checkpoint" else all(r["identical"] for r in mine),
                "repeats": len(mine),
            }
        )
    return out


def run_all(args: argparse.Namespace, names: list[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    rows: list[dict[str, Any]] = []
    memcpy: list[dict[str, Any]] = []
    for rep in range(args.repeats):
        order = names[rep % len(names) :] + names[: rep % len(names)]  # alternate who goes first
        memcpy.append(child(args, "memcpy"))
        for name in order:
            rows.append({**child(args, name), "repeat": rep})
            print(f"rep {rep} {name}: {json.dumps(rows[-1])}", file=sys.stderr, flush=True)
    return rows, memcpy


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--state-size", type=parse_size, default=parse_size("256MiB"), help="model + Adam state")
    p.add_argument("--every", type=int, default=6, help="steps between checkpoints")
    p.add_argument(
        "--checkpoints", type=int, default=3, help="checkpoints per run (the first faults in buffers)"
    )
    p.add_argument("--warmup", type=int, default=3, help="steps before the first checkpoint")
    p.add_argument(
        "--reserve",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="save_state_host: reserve_staging one step before the first checkpoint, as "
        "CheckpointManager does (reserve_s; --no-reserve: the first save makes the area)",
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--chunk-size", type=parse_size, default=parse_size("32MiB"))
    p.add_argument("--num-buffers", type=int, default=8)
    p.add_argument(
        "--dir", default=tempfile.gettempdir(), help="where checkpoints are written (deleted after)"
    )
    p.add_argument(
        "--train-threads",
        type=int,
        default=0,
        help="torch threads for training (0: torch's default, every core); fewer leave cores "
        "to the checkpoint writer, as a node that reserves cores for I/O does",
    )
    p.add_argument(
        "--tiered-server",
        choices=("moto", "swift", "files"),
        default="moto",
        help="save_state_tiered: the remote tier, an embedded S3 server on the loopback (moto) or a "
        "directory beside the local tier (files)",
    )
    p.add_argument(
        "--drain-bandwidth",
        type=parse_size,
        default=None,
        help="save_state_tiered: the manager's drain_bandwidth, bytes per second (for example "
        "100MB: a drain spread over the steps between checkpoints takes less of each; default uncapped)",
    )
    p.add_argument(
        "--sham",
        action="store_true",
        help="after each checkpoint, a sham one that does all but save: slowdown_vs_sham compares "
        "the steps beside a write with the steps at the same offsets after the sham",
    )
    p.add_argument(
        "--server-cpus",
        type=cpu_list,
        default=None,
        help="save_state_tiered: the CPUs the embedded server may run on (for example 1), as a "
        "store on other machines would take none of the training's; default: every CPU",
    )
    p.add_argument(
        "--train-cpus",
        type=cpu_list,
        default=None,
        help="the CPUs the training's thread runs on (for example 0, beside --server-cpus 1 and "
        "--train-threads 1: a node whose store is on other machines); the checkpoint's threads "
        "keep every CPU; default: every CPU",
    )
    p.add_argument("--tiered-remote", help=argparse.SUPPRESS)  # set by the parent for its children
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    warnings.filterwarnings("ignore")
    if args.child:
        row = run_memcpy(args) if args.child == "memcpy" else run_method(args, args.child)
        print(json.dumps(row))
        return
    names = [m for m in args.methods.split(",") if m]
    unknown = set(names) - set(METHODS)
    if unknown:
        raise SystemExit(f"unknown methods {sorted(unknown)}; choose from {', '.join(METHODS)}")
    if FASTPERSIST in names and (why := fastpersist_unavailable()):
        print(f"{FASTPERSIST} skipped: {why}", file=sys.stderr, flush=True)
        names.remove(FASTPERSIST)
        if not names:
            return
    with contextlib.ExitStack() as stack:
        if "save_state_tiered" in names and args.tiered_server != "files":  # the children inherit its AWS_*
            everywhere = os.sched_getaffinity(0)
            if args.server_cpus:  # the server's processes inherit this affinity; the training's do not
                os.sched_setaffinity(0, args.server_cpus)
            try:
                uri = start_for_bench(stack, args.tiered_server)
            finally:
                os.sched_setaffinity(0, everywhere)
            sys.argv += ["--tiered-remote", uri.rsplit("/", 1)[0] + "/bench-training"]
        rows, memcpy = run_all(args, names)
    memcpy_s = median([m["memcpy_s"] for m in memcpy])
    memcpy_best_s = median([m["memcpy_best_s"] for m in memcpy])
    summary = summarize(rows, memcpy_s, memcpy_best_s)
    headers = [
        *("method", "blocked_s", "blocked_first_s", "reserve_s", "blocked_steady_s", "steady_vs_memcpy"),
        "steady_vs_child_memcpy",
        *("GB/s", "step_s", "slowdown", "slowdown_vs_sham"),
        *("peak_over_training_MiB", "over_control_MiB", "identical", "repeats"),
    ]
    extra = {
        "state_bytes": rows[0]["state_bytes"],
        "memcpy_s": memcpy_s,
        "memcpy_best_s": memcpy_best_s,
        "memcpy_runs": memcpy,
        "pool_bytes": args.chunk_size * args.num_buffers,
        "args": {k: v for k, v in vars(args).items() if k != "child"},
        "runs": rows,
    }
    for key in ("blocked_s", "blocked_steady_s", "write_s"):  # process mode, side by side
        extra[f"process_{key}_ratio"] = paired(rows, "asyncckpt_dcp_process", "dcp_async_process", key)
    extra["slowdown_ci95"] = slowdown_ci(rows)
    extra["slowdown_vs_sham_ci95"] = slowdown_ci(rows, "slowdown_vs_sham")
    emit("training", summary, headers, extra)
    for key in ("slowdown", "slowdown_vs_sham"):
        for method, got in extra[f"{key}_ci95"].items():
            low, high = got["ci95"]
            print(f"{method} {key}: median {got['median']:+.3f} 95% CI [{low:+.3f}, {high:+.3f}] "
                  f"over {len(got['per_repeat'])} repeats", file=sys.stderr)  # fmt: skip
    for key in ("blocked_s", "blocked_steady_s", "write_s"):
        if extra[f"process_{key}_ratio"]:
            r = extra[f"process_{key}_ratio"]
            print(f"asyncckpt_dcp_process / dcp_async_process {key}: median {r['median']:.3f} "
                  f"95% CI [{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}] over {len(r['ratios'])} repeats",
                  file=sys.stderr)  # fmt: skip


def slowdown_ci(rows: list[dict[str, Any]], key: str = "slowdown") -> dict[str, dict[str, Any]]:
    """Per method, its step slowdown (``key``) over the repeats: median and 95 % bootstrap interval."""
    per: dict[str, list[float]] = {}
    for r in rows:
        if r.get(key) is not None:
            per.setdefault(r["method"], []).append(r[key])
    return {
        m: {"median": median(v), "ci95": list(bootstrap_ci(v)), "per_repeat": v}
        for m, v in per.items()
        if len(v) >= 2
    }


def paired(rows: list[dict[str, Any]], a: str, b: str, key: str) -> dict[str, Any] | None:
    """``a``'s ``key`` over ``b``'s, per repeat (the two ran back to back): median, 95 % CI."""
    per: dict[int, dict[str, float]] = {}
    for r in rows:
        if r.get(key) is not None:
            per.setdefault(r["repeat"], {})[r["method"]] = r[key]
    ratios = [v[a] / v[b] for v in per.values() if a in v and b in v and v[b]]
    if len(ratios) < 2:
        return None
    return {"median": median(ratios), "ci95": list(bootstrap_ci(ratios)), "ratios": ratios}


if __name__ == "__main__":
    main()

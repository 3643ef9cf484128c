"""A checkpoint that does not copy: two candidates measured against the staged save, first.

Issue 29 §3 asks for the stretch to be measured first: a save whose blocked time is ≤ 0.3 × a
memcpy of the state, with the training's threads, the GIL and memory growth accounted for.
The same torch MLP + Adam loop as ``bench_training.py`` checkpoints every ``--every`` steps,
one fresh child process per arm and repeat, arms alternating:

- ``host``: today's ``save_state(staging="host")`` (the training waits for one copy into the
  staging area; the write goes on in the background);
- ``lend``: the caller lends its tensors: ``save_state(staging="none")`` runs in the background
  while the next step's forward and backward run (they only read the parameters and Adam's
  moments), and the step waits for it before ``optimizer.step()`` changes them. Blocked = that
  wait (plus the call);
- ``fork``: a snapshot by ``os.fork()``: the child writes the tensors' bytes from its
  copy-on-write view of the parent's memory (plain ``write`` + ``fdatasync``, not the library's
  pipeline) while the parent trains on. Blocked = the fork call. Its copy is not gone but moved:
  every page the optimizer writes while the child lives is copied by a page fault on the
  training's threads (the step slowdown, and ``cow_step_extra_s``: the first step after the
  fork over a quiet one), and the pages the child still holds are its memory growth
  (``child_private_MiB``, read from ``/proc/<child>/smaps_rollup`` once it has written);
- ``fork_thp``: the same, with torch's allocator on transparent huge pages
  (``THP_MEM_ALLOC_ENABLE=1``): the fork copies 512 times fewer page-table entries.

Every arm's last checkpoint is compared bit for bit with a copy of the state taken just before
it. Each blocked time is divided by a memcpy of the state into like tensors (``PairedCopy`` of
bench_training) in the same process just before it: the second of two passes, since after a
fork the first write to every page the child shared faults again (write-protected until then).
Medians over checkpoints, then over repeats; the verdict is over every steady checkpoint of
every repeat (median and 95 % bootstrap interval).

    python benchmarks/bench_copyfree.py [--state-size 1GiB] [--repeats 3] [--dir /var/tmp]
"""

from __future__ import annotations

import argparse
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

from _common import emit, median, ratio_verdict
from bench_training import BATCH, WIDTH, PairedCopy, build, leaves, status_bytes

from asyncckpt import parse_size

ARMS = ("host", "lend", "fork", "fork_thp")
TARGET = 0.3  # blocked ≤ 0.3 × memcpy


def byte_views(state: Any) -> list[memoryview]:
    """The tensors' own memory as flat byte views (no copy): what the forked child writes."""
    import torch

    out = []
    for t in leaves(state):
        flat = t.detach().reshape(-1)
        assert flat.data_ptr() == t.data_ptr(), "a non-contiguous tensor would be copied here"
        out.append(memoryview(flat.view(torch.uint8).numpy()))
    return out


def private_bytes(pid: int) -> int:
    """Pages only ``pid`` maps: for a forked child, those its parent has since written (or freed)."""
    total = 0
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith(("Private_Clean:", "Private_Dirty:")):
            total += int(line.split()[1]) * 1024
    return total


class Fork:
    """The snapshot by fork: the child writes, says so through a pipe, and waits to be released
    (so its private pages can be read while it still holds them); a parent thread reaps it."""

    def __init__(self) -> None:
        self.child_private: list[int] = []

    def start(self, state: dict[str, Any], path: Path) -> Future[None]:
        views = byte_views(state)
        written_r, written_w = os.pipe()
        go_r, go_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child: no torch, no threads, no Python-level locks
            code = 1
            try:
                os.close(written_r)
                os.close(go_w)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                for view in views:
                    for at in range(0, len(view), 32 << 20):
                        part = view[at : at + (32 << 20)]
                        while part:
                            part = part[os.write(fd, part) :]
                os.fdatasync(fd)
                os.close(fd)
                os.write(written_w, b"w")
                os.read(go_r, 1)
                code = 0
            finally:
                os._exit(code)
        os.close(written_w)
        os.close(go_r)
        done: Future[None] = Future()

        def reap() -> None:
            try:
                if os.read(written_r, 1) == b"w":
                    self.child_private.append(private_bytes(pid))
                os.write(go_w, b"g")
                _, status = os.waitpid(pid, 0)
                if os.waitstatus_to_exitcode(status):
                    raise RuntimeError(f"the forked writer failed: status {status}")
                done.set_result(None)
            except BaseException as exc:  # handed to the waiter
                done.set_exception(exc)
            finally:
                os.close(written_r)
                os.close(go_w)

        threading.Thread(target=reap, name="fork-reaper", daemon=True).start()
        return done


def read_back(path: Path, like: list[Any]) -> list[bytes]:
    data = path.read_bytes()
    out, at = [], 0
    for t in like:
        n = t.numel() * t.element_size()
        out.append(data[at : at + n])
        at += n
    return out


def run_arm(args: argparse.Namespace, arm: str) -> dict[str, Any]:
    import torch

    torch.manual_seed(0)
    model, opt = build(args.state_size, seed=1)
    batches = [torch.randn(BATCH, WIDTH) for _ in range(4)]
    root = Path(tempfile.mkdtemp(prefix=f"bench-copyfree-{arm}-", dir=args.dir))
    thread: Any = None
    if arm in ("host", "lend"):
        from asyncckpt.config import CheckpointConfig
        from asyncckpt.integrations.loop_thread import CheckpointerThread

        thread = CheckpointerThread(CheckpointConfig(), "bench")
    fork = Fork()
    steps: list[tuple[float, bool, bool]] = []  # (seconds, a write in flight, first step after a fork)
    blocked: list[float] = []
    memcpy: list[float] = []
    durable_s: list[float] = []
    pending: Future[Any] | None = None
    started = 0.0
    after_fork = False
    copier: PairedCopy | None = None
    reference: list[Any] = []
    last: Path | None = None

    def state_now() -> dict[str, Any]:
        return {"model": model.state_dict(), "optim": opt.state_dict()}

    def settle() -> float:
        """Wait for the write in flight; the seconds waited."""
        nonlocal pending
        t0 = time.perf_counter()
        if pending is not None:
            pending.result()
            durable_s.append(time.perf_counter() - started)
            pending = None
        return time.perf_counter() - t0

    def step(i: int) -> None:
        nonlocal after_fork
        busy = pending is not None and not pending.done()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        model(batches[i % len(batches)]).square().mean().backward()
        if arm == "lend" and pending is not None:  # the lent tensors change below: wait for the write
            blocked[-1] += settle()
        opt.step()
        steps.append((time.perf_counter() - t0, busy, after_fork))
        after_fork = False

    def start(state: dict[str, Any], path: Path) -> Future[Any]:
        nonlocal after_fork
        if arm.startswith("fork"):
            after_fork = True
            return fork.start(state, path)
        staging = "host" if arm == "host" else "none"

        async def save(ckpt: Any) -> Any:
            return await ckpt.save_state(str(path), state, staging=staging)

        if arm == "lend":
            fut: Future[Any] = thread.submit(save)
            return fut
        handle = thread.run(save)  # returns once the state is copied

        async def durable(_: Any) -> Any:
            return await handle

        fut = thread.submit(durable)
        return fut

    peak_before = 0
    try:
        for i in range(args.warmup + args.checkpoints * args.every):
            step(i)
            if copier is None:
                copier = PairedCopy(state_now())
                if arm == "host":  # the staging area made before the first checkpoint, as the manager does

                    async def reserve(ckpt: Any) -> int:
                        return int(await ckpt.reserve_staging(state_now()))

                    thread.run(reserve)
                peak_before = status_bytes("VmHWM")
            if i + 1 < args.warmup or (i + 1 - args.warmup) % args.every or len(blocked) == args.checkpoints:
                continue
            settle()  # the previous write is durable before the next starts (not counted: rare)
            state = state_now()
            # twice, the second counted: after a fork the first write to each page the child
            # shared faults once more (write-protected until then) even with the child gone
            copier.run(state)
            memcpy.append(copier.run(state))
            final = len(blocked) == args.checkpoints - 1
            if final:  # what the last checkpoint must hold, bit for bit
                reference = [t.detach().clone() for t in leaves(state)]
            last = root / f"step-{i}"
            started = time.perf_counter()
            pending = start(state, last)
            blocked.append(time.perf_counter() - started)
        while pending is not None and not pending.done():  # the last write: train on meanwhile
            step(len(steps))
        settle()
        peak = status_bytes("VmHWM")
        assert last is not None
        if arm.startswith("fork"):
            got = read_back(last, reference)
            identical = all(bytes(v) == g for v, g in zip(byte_views({"r": reference}), got, strict=True))
        else:
            fresh = {"model": model.state_dict(), "optim": opt.state_dict()}
            clone = {k: _zeros_like(v) for k, v in fresh.items()}

            async def load(ckpt: Any) -> None:
                await ckpt.load_state(str(last), into=clone)  # into its tensors, in place

            thread.run(load)
            loaded = leaves(clone)
            identical = len(loaded) == len(reference) and all(
                torch.equal(a, b) for a, b in zip(loaded, reference, strict=True)
            )
    finally:
        if thread is not None:
            thread.close()
        shutil.rmtree(root, ignore_errors=True)
    measured = steps[args.warmup :]
    quiet = [s for s, busy, _ in measured if not busy]
    busy = [s for s, b, _ in measured if b]
    first_after = [s for s, _, f in measured if f]
    nbytes = sum(t.numel() * t.element_size() for t in reference)
    ratios = [b / m for b, m in zip(blocked, memcpy, strict=True)]
    return {
        "arm": arm,
        "state_bytes": nbytes,
        "blocked_each_s": blocked,
        "memcpy_each_s": memcpy,
        "steady_ratios": ratios[1:],  # the first checkpoint also faults in buffers / page tables
        "blocked_steady_s": median(blocked[1:]),
        "memcpy_s": median(memcpy[1:]),
        "vs_memcpy": median(ratios[1:]),
        "durable_GBps": nbytes / median(durable_s) / 1e9,
        "step_s": median(quiet) if quiet else None,
        "slowdown": median(busy) / median(quiet) - 1 if busy and quiet else None,
        "cow_step_extra_s": median(first_after) - median(quiet) if first_after and quiet else None,
        "child_private_MiB": median(fork.child_private) / 2**20 if fork.child_private else None,
        "peak_over_training_MiB": (peak - peak_before) / 2**20,
        "identical": identical,
    }


def _zeros_like(state: Any) -> Any:
    import torch

    if isinstance(state, torch.Tensor):
        return torch.zeros_like(state)
    if isinstance(state, dict):
        return {k: _zeros_like(v) for k, v in state.items()}
    if isinstance(state, list):
        return [_zeros_like(v) for v in state]
    return state


def child(arm: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, __file__, "--child", arm, *sys.argv[1:]], capture_output=True, text=True
    )
    if proc.returncode:
        raise SystemExit(f"{arm} failed:\n{proc.stderr[-3000:]}")
    row: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return row


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for arm in ARMS:
        mine = [r for r in rows if r["arm"] == arm]
        if not mine:
            continue

        def med(key: str, runs: list[dict[str, Any]] = mine) -> float | None:
            values = [r[key] for r in runs if r[key] is not None]
            return median(values) if values else None

        ratios = [x for r in mine for x in r["steady_ratios"]]
        verdict = ratio_verdict(ratios, TARGET, at_most=True) if len(ratios) >= 5 else None
        out.append(
            {
                "arm": arm,
                "blocked_steady_s": med("blocked_steady_s"),
                "memcpy_s": med("memcpy_s"),
                "vs_memcpy": med("vs_memcpy"),
                "verdict": verdict["verdict"] if verdict else None,
                "ci95": verdict["ci95"] if verdict else None,
                "durable_GBps": med("durable_GBps"),
                "step_s": med("step_s"),
                "slowdown": med("slowdown"),
                "cow_step_extra_s": med("cow_step_extra_s"),
                "child_private_MiB": med("child_private_MiB"),
                "peak_over_training_MiB": med("peak_over_training_MiB"),
                "identical": all(r["identical"] for r in mine),
                "repeats": len(mine),
            }
        )
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--state-size", type=parse_size, default=parse_size("1GiB"), help="model + Adam state")
    p.add_argument("--every", type=int, default=3, help="steps between checkpoints")
    p.add_argument("--checkpoints", type=int, default=6, help="per run (the first is not counted)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument(
        "--dir", default=tempfile.gettempdir(), help="where checkpoints are written (deleted after)"
    )
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    warnings.filterwarnings("ignore")
    if args.child:
        print(json.dumps(run_arm(args, args.child)))
        return
    arms = [a for a in args.arms.split(",") if a]
    if set(arms) - set(ARMS):
        raise SystemExit(f"unknown arms {sorted(set(arms) - set(ARMS))}; choose from {', '.join(ARMS)}")
    rows = []
    for rep in range(args.repeats):
        for arm in arms[rep % len(arms) :] + arms[: rep % len(arms)]:
            rows.append({**child(arm), "repeat": rep})
            print(f"rep {rep} {arm}: {json.dumps(rows[-1])}", file=sys.stderr, flush=True)
    headers = [
        *("arm", "blocked_steady_s", "memcpy_s", "vs_memcpy", "ci95", "verdict", "durable_GBps", "step_s"),
        *(
            "slowdown",
            "cow_step_extra_s",
            "child_private_MiB",
            "peak_over_training_MiB",
            "identical",
            "repeats",
        ),
    ]
    emit(
        "copyfree",
        summarize(rows),
        headers,
        {"target": TARGET, "args": {k: v for k, v in vars(args).items() if k != "child"}, "runs": rows},
    )


if __name__ == "__main__":
    main()

"""Preemption: SIGTERM to a real training loop (one process, and mpirun -np 2 to every rank or
one), which commits exactly the step it was at and restores bit-identical; the deadline; bad input."""

from __future__ import annotations

import asyncio
import json
import math
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from asyncckpt import AsyncCheckpointer, AsyncCkptError, CheckpointManager, ConfigError
from asyncckpt.errors import PreemptDeadlineError, PreemptedError
from asyncckpt.owner import parse_temp
from asyncckpt.steps import latest_step, read_commit, steps_under

from .launch import ROOT, child_env, free_port
from .preempt_child import state_of

MiB = 1 << 20
OPTIONS: dict[str, Any] = {"chunk_size": MiB, "num_buffers": 4}


class Rank:
    """The test's ends of one rank's FIFOs: lines up (``pid step``), go-aheads down."""

    def __init__(self, root: Path, rank: int) -> None:
        self.up = os.open(root / f"up-{rank}", os.O_RDONLY | os.O_NONBLOCK)
        self.go = os.open(root / f"go-{rank}", os.O_RDWR)  # never blocks, whatever the child does
        self.buf = b""
        self.root = root

    def next_step(self, proc: subprocess.Popen[bytes]) -> tuple[int, int]:
        pid, step = self.next_line(proc).split()
        return int(pid), int(step)

    def next_line(self, proc: subprocess.Popen[bytes], timeout: float = 60) -> bytes:
        while b"\n" not in self.buf:
            ready, _, _ = select.select([self.up], [], [], timeout)
            chunk = os.read(self.up, 4096) if ready else b""
            if not chunk:
                raise AssertionError(f"no step from the child (rc {proc.poll()}): {stderr_of(self.root)}")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line

    def release(self) -> None:
        os.write(self.go, b"go\n")

    def close(self) -> None:
        os.close(self.up)
        os.close(self.go)


def stderr_of(root: Path) -> str:
    return (root / "stderr.txt").read_text(errors="replace")[-3000:]


@contextmanager
def training(
    root: Path, mode: str, *, ranks: int = 1, deadline: str = "30", launcher: str = "mpirun"
) -> Iterator[Any]:
    """The child loop(s) started, with the test's FIFO ends; killed if the test fails midway."""
    for r in range(ranks):
        os.mkfifo(root / f"up-{r}")
        os.mkfifo(root / f"go-{r}")
    ends = [Rank(root, r) for r in range(ranks)]
    args = ["-m", "tests.preempt_child", str(root), mode, deadline]
    if ranks == 1:
        cmd, env = [sys.executable, *args], child_env()
    elif launcher == "torchrun":
        pytest.importorskip("torch.distributed", reason="torch not installed")
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--nnodes", "1",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--max-restarts", "0",
            *args, "torch",
        ]  # fmt: skip
        env = child_env()
    else:
        pytest.importorskip("mpi4py", reason="mpi4py not installed: pip install 'asyncckpt[mpi]'")
        cmd = ["mpirun", "-np", str(ranks), "--oversubscribe", sys.executable, *args]
        env = child_env(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    with open(root / "stderr.txt", "wb") as err:
        proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
    try:
        yield proc, ends
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for end in ends:
            end.close()


def preempt_at(
    proc: subprocess.Popen[bytes], ends: list[Rank], step: int, to: list[int] | None = None
) -> str:
    """Let the loop run to ``step``, SIGTERM ranks ``to`` (default all) there, let it go on;
    its return code and stderr once it ended."""
    for _ in range(1, step):
        for end in ends:
            end.next_step(proc)
            end.release()
    pids = [end.next_step(proc) for end in ends]  # every rank waits before maybe_save(step)
    assert [s for _, s in pids] == [step] * len(ends)
    signalled = to if to is not None else range(len(ends))
    for rank in signalled:
        os.kill(pids[rank][0], signal.SIGTERM)
    for rank in signalled:  # the handler ran before the rank goes on to maybe_save(step)
        assert ends[rank].next_line(proc) == b"noted"
    for end in ends:
        end.release()
    proc.wait(timeout=90)
    return stderr_of(ends[0].root)


def result(root: Path, rank: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = json.loads((root / f"result-{rank}.json").read_text())
    return out


async def assert_committed_exactly(run: Path, step: int, world: int) -> None:
    """``step`` is the latest step, committed by every rank, and each rank's state loads back
    bit for bit; no later step was started."""
    async with AsyncCheckpointer(**OPTIONS) as ckpt:
        assert await latest_step(ckpt, str(run)) == step
        assert max(await steps_under(ckpt, str(run))) == step
        commit = await read_commit(ckpt, str(run), step)
        assert commit is not None and commit.world_size == world
        for rank in range(world):
            loaded = await ckpt.load_state(str(run / f"step-{step}" / f"rank-{rank}-of-{world}.safetensors"))
            want = state_of(rank, step)
            assert loaded.state["w"].tobytes() == want["w"].tobytes()
            assert (loaded.state["step"], loaded.state["rank"]) == (step, rank)


def check_record(record: dict[str, Any], step: int, source: str = "signal") -> None:
    assert record["step"] == step and record["signal"] == "SIGTERM" and record["source"] == source
    assert record["deadline_met"] is True and record["deadline_s"] == 30.0
    assert 0 < record["object_durable_s"] <= record["committed_s"] < 30


# -- one process ---------------------------------------------------------------------------
async def test_sigterm_raises_after_committing_that_step(tmp_path: Path) -> None:
    with training(tmp_path, "raise") as (proc, ends):
        err = await asyncio.to_thread(preempt_at, proc, ends, 5)
    assert proc.returncode == 0, err
    out = result(tmp_path)
    assert out["error"]["type"] == "PreemptedError" and out["error"]["step"] == 5
    assert out["error"]["signum"] == signal.SIGTERM and "SIGTERM" in out["error"]["text"]
    check_record(out["record"], 5)
    assert out["saved"] == [2, 4, 5]  # the cadence's steps, then the preempted one
    assert out["handler_back"]  # the default SIGTERM action is back after aclose
    await assert_committed_exactly(tmp_path / "run", 5, 1)


async def test_sigterm_exits_with_128_plus_signum(tmp_path: Path) -> None:
    with training(tmp_path, "exit") as (proc, ends):
        err = await asyncio.to_thread(preempt_at, proc, ends, 3)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "Traceback" not in err
    out = result(tmp_path)
    assert out["exit"] == 143 and out["handler_back"]
    check_record(out["record"], 3)
    await assert_committed_exactly(tmp_path / "run", 3, 1)


def delivered(pid: int, signum: int) -> bool:
    """The kernel has handed ``signum`` to the process (no longer pending in /proc)."""
    status = Path(f"/proc/{pid}/status").read_text()
    lines = [line for line in status.splitlines() if line.startswith(("SigPnd", "ShdPnd"))]
    pending = [int(line.split()[1], 16) for line in lines]
    return not any(mask & (1 << (signum - 1)) for mask in pending)


def test_sigterm_during_a_synchronous_step_is_seen_by_the_next_maybe_save(tmp_path: Path) -> None:
    """The signal arrives while the loop is in a step that never awaits (no event loop runs, so
    an event-loop handler cannot run): the very next maybe_save saves that step and exits 143.
    Before, the flag was set only when the loop next ran, so maybe_save(3) passed and a later
    step (4, 5) was saved instead."""
    with training(tmp_path, "exit/sync") as (proc, ends):
        (end,) = ends
        for _ in range(1, 3):
            end.next_step(proc)
            end.release()
        pid, step = end.next_step(proc)  # blocked in its synchronous step 3
        assert step == 3
        os.kill(pid, signal.SIGTERM)
        while not delivered(pid, signal.SIGTERM):  # polled: the kernel hands it on at once
            time.sleep(0.001)
        end.release()
        later = []  # the steps it went on to: none once fixed (before: 4 and 5)
        while select.select([end.up], [], [], 60)[0] and (chunk := os.read(end.up, 4096)):
            later += [int(line.split()[1]) for line in chunk.splitlines()]
            end.release()
        proc.wait(90)
    assert later == []
    err = stderr_of(tmp_path)
    assert proc.returncode == 128 + signal.SIGTERM, err
    out = result(tmp_path)
    assert out["exit"] == 143, out
    check_record(out["record"], 3)
    assert out["saved"] == [2, 3]
    asyncio.run(assert_committed_exactly(tmp_path / "run", 3, 1))


async def test_a_tiered_run_says_the_step_reached_the_remote_within_the_deadline(tmp_path: Path) -> None:
    with training(tmp_path, "exit+fast") as (proc, ends):
        err = await asyncio.to_thread(preempt_at, proc, ends, 3)
    assert proc.returncode == 128 + signal.SIGTERM, err
    out = result(tmp_path)
    check_record(out["record"], 3)
    assert out["record"]["tier"] == "remote" and out["tiers"]["drains_left"] == []
    await assert_committed_exactly(tmp_path / "run", 3, 1)  # the remote copy
    await assert_committed_exactly(tmp_path / "local", 3, 1)


@pytest.mark.parametrize("tier", ["slow", "outage"])
async def test_a_tiered_run_whose_drain_cannot_finish_exits_with_the_step_local(
    tmp_path: Path, tier: str
) -> None:
    """A drain slower than the deadline (2 kB/s: minutes for the step) or failing: the step is
    committed locally within the deadline, the record says "local", the exit does not wait for
    the drains (they are stopped, nothing half-written on the remote), and the next start
    drains the preempted step to the remote."""
    with training(tmp_path, f"exit+{tier}", deadline="3") as (proc, ends):
        err = await asyncio.to_thread(preempt_at, proc, ends, 3)
    assert proc.returncode == 128 + signal.SIGTERM, err
    out = result(tmp_path)
    record = out["record"]
    assert (record["step"], record["deadline_met"], record["tier"]) == (3, True, "local")
    await assert_committed_exactly(tmp_path / "local", 3, 1)
    if tier == "outage":
        assert [s for s, _ in out["tiers"]["drain_failures"]] == [2, 3]
        return
    assert out["tiers"]["drains_left"] == [2, 3]
    assert [p for p in (tmp_path / "run").rglob("*") if parse_temp(p.name)] == []  # aborted, not left
    async with CheckpointManager(tmp_path / "run", local=tmp_path / "local", keep_local=2, **OPTIONS) as mgr:
        await mgr.start()
        await mgr.wait()
    assert mgr.stats.tiers is not None and mgr.stats.tiers.resumed == [2, 3]
    await assert_committed_exactly(tmp_path / "run", 3, 1)


async def test_sigterm_continue_returns_and_the_loop_reads_preempted(tmp_path: Path) -> None:
    with training(tmp_path, "continue") as (proc, ends):
        err = await asyncio.to_thread(preempt_at, proc, ends, 1)  # before any cadence save
    assert proc.returncode == 0, err
    out = result(tmp_path)
    assert out["returned"] == 1 and "error" not in out
    check_record(out["record"], 1)
    await assert_committed_exactly(tmp_path / "run", 1, 1)


# -- two ranks under mpirun -----------------------------------------------------------------
mpi = pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not found: run tests/setup_system.sh")


@mpi
@pytest.mark.mpi
@pytest.mark.parametrize("to", [[0, 1], [1]], ids=["every-rank", "rank-1-only"])
async def test_two_ranks_save_the_same_step(tmp_path: Path, to: list[int]) -> None:
    with training(tmp_path, "raise", ranks=2) as (proc, ends):
        err = await asyncio.to_thread(preempt_at, proc, ends, 4, to=to)
    assert proc.returncode == 0, err
    for rank in (0, 1):
        out = result(tmp_path, rank)
        assert out["error"]["step"] == 4, out
        check_record(out["record"], 4, source="signal" if rank in to else "peer")
        assert out["saved"] == [2, 4]
    await assert_committed_exactly(tmp_path / "run", 4, 2)


@pytest.mark.torchrun
def test_two_torchrun_ranks_save_the_same_step(tmp_path: Path) -> None:
    """The flags travel over a second gloo group (``new_group``) beside the default one."""
    with training(tmp_path, "raise", ranks=2, launcher="torchrun") as (proc, ends):
        err = preempt_at(proc, ends, 3, to=[0])
    assert proc.returncode == 0, err
    for rank in (0, 1):
        out = result(tmp_path, rank)
        assert out["error"]["step"] == 3, out
        check_record(out["record"], 3, source="signal" if rank == 0 else "peer")
    asyncio.run(assert_committed_exactly(tmp_path / "run", 3, 2))


# -- in process: the deadline, save_now, handlers, bad input -----------------------------------
def state(step: int) -> dict[str, Any]:
    return {"w": np.full(1000, step, np.float32), "step": step}


async def test_a_missed_deadline_says_what_was_durable(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path, every_n_steps=1, save_on_signal=signal.SIGUSR1, preempt_deadline_s=1e-9)
    async with mgr:
        await mgr.maybe_save(1, state(1))
        await mgr.wait()
        with pytest.raises(PreemptDeadlineError) as caught:
            await mgr.save_now(2, state(2))
        assert caught.value.step == 2 and isinstance(caught.value, TimeoutError)
        text = str(caught.value)
        assert "step 2 missed its 1e-09 s deadline" in text and "not committed" in text
        assert "this rank's object not durable yet" in text and "latest step this run committed: 1" in text
        record = mgr.stats.preempted
        assert record is not None and not record.deadline_met and record.committed_s is None
    assert mgr.stats.saved == [1, 2]  # still committed afterwards: aclose waited for it


async def test_save_now_on_demand_and_handlers_put_back(tmp_path: Path) -> None:
    def mine(signum: int, frame: object) -> None:
        raise AssertionError("the manager's handler should be in place")

    before = signal.signal(signal.SIGUSR1, mine)
    try:
        mgr = CheckpointManager(
            tmp_path, every_n_steps=10, save_on_signal=(signal.SIGUSR1,), on_preempt="continue", **OPTIONS
        )
        async with mgr:
            assert signal.getsignal(signal.SIGUSR1) is not mine  # armed
            record = await mgr.save_now(3, state(3))
            assert record.step == 3 and record.signal is None and record.source == "on demand"
            assert record.deadline_met and mgr.preempted is False  # no signal arrived
        assert signal.getsignal(signal.SIGUSR1) is mine
        raising = CheckpointManager(tmp_path, save_on_signal=(signal.SIGUSR1,), **OPTIONS)
        async with raising:
            with pytest.raises(PreemptedError, match="step 4 committed"):
                await raising.save_now(4, state(4))
        assert raising.stats.saved == [4]
    finally:
        signal.signal(signal.SIGUSR1, before)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"save_on_signal": "SIGTERM"}, "'SIGTERM'"),
        ({"save_on_signal": (signal.SIGTERM, 4096)}, "4096"),
        ({"save_on_signal": (1.5,)}, "1.5"),
        ({"save_on_signal": signal.SIGKILL}, "SIGKILL cannot be caught"),
        ({"save_on_signal": (signal.SIGTERM, signal.SIGSTOP)}, "SIGSTOP cannot be caught"),
        ({"save_on_signal": signal.SIGTERM, "preempt_deadline_s": 0}, "preempt_deadline_s.*got 0"),
        ({"save_on_signal": signal.SIGTERM, "preempt_deadline_s": -1.0}, "got -1.0"),
        ({"save_on_signal": signal.SIGTERM, "preempt_deadline_s": math.inf}, "got inf"),
        ({"save_on_signal": signal.SIGTERM, "on_preempt": "quit"}, "on_preempt must be one of.*'quit'"),
    ],
)
def test_bad_preemption_settings_are_refused_before_any_io(
    tmp_path: Path, options: dict[str, Any], named: str
) -> None:
    root = tmp_path / "run"
    with pytest.raises(ConfigError, match=named):
        CheckpointManager(root, **options)
    assert not root.exists()


def test_a_manager_off_the_main_thread_is_refused_naming_the_thread(tmp_path: Path) -> None:
    """Python installs signal handlers only from the main thread: say so, do not ignore it."""
    caught: list[BaseException] = []

    async def enter() -> None:
        mgr = CheckpointManager(tmp_path, save_on_signal=signal.SIGTERM, **OPTIONS)
        try:
            async with mgr:
                pass
        except ConfigError as exc:
            caught.append(exc)
        finally:
            await mgr.aclose()

    worker = threading.Thread(target=asyncio.run, args=(enter(),), name="trainer-loop")
    worker.start()
    worker.join()
    assert len(caught) == 1 and "main thread" in str(caught[0]) and "'trainer-loop'" in str(caught[0])
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


async def test_a_preemption_save_that_fails_raises_its_own_error(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path, save_on_signal=signal.SIGUSR1, **OPTIONS)
    async with mgr:
        with pytest.raises(AsyncCkptError) as caught:
            await mgr.save_now(5, {"z": np.zeros(3, np.complex128)})  # no safetensors dtype
        assert not isinstance(caught.value, PreemptedError)
    assert [step for step, _ in mgr.stats.failed] == [5] and mgr.stats.saved == []
    assert mgr.stats.preempted is None and not (tmp_path / "step-5").exists()  # removed again

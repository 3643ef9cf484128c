"""What keeps the event loop responsive during a save: CPU-only work at a lower priority,
and a cheap RSS sample on every tick of the loop monitor.

``perf sched`` on the 2-core reference VM showed the loop thread waiting up to 4 ms for a
core while the generator and checksum threads held both; with them at niceness 10 the
loop's p99 lag into ``null://`` fell from 3.5 to 1.5 ms (docs/benchmarks.md). Niceness is
checked in a fresh interpreter each: dgen-py's pool is process-global and, once lowered,
stays so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from asyncckpt import AsyncCheckpointer, ConfigError
from asyncckpt.monitor import current_rss

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import asyncio, json, os, sys, threading
from asyncckpt import AsyncCheckpointer
from asyncckpt.cpu import helper_threads

def nice(tid):
    return os.getpriority(os.PRIO_PROCESS, tid)

async def main():
    async with AsyncCheckpointer(chunk_size=1 << 20, num_buffers=4, **json.loads(sys.argv[1])) as ckpt:
        await ckpt.save("null://probe", 8 << 20)
        cpu = ckpt._cpu
        print(json.dumps({
            "loop": nice(threading.get_native_id()),
            "cpu_threads": [nice(t.native_id) for t in cpu._threads] if cpu is not None else None,
            "dgen_helpers": sorted(nice(t) for t in helper_threads()),
            "anyio_workers": sorted(
                nice(t.native_id) for t in threading.enumerate() if t.name == "AnyIO worker thread"
            ),
        }))

asyncio.run(main())
"""


def _niceness(options: dict[str, object]) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(options)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({}, 10),  # the library default: thread_budget="leave_loop_core"
        ({"cpu_nice": 19}, 19),
        ({"thread_budget": "mlperf", "cpu_nice": 5}, 5),
    ],
)
def test_fills_and_checksums_run_on_lowered_threads(options: dict[str, object], expected: int) -> None:
    got = _niceness(options)
    assert got["loop"] == 0  # the caller's thread is never touched
    assert got["cpu_threads"] and set(got["cpu_threads"]) == {expected}  # type: ignore[arg-type]
    assert got["dgen_helpers"] and set(got["dgen_helpers"]) == {expected}  # type: ignore[arg-type]
    assert set(got["anyio_workers"]) <= {0}  # type: ignore[arg-type]  # writes keep their priority


def test_the_mlperf_rule_leaves_priorities_alone() -> None:
    got = _niceness({"thread_budget": "mlperf"})
    assert got["cpu_threads"] is None
    assert set(got["dgen_helpers"]) == {0}  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [-1, 20, 2.5, "10", True])
def test_bad_cpu_nice_is_refused_naming_it(bad: object) -> None:
    with pytest.raises(ConfigError, match=rf"cpu_nice.*{bad!r}"):
        AsyncCheckpointer(cpu_nice=bad)


def test_rss_sample_is_this_process_and_a_forked_childs_own() -> None:
    def vm_rss() -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    assert abs(current_rss() - vm_rss()) < 8 << 20
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child touches 256 MiB, then reports its RSS before and after
        try:
            before = current_rss()
            ballast = bytearray(256 << 20)
            ballast[::4096] = b"x" * len(range(0, len(ballast), 4096))
            os.write(write, f"{before} {current_rss()}".encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        before, after = map(int, f.read().split())
    os.waitpid(pid, 0)
    # the child's own statm: the descriptor it inherited would show the parent, unchanged
    assert after - before >= 200 << 20


@pytest.mark.parametrize(("rule", "expected"), [("leave_loop_core", 10), ("mlperf", 0)])
async def test_a_writer_process_runs_at_cpu_nice(tmp_path: Path, rule: str, expected: int) -> None:
    async with AsyncCheckpointer(
        chunk_size=1 << 20, num_buffers=4, isolation="process", thread_budget=rule
    ) as ckpt:
        await ckpt.save(str(tmp_path / "ckpt.bin"), 4 << 20)
        (writer,) = ckpt._writers._writers.values()
        assert writer.pid is not None
        tids = [int(t) for t in os.listdir(f"/proc/{writer.pid}/task")]
        assert len(tids) > 1  # its loop's worker threads too, not only the main thread
        assert {os.getpriority(os.PRIO_PROCESS, t) for t in tids} == {expected}

"""benchmarks/bench_fio.py runs as documented: without fio it says how to install it (exit 2);
with fio a small run sweeps, alternates and reports a verdict for the library's defaults. As
root it also runs fio from huge-page buffers (issue 29), reserving the pages through
/proc/sys/vm/nr_hugepages only while it measures and always putting the previous value back:
after a run, after fio failed, and after SIGTERM."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .launch import ROOT, child_env

SCRIPT = ROOT / "benchmarks" / "bench_fio.py"
NR_HUGEPAGES = Path("/proc/sys/vm/nr_hugepages")
SYSV_SHM = Path("/proc/sysvipc/shm")


def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(SCRIPT), *args]
    return subprocess.run(cmd, env=child_env(**env), capture_output=True, text=True, timeout=120, cwd=ROOT)


def document(stdout: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(stdout[stdout.index("\n{") :])
    return doc


def nr_hugepages() -> int:
    return int(NR_HUGEPAGES.read_text())


def shm_segments() -> set[str]:
    """SysV shared memory segment ids (fio's shmhuge buffers are such segments)."""
    return {line.split()[1] for line in SYSV_SHM.read_text().splitlines()[1:]}


def processes_naming(text: str) -> list[str]:
    """Command lines of live processes that mention ``text`` (a fio left running would)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if proc.name.isdigit() and text in cmdline and int(proc.name) != os.getpid():
            found.append(cmdline)
    return found


def needs_fio() -> None:
    if shutil.which("fio") is None:
        pytest.skip("fio not installed: run tests/setup_system.sh (apt-get install -y fio)")


@pytest.fixture
def previous_hugepages() -> Iterator[int]:
    """nr_hugepages one page above what the machine had, so that "restored" means this non-zero
    value put back, not a 0 written; the machine's own value is put back afterwards."""
    needs_fio()
    if os.geteuid() != 0:
        pytest.skip("the huge-page arm reserves pages through /proc/sys/vm/nr_hugepages: root only")
    old = nr_hugepages()
    NR_HUGEPAGES.write_text(f"{old + 1}\n")
    try:
        if nr_hugepages() != old + 1:
            pytest.skip("the kernel has no free 2 MiB page to reserve for the test's baseline")
        yield old + 1
    finally:
        NR_HUGEPAGES.write_text(f"{old}\n")


def test_without_fio_it_says_how_to_install_it(tmp_path: Path) -> None:
    proc = run("--size", "64MiB", "--dir", str(tmp_path), PATH=str(tmp_path))  # no fio on PATH
    assert proc.returncode == 2, proc.stderr
    assert "apt-get install -y fio" in proc.stderr
    assert list(tmp_path.iterdir()) == []  # nothing measured, nothing written


def test_small_run_reports_verdicts_for_the_defaults(disk_path: Path) -> None:
    needs_fio()
    args = ["--size", "32MiB", "--pairs", "5", "--engines", "libaio", "--depths", "1,2", "--sweep-reps", "1"]
    proc = run(*args, "--no-huge-pages", "--dir", str(disk_path))
    assert proc.returncode == 0, proc.stderr
    doc = document(proc.stdout)
    assert doc["benchmark"] == "fio"
    assert doc["asyncckpt"]["tuning"] == "none: library defaults"
    assert doc["asyncckpt"]["writes_in_flight"] == doc["asyncckpt"]["file_default_in_flight"]
    assert doc["asyncckpt"]["reads_in_flight"] == doc["asyncckpt"]["file_default_in_flight"]
    assert doc["block_bytes"] == doc["asyncckpt"]["chunk_size"]
    assert {best["depth"] for best in doc["fio_best"].values()} <= {1, 2}
    sweep = [r for r in doc["rows"] if r["phase"] == "sweep"]
    assert len(sweep) == 4  # write and read at depths 1 and 2, malloc'd buffers only
    huge = doc["fio_huge_pages"]
    assert huge["used"] is False and "--no-huge-pages" in huge["reason"]
    for op in ("save", "load"):
        verdict = doc[op]
        assert verdict["pairs"] == 5 and len(verdict["ratios"]) == 5
        assert all(r > 0 for r in verdict["ratios"])
        assert verdict["verdict"] in {"met", "not met", "not demonstrated"}
        assert verdict["target"] == ">= 0.97"
    # each pair's loads: twice per side, mirrored (A B B A), fio first in every other pair
    loads = [r for r in doc["rows"] if r["op"] == "load" and r["phase"].startswith("pair")]
    assert ["(fio, asyncckpt x 2, fio)" in r["config"] for r in loads] == [True, False, True, False, True]
    assert all(r["ratio"] == pytest.approx(r["asyncckpt_GBps"] / r["fio_GBps"]) for r in loads)
    assert list(disk_path.iterdir()) == []  # its temporary directory and files are gone


def test_write_loop_splits_the_devices_drift_from_the_saves_own_cost(disk_path: Path) -> None:
    """``--write-loop``: each pair also times a plain loop of the save's writes (as many in
    flight), and the JSON and table give loop / fio and save / loop pair by pair."""
    needs_fio()
    args = ["--size", "32MiB", "--pairs", "5", "--engines", "libaio", "--depths", "1", "--sweep-reps", "1"]
    proc = run(*args, "--no-huge-pages", "--write-loop", "--dir", str(disk_path))
    assert proc.returncode == 0, proc.stderr
    doc = document(proc.stdout)
    loop = doc["write_loop"]
    assert loop["threads"] == doc["asyncckpt"]["writes_in_flight"]
    assert loop["area_bytes"] == doc["asyncckpt"]["pool_bytes"]
    assert isinstance(loop["huge_pages_advised"], bool)
    rows = [r for r in doc["rows"] if r["op"] == "write loop"]
    assert len(rows) == 5
    for split in ("loop_vs_fio", "save_vs_loop"):
        assert len(loop[split]["ratios"]) == 5 and all(r > 0 for r in loop[split]["ratios"])
    saves = [r for r in doc["rows"] if r["op"] == "save" and r["phase"].startswith("pair")]
    for row, save in zip(rows, saves, strict=True):  # one loop per pair, beside that pair's fio
        assert row["fio_GBps"] == save["fio_GBps"]
        assert row["ratio"] == pytest.approx(row["asyncckpt_GBps"] / row["fio_GBps"])
    assert {r["op"] for r in doc["rows"] if r["phase"] == "split"} == {"loop / fio", "save / loop"}
    assert list(disk_path.iterdir()) == []  # the loop's file is gone too


def test_huge_page_arm_runs_and_nr_hugepages_is_restored(disk_path: Path, previous_hugepages: int) -> None:
    segments = shm_segments()
    args = ["--size", "64MiB", "--pairs", "5", "--engines", "libaio", "--depths", "2", "--sweep-reps", "1"]
    proc = run(*args, "--dir", str(disk_path))
    assert proc.returncode == 0, proc.stderr
    assert nr_hugepages() == previous_hugepages
    doc = document(proc.stdout)
    huge = doc["fio_huge_pages"]
    assert huge["used"] is True, huge
    assert huge["reason"] is None
    assert huge["page_bytes"] == 2 * 1024 * 1024
    # depth 2 × 32 MiB from huge pages: 32 pages, 2 of fio's alignment, 2 of margin
    assert huge["pages"] == 36
    assert huge["nr_hugepages_before"] == previous_hugepages
    assert huge["nr_hugepages_during"] == previous_hugepages + 36  # read back from the kernel
    assert huge["nr_hugepages_after"] == previous_hugepages
    sweep = [r for r in doc["rows"] if r["phase"] == "sweep"]
    assert len(sweep) == 4  # write and read at depth 2, malloc'd and huge-page buffers
    huge_rows = [r for r in sweep if r["config"].endswith("shmhuge")]
    assert len(huge_rows) == 2 and all(r["fio_GBps"] > 0 for r in huge_rows)
    # the verdicts are against the best of every arm, the huge-page one included
    for rw, op in (("write", "save"), ("read", "load")):
        rates = [r["fio_GBps"] for r in sweep if r["op"] == rw]
        best = doc["fio_best"][rw]
        assert best["GBps"] == max(rates)
        assert best["iomem"] in {"malloc", "shmhuge"}
        pairs = [r for r in doc["rows"] if r["phase"].startswith("pair") and r["op"] == op]
        arm = f"fio {best['engine']} depth {best['depth']} {best['iomem']}"
        assert pairs and all(r["config"].startswith(arm) for r in pairs)
        assert doc[op]["target"] == ">= 0.97"
    assert any(r["phase"] == "setup" and r["op"] == "huge pages" for r in doc["rows"])
    assert shm_segments() <= segments  # fio's huge-page segments are gone
    assert list(disk_path.iterdir()) == []


def test_nr_hugepages_is_restored_when_fio_fails(disk_path: Path, previous_hugepages: int) -> None:
    segments = shm_segments()
    args = ["--size", "64MiB", "--pairs", "5", "--depths", "1", "--sweep-reps", "1"]
    proc = run(*args, "--engines", "no-such-engine", "--dir", str(disk_path))
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "no fio configuration ran" in proc.stderr.splitlines()[-1]
    assert f"nr_hugepages {previous_hugepages} -> " in proc.stderr  # the pages were reserved ...
    assert nr_hugepages() == previous_hugepages  # ... and given back
    assert shm_segments() <= segments
    assert list(disk_path.iterdir()) == []


def test_sigterm_mid_run_restores_nr_hugepages(disk_path: Path, previous_hugepages: int) -> None:
    segments = shm_segments()
    args = ["--size", "256MiB", "--pairs", "5", "--engines", "libaio", "--depths", "1,2", "--sweep-reps", "3"]
    cmd = [sys.executable, str(SCRIPT), *args, "--dir", str(disk_path)]
    with subprocess.Popen(
        cmd, env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT
    ) as proc:
        assert proc.stderr is not None
        seen: list[str] = []
        for line in proc.stderr:  # synchronise on what it says: pages reserved, a huge-page fio next
            seen.append(line)
            if line.startswith("sweep: write") and "shmhuge" in line:
                break
        else:
            pytest.fail(f"it never reserved pages and started fio: {''.join(seen)}")
        assert nr_hugepages() > previous_hugepages  # reserved right now
        proc.send_signal(signal.SIGTERM)
        rest = proc.stderr.read()
        rc = proc.wait(timeout=60)
    assert rc == 128 + signal.SIGTERM, rest
    assert "Traceback" not in rest
    assert "stopped by SIGTERM" in rest.splitlines()[-1]
    assert nr_hugepages() == previous_hugepages
    assert processes_naming(str(disk_path)) == []  # no fio left running
    assert shm_segments() <= segments
    assert list(disk_path.iterdir()) == []

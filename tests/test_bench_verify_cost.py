"""``bench_verify_cost.py --stand-ins``: the verified loads whose check is replaced by part of
its work run as verified loads (the check's hop is taken, its time recorded), the sleep
stand-in spends no CPU on the check, and the CRC stand-ins do; the real check is put back
after each of them (the plain verified arm, which runs after them in the rotation, still
checks the bytes: its check CPU is that of a real CRC over them)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from .launch import ROOT, child_env

STAND_INS = ("check -> sleep", "check -> CRC of a cached block", "check -> CRC of other memory")


def test_stand_in_arms_take_the_checks_place(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "bench_verify_cost.py"),
            "--size",
            "64MiB",
            "--pairs",
            "2",
            "--dir",
            str(tmp_path),
            "--stand-ins",
        ],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT / "benchmarks",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    doc: dict[str, Any] = json.loads(done.stdout[done.stdout.index("\n{") :])
    assert doc["stand_ins"] is True
    rows = {row["load"]: row for row in doc["rows"]}
    assert set(STAND_INS) <= set(rows) and {"verified", "unverified"} <= set(rows)
    assert all(len(doc["rates"][arm]) == 2 for arm in rows)
    for arm in STAND_INS:
        assert rows[arm]["check s"] > 0, arm  # verified loads: the (replaced) check ran
    assert rows["unverified"]["check s"] == 0
    sleep_cpu = rows["check -> sleep"]["check CPU s"]
    assert sleep_cpu < 0.5 * rows["check -> CRC of other memory"]["check CPU s"]
    assert sleep_cpu < 0.5 * rows["verified"]["check CPU s"]  # the real check is back after it
    assert not list(tmp_path.iterdir())  # the bench's file went with its directory

"""benchmarks/bench_azure_gcs_clients.py runs as documented: a small run measures every working
client against each emulator, checks what it read back, and leaves no emulator running."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from asyncckpt.servers.azurite import ACCOUNT_KEY

from .launch import ROOT, child_env

SCRIPT = ROOT / "benchmarks" / "bench_azure_gcs_clients.py"


SAVES = {
    (store, f"asyncckpt save/load ({backend})", op)
    for store, backend in (("azure", "obstore-azure"), ("azure", "s3dlio-azure"), ("gcs", "gcs"))
    for op in ("put", "get")
}


@pytest.mark.parametrize("with_saves", [False, True], ids=["clients", "with-saves"])
@pytest.mark.usefixtures("azurite_endpoint", "gcs_endpoint")  # skips with the reason when absent
def test_small_run_reports_every_working_client(with_saves: bool) -> None:
    cmd = [sys.executable, str(SCRIPT), "--size", "8MiB", "--part-size", "4MiB", "--repeat", "2"]
    cmd += ["--with-saves"] if with_saves else []
    done = subprocess.run(cmd, env=child_env(), capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    doc: dict[str, Any] = json.loads(done.stdout[done.stdout.index("\n{") :])
    rows = {(r["store"], r["client"], r["op"]): r for r in doc["rows"]}
    assert set(rows) == {
        ("azure", "obstore", "put"),
        ("azure", "obstore", "get"),
        ("azure", "s3dlio", "put"),
        ("azure", "s3dlio", "get"),
        ("gcs", "json-api (stdlib)", "put"),
        ("gcs", "json-api (stdlib)", "get"),
        ("gcs", "obstore (get only)", "get"),  # obstore cannot put to fake-gcs-server
        ("gcs", "asyncckpt gcs", "put"),  # the gs:// backend itself
        ("gcs", "asyncckpt gcs", "get"),
    } | (SAVES if with_saves else set())
    assert all(r["runs"] == 2 and all(v > 0 for v in r["samples"]) for r in rows.values())
    assert doc["size"] == 8 << 20 and ACCOUNT_KEY.reveal() not in done.stdout + done.stderr

"""``python -m asyncckpt.bench --embedded-store azure|gcs``: start the emulator, create the bucket,
run a save and a verified load through the store's default backend (gcs here; azure in
tests/test_azure.py), stop; no secret, nothing left running."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.ports import refused

REPO = Path(__file__).resolve().parents[1]


def bench(*args: str, path: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if path is not None:
        env["PATH"] = path
    return subprocess.run(
        [sys.executable, "-m", "asyncckpt.bench", *args], capture_output=True, text=True, timeout=120, env=env
    )


def test_embedded_gcs_saves_loads_verified_and_stops(gcs_endpoint: object, tmp_path: Path) -> None:
    """gs:// through the gcs backend: a resumable upload of three chunks (1 MiB, 1 MiB, the rest),
    then a load verified against the sealed CRC32Cs; the emulator stopped at exit."""
    out = tmp_path / "r.json"
    done = bench(
        "--embedded-store", "gcs", "--size", "2500KiB", "--chunk-size", "1MiB", "--json", str(out), "-q"
    )
    started = re.search(r"embedded gcs store: \S+ at (http://[\d.:]+)", done.stderr)
    assert started, done.stderr
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    results = json.loads(out.read_text())["results"]
    save, load = (next(r for r in results if r["operation"] == op) for op in ("save", "load"))
    assert save["metadata"]["uri"] == load["metadata"]["uri"] == "gs://asyncckpt-bench/checkpoint.bin"
    assert save["metadata"]["backend"] == "gcs" and save["metadata"]["extra"]["parts"] == 3
    assert load["size_bytes"] == 2500 * 1024 and load["metadata"]["extra"]["verify"] == "checksum"
    assert load["verify_bps"] > 0  # the chunks' CRC32Cs were checked
    assert refused(started.group(1))  # stopped at exit


def test_embedded_store_and_embedded_s3_together_are_refused_before_starting() -> None:
    done = bench("--embedded-store", "gcs", "--embedded-s3", "moto", "-q")
    assert done.returncode == 2 and "embedded" not in done.stderr.split("error:")[0]
    assert "give one of them" in done.stderr


def test_embedded_store_without_node_says_how_to_install(tmp_path: Path) -> None:
    done = bench("--embedded-store", "azure", "-q", path=str(tmp_path))  # a PATH without node
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "apt-get install -y nodejs npm" in done.stderr

"""``python -m asyncckpt.bench --embedded-store azure|gcs``: start, create, refuse the target
(gcs: no gs:// backend yet; azure runs, tests/test_azure.py), stop; one line on stderr, rc 2, no
secret, nothing left."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from asyncckpt.servers.azurite import ACCOUNT_KEY, AzureEndpoint
from tests.ports import refused

REPO = Path(__file__).resolve().parents[1]


def bench(*args: str, path: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if path is not None:
        env["PATH"] = path
    return subprocess.run(
        [sys.executable, "-m", "asyncckpt.bench", *args], capture_output=True, text=True, timeout=120, env=env
    )


@pytest.mark.parametrize(("kind", "scheme"), [("gcs", "gs")])
def test_embedded_store_starts_creates_refuses_and_stops(
    kind: str, scheme: str, request: pytest.FixtureRequest
) -> None:
    request.getfixturevalue("azurite_endpoint" if kind == "azure" else "gcs_endpoint")  # skip if absent
    done = bench("--embedded-store", kind, "--size", "8MiB", "-q")
    started = re.search(rf"embedded {kind} store: \S+ at (http://[\d.:]+)", done.stderr)
    assert started, done.stderr
    assert done.returncode == 2 and "Traceback" not in done.stderr
    error = [line for line in done.stderr.splitlines() if line.startswith("asyncckpt.bench: error:")]
    assert (
        len(error) == 1 and f"'{scheme}://asyncckpt-bench/checkpoint.bin': asyncckpt has no gs://" in error[0]
    )
    assert refused(started.group(1))  # stopped at exit
    sas_signature = AzureEndpoint("http://unused").sas().reveal().rsplit("sig=", 1)[1]  # the key's SAS
    for secret in (ACCOUNT_KEY.reveal(), sas_signature):
        assert secret not in done.stdout + done.stderr


def test_embedded_store_and_embedded_s3_together_are_refused_before_starting() -> None:
    done = bench("--embedded-store", "gcs", "--embedded-s3", "moto", "-q")
    assert done.returncode == 2 and "embedded" not in done.stderr.split("error:")[0]
    assert "give one of them" in done.stderr


def test_embedded_store_without_node_says_how_to_install(tmp_path: Path) -> None:
    done = bench("--embedded-store", "azure", "-q", path=str(tmp_path))  # a PATH without node
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "apt-get install -y nodejs npm" in done.stderr

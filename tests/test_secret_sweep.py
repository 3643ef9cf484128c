"""A distinctive secret never reaches any output channel, for every S3 backend and failure mode.

Each case runs ``tests/secret_sweep_driver.py`` in a fresh interpreter (s3dlio and Mountpoint
take credentials process-wide) against moto: a working save and load, a wrong secret
(access denied, on a moto that enforces IAM), a refused connection and a missing bucket.
The driver prints every channel (reprs, JSON, exception chains, DEBUG logs of every logger,
the CLI's stdout/stderr/JSON); the outcome markers prove each mode really happened.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from asyncckpt.servers.embedded import MotoServer
from asyncckpt.servers.s3endpoint import S3Endpoint

from .s3_server import provision_user

BACKENDS = ("aiobotocore", "s3dlio", "minio", "s3torchconnector", "obstore")
ROOT = Path(__file__).parent.parent
#: what each mode must end with: (library outcome, CLI exit code)
EXPECTED = {
    "ok": ("saved", 0),
    "denied": ("StoragePermissionError", 1),
    "refused": ("StorageError", 1),
    "missing_bucket": ("TargetNotFoundError", 2),
}


@pytest.fixture(scope="module")
def moto() -> Iterator[S3Endpoint]:
    with MotoServer() as server:
        yield server


@pytest.fixture(scope="module")
def auth_moto() -> Iterator[S3Endpoint]:
    """A moto enforcing IAM, with one user allowed s3:* (its secret is not the one swept for)."""
    with MotoServer(auth=True) as server:
        yield provision_user(server)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again on exit: connections are refused


@pytest.mark.parametrize("mode", sorted(EXPECTED))
@pytest.mark.parametrize("backend", BACKENDS)
def test_secret_in_no_output_channel(
    backend: str, mode: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    secret = f"Sweep-{uuid.uuid4().hex}-Secret"
    token = f"Sweep-{uuid.uuid4().hex}-Token"  # a session token is a secret too
    server: S3Endpoint = request.getfixturevalue("auth_moto" if mode == "denied" else "moto")
    bucket = server.create_bucket(f"sweep-{uuid.uuid4().hex[:12]}")
    endpoint, uri, extra = server.endpoint, f"s3://{bucket}/ck.bin", dict[str, object]()
    if mode == "refused":
        endpoint, extra = f"http://127.0.0.1:{closed_port()}", {"max_attempts": 1}
    elif mode == "missing_bucket":
        uri = f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/ck.bin"
    # moto without IAM accepts any secret: "ok" really signs with the swept one
    extra["session_token"] = token
    spec = {"backend": backend, "endpoint": endpoint, "uri": uri, "extra": extra, "secret": secret}
    spec["access_key"] = server.access_key
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "S3_"))}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.secret_sweep_driver", json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,  # no stray .env
        env={**env, "PYTHONPATH": str(ROOT)},
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    library, cli_code = EXPECTED[mode]
    assert f"LIBRARY-OUTCOME {library}" in proc.stdout, output[-3000:]
    assert f"CLI-EXIT {cli_code}" in proc.stdout, output[-3000:]
    leaked = [line[:300] for line in output.splitlines() if secret in line or token in line]
    assert not leaked, leaked
    assert "Secret('**********')" in proc.stdout  # the config's repr was printed, masked

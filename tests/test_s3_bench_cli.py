"""The bench CLI on each S3 server: --compare-backends prints a save and a load row per installed backend."""

from __future__ import annotations

import os
import subprocess
import sys

from asyncckpt.servers.s3endpoint import S3Endpoint
from asyncckpt.sinks.s3 import installed_backends

from .s3_harness import new_bucket


def bench(server: S3Endpoint, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **server.env(), "AWS_EC2_METADATA_DISABLED": "true"}
    cmd = [sys.executable, "-m", "asyncckpt.bench", *args, "--chunk-size", "5MiB", "--num-buffers", "3", "-q"]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)


def test_compare_backends_one_table(s3_endpoint: S3Endpoint) -> None:
    bucket = new_bucket(s3_endpoint)
    # a separate process: s3dlio configures its client once per process (fork safety, harness)
    proc = bench(s3_endpoint, f"s3://{bucket}/cmp.bin", "--size", "11MiB", "--compare-backends")
    assert proc.returncode == 0, proc.stderr
    rows = [line.split()[:2] for line in proc.stdout.splitlines()[2:] if line.strip()]
    # the default mode saves, then loads (with verification), with every backend
    assert [b for b, op in rows if op == "save"] == installed_backends()
    assert [b for b, op in rows if op == "load"] == installed_backends()
    assert s3_endpoint.secret_key not in proc.stdout + proc.stderr


def test_part_size_error_exits_2_before_io(s3_endpoint: S3Endpoint) -> None:
    bucket = new_bucket(s3_endpoint)
    proc = bench(
        s3_endpoint,
        f"s3://{bucket}/p.bin",
        "--size",
        "11MiB",
        "--backend",
        "aiobotocore",
        "--part-size",
        "1MiB",
    )
    assert proc.returncode == 2
    assert "below the S3 minimum of 5 MiB" in proc.stderr
    assert "Uploads" not in s3_endpoint.client().list_multipart_uploads(Bucket=bucket)

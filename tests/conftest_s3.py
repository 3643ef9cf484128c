"""S3 fixtures: one moto server per test session, a fresh bucket per test, a clean AWS env."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from .s3_server import MotoS3


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[MotoS3]:
    server = MotoS3.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_env(moto_s3: MotoS3, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> MotoS3:
    """Point every client at moto through the environment; no real AWS settings leak in."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    for name, value in moto_s3.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.chdir(tmp_path)  # no stray .env from the working directory
    return moto_s3


@pytest.fixture
def bucket(s3_env: MotoS3) -> str:
    """A fresh bucket, so upload listings are per test."""
    return s3_env.create_bucket(f"t-{uuid.uuid4().hex[:16]}")

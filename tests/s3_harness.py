"""Per-backend test harness: make a sink, and look at the target with independent means.

s3dlio, s3torchconnector and obstore start Rust/CRT runtimes; after a process has used s3dlio
or obstore, a ``fork``ed child hangs (see shared notes), and s3dlio fixes its client configuration at
first use. Their tests therefore run in a separate pytest process (``run_child_suite``),
never in the main test process that other tests may fork from.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import uuid
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from asyncckpt.servers.azurite import AzureEndpoint
from asyncckpt.servers.gcs_emulator import GcsEndpoint
from asyncckpt.servers.s3endpoint import S3Endpoint
from asyncckpt.sinks import MEMORY_STORE, Sink, SinkOptions, import_backend, make_sink
from asyncckpt.sinks.s3 import installed
from asyncckpt.units import MiB

from .plugins.s3servers import shared_server_env

CHUNK = 5 * MiB  # = the S3 minimum part size: moto stays fast with few, small parts
S3_IN_PROCESS = ("aiobotocore", "minio")
S3_IN_CHILD = ("s3dlio", "s3torchconnector", "obstore")
CHILD_ENV = "ASYNCCKPT_TEST_IN_CHILD"
AZURE_BACKENDS = ("obstore-azure", "s3dlio-azure")  # in this process, as tests/test_azure.py
GCS_BACKENDS = ("gcs",)  # aiohttp on the loop: in this process


def in_child() -> bool:
    return os.environ.get(CHILD_ENV) == "1"


def s3_backends() -> tuple[str, ...]:
    """The S3 backends this process tests (the others run in the child suite)."""
    return S3_IN_CHILD if in_child() else S3_IN_PROCESS


@dataclass
class Target:
    """One backend's view of a test target."""

    backend: str
    executor: Executor
    tmp: Path
    s3: S3Endpoint | None = None
    bucket: str = ""  # or an Azure container
    options: dict[str, Any] = field(default_factory=dict)
    az: AzureEndpoint | None = None
    gcs: GcsEndpoint | None = None

    def __post_init__(self) -> None:
        """Import the backend's module and client library here, in the (synchronous) fixture,
        as a checkpointer does in a thread: the test's first ``sink()`` runs on its event loop,
        and a cold import there (``minio``'s modules, Mountpoint's shared library read from a
        fresh venv) slept 0.10-0.15 s on the disk with the loop held."""
        import_backend(self.backend)

    def uri(self, name: str) -> str:
        if self.backend == "file":
            return str(self.tmp / name)
        if self.backend == "memory":
            return f"memory://{self.tmp.name}/{name}"
        if self.az is not None:
            return f"az://{self.bucket}/{name}"
        if self.gcs is not None:
            return f"gs://{self.bucket}/{name}"
        return f"s3://{self.bucket}/{name}"

    def sink(self, name: str, chunk: int = CHUNK) -> Sink:
        options = SinkOptions(chunk_size=chunk, extra=dict(self.options))
        return make_sink(self.uri(name), backend=self.backend, executor=self.executor, options=options)

    async def published(self, name: str) -> bytes | None:
        """The object's bytes read independently of the sink, or None when absent (off the loop)."""
        return await asyncio.to_thread(self._published, name)

    async def leftovers(self) -> list[str]:
        """Temporary files or unfinished multipart uploads at the target."""
        return await asyncio.to_thread(self._leftovers)

    def _published(self, name: str) -> bytes | None:
        if self.backend == "file":
            path = self.tmp / name
            return path.read_bytes() if path.exists() else None
        if self.backend == "memory":
            return MEMORY_STORE.get(self.uri(name))
        if self.az is not None:
            status, body = self.az.request("GET", f"/{self.bucket}/{name}")
            return None if status == 404 else body
        if self.gcs is not None:
            status, body = self.gcs.request(
                "GET", f"/storage/v1/b/{self.bucket}/o/{quote(name, safe='')}?alt=media"
            )
            assert status in (200, 404), body
            return None if status == 404 else body
        assert self.s3 is not None
        client = self.s3.client()
        try:
            body: bytes = client.get_object(Bucket=self.bucket, Key=name)["Body"].read()
            return body
        except client.exceptions.NoSuchKey:
            return None

    def _leftovers(self) -> list[str]:
        if self.backend == "file":
            return sorted(p.name for p in self.tmp.iterdir() if p.name.endswith(".partial"))
        if self.backend == "memory":
            return []
        if self.az is not None:  # blobs with blocks but no block list: what a dead save leaves
            query = {"restype": "container", "comp": "list", "include": "uncommittedblobs"}
            status, body = self.az.request("GET", f"/{self.bucket}", query=query)
            assert status == 200, body
            names = [n.decode() for n in re.findall(rb"<Name>([^<]*)</Name>", body)]
            return sorted(set(names) - set(self._committed()))
        if self.gcs is not None:  # an unfinished resumable upload is listed nowhere (GCS has no call)
            return []
        assert self.s3 is not None
        listing = self.s3.client().list_multipart_uploads(Bucket=self.bucket)
        return [u["Key"] for u in listing.get("Uploads", [])]

    def _committed(self) -> list[str]:
        assert self.az is not None
        status, body = self.az.request(
            "GET", f"/{self.bucket}", query={"restype": "container", "comp": "list"}
        )
        assert status == 200, body
        return [n.decode() for n in re.findall(rb"<Name>([^<]*)</Name>", body)]


def azure_options(ep: AzureEndpoint, backend: str = "obstore-azure", **extra: object) -> dict[str, object]:
    """obstore takes the account key; s3dlio has no key mode: a SAS derived from it."""
    credential = {"sas_token": ep.sas()} if backend == "s3dlio-azure" else {"account_key": ep.key}
    return {"account": ep.account, **credential, "endpoint_url": ep.account_url, **extra}


def gcs_options(ep: GcsEndpoint, **extra: object) -> dict[str, object]:
    """The emulator named explicitly (no credential: fake-gcs-server checks none)."""
    return {"endpoint_url": ep.url, **extra}


def new_bucket(server: S3Endpoint) -> str:
    return server.create_bucket(f"t-{uuid.uuid4().hex[:16]}")


async def s3_call(server: S3Endpoint, method: str, **kwargs: Any) -> Any:
    """One boto3 call to check a result, in a thread: the client too is made there (its first
    making imports boto3 and reads botocore's models, 0.1-0.2 s that the loop guard flags)."""
    return await asyncio.to_thread(lambda: getattr(server.client(), method)(**kwargs))


def run_child_suite(
    test_file: str, server: S3Endpoint, selection: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``test_file``'s out-of-process backends (or ``-k selection``) in a fresh pytest process.

    The child tests ``server`` alone (``--s3-server=<kind>``: s3dlio configures its client once
    per process) and reuses it rather than starting its own.
    """
    missing = [b for b in S3_IN_CHILD if not installed(b)]
    assert not missing, f"test extras not installed: {missing} (pip install 'asyncckpt[test]')"
    env = {**os.environ, CHILD_ENV: "1", **shared_server_env(server), **(env or {})}
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        test_file,
        "-q",
        "-p",
        "no:cacheprovider",
        f"--s3-server={server.kind}",
        "-k",
        selection or " or ".join(S3_IN_CHILD),
    ]
    return subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=240, cwd=Path(__file__).parent.parent
    )

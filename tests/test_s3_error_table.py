"""One error boundary for every S3 library: real error answers of moto and OpenStack Swift,
for every backend, come out as the same asyncckpt error with a message that says what to do.

Each row provokes a real answer (a missing key, a missing bucket, a wrong secret, a closed
port, a 503 from a relay in front of the server) through the public API. s3dlio and Mountpoint
configure their clients per process, and a process that used s3dlio or obstore cannot fork
safely, so those three run in a writer process each (isolation), which
also proves the mapped error survives the trip back to the caller.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from asyncckpt import AsyncCheckpointer, MiB
from asyncckpt.errors import StorageError, StoragePermissionError, TargetNotFoundError
from asyncckpt.servers.s3endpoint import S3Endpoint

from .plugins.s3servers import private_auth_server
from .relay import FaultyFront
from .s3_harness import in_child, new_bucket

pytestmark = pytest.mark.skipif(in_child(), reason="runs in the parent test process only")

BACKENDS = ("aiobotocore", "minio", "s3dlio", "s3torchconnector", "obstore")
IN_CHILD = ("s3dlio", "s3torchconnector", "obstore")  # Tokio/CRT runtimes: never in the test process
PART = 5 * MiB


def closed_port() -> int:
    """A port nothing listens on (bound, then released: refused from then on)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def checkpointer(backend: str, options: dict[str, Any]) -> AsyncCheckpointer:
    isolation = "process" if backend in IN_CHILD else "none"
    options = {"max_attempts": 1, "connect_timeout": 2.0, **options}
    return AsyncCheckpointer(
        chunk_size=PART, num_buffers=2, backend=backend, backend_options=options, isolation=isolation
    )


async def raised(action: Callable[[], Awaitable[object]]) -> BaseException:
    try:
        await action()
    except StorageError as exc:
        return exc
    raise AssertionError("no error")


Row = Callable[[str, S3Endpoint, str], Awaitable[BaseException]]


async def missing_key(backend: str, ep: S3Endpoint, bucket: str) -> BaseException:
    async with checkpointer(backend, ep.options()) as ckpt:
        return await raised(lambda: ckpt.load(f"s3://{bucket}/absent.bin"))


async def missing_bucket(backend: str, ep: S3Endpoint, bucket: str) -> BaseException:
    async with checkpointer(backend, ep.options()) as ckpt:
        return await raised(lambda: ckpt.load(f"s3://{bucket}-gone/k.bin"))


async def wrong_secret(backend: str, ep: S3Endpoint, bucket: str) -> BaseException:
    async with checkpointer(backend, ep.options(secret_access_key="WrongSecret-table")) as ckpt:
        return await raised(lambda: ckpt.save(f"s3://{bucket}/denied.bin", PART + 1))


async def unreachable(backend: str, ep: S3Endpoint, bucket: str) -> BaseException:
    options = ep.options(endpoint_url=f"http://127.0.0.1:{closed_port()}")
    async with checkpointer(backend, options) as ckpt:
        return await raised(lambda: ckpt.save(f"s3://{bucket}/nowhere.bin", PART + 1))


async def busy(backend: str, ep: S3Endpoint, bucket: str) -> BaseException:
    front = FaultyFront(ep.endpoint, "busy", lambda line: line.startswith("PUT "), times=100)
    url = await front.start()
    try:
        async with checkpointer(backend, ep.options(endpoint_url=url)) as ckpt:
            return await raised(lambda: ckpt.save(f"s3://{bucket}/busy.bin", 2 * PART))
    finally:
        await front.stop()


#: row → (the provocation, the asyncckpt class expected exactly, words the message must have)
TABLE: dict[str, tuple[Row, type[StorageError], str]] = {
    "missing key": (missing_key, TargetNotFoundError, "absent.bin"),
    "missing bucket": (missing_bucket, TargetNotFoundError, "-gone"),
    "wrong secret": (wrong_secret, StoragePermissionError, "AWS_SECRET_ACCESS_KEY"),
    "unreachable": (unreachable, StorageError, "cannot reach the endpoint"),
    "503": (busy, StorageError, "503 Service Unavailable"),
}


@pytest.mark.parametrize("row", sorted(TABLE))
@pytest.mark.parametrize("backend", BACKENDS)
async def test_error_table(
    backend: str, row: str, s3_endpoint: S3Endpoint, request: pytest.FixtureRequest
) -> None:
    provoke, expected, words = TABLE[row]
    server = s3_endpoint
    if row == "wrong secret" and s3_endpoint.kind == "moto":
        server = await private_auth_server(request)  # plain moto accepts any secret
    bucket = await asyncio.to_thread(new_bucket, server)
    err = await provoke(backend, server, bucket)
    assert type(err) is expected, f"{backend}/{row}: {type(err).__name__}: {err}"
    assert words in str(err), str(err)
    assert backend in str(err)  # the message names the library that answered
    assert "WrongSecret-table" not in f"{err!s} {err!r}"

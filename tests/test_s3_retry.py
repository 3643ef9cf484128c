"""Transient S3 faults on ONE endpoint are retried by asyncckpt, against a real moto server.

``FaultyFront`` relays HTTP to moto and spoils chosen requests: ``cut`` forwards the head and
half the body of a request, then closes both connections (a reset mid-part); ``busy`` reads
the request whole and answers ``503 SlowDown`` itself; ``deny`` answers ``403 AccessDenied``.
``short`` relays the request but cuts its response after 1 MiB. botocore cannot rewind the
pool's memoryview body of ``upload_part``, so these retries must be asyncckpt's own: fresh
requests with the same buffer.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Callable

import pytest

from asyncckpt import AsyncCheckpointer, StorageError, StoragePermissionError
from asyncckpt.bench.s3endpoint import S3Endpoint

from .conftest import expected_bytes
from .s3_harness import CHUNK, in_child, new_bucket

pytestmark = pytest.mark.skipif(in_child(), reason="aiobotocore runs in the parent process only")

_PART = re.compile(r"^PUT \S*partNumber=(\d+)")


def is_part(line: str) -> bool:
    return _PART.match(line) is not None


def is_part_2(line: str) -> bool:
    return (m := _PART.match(line)) is not None and m.group(1) == "2"


def is_create(line: str) -> bool:
    return line.startswith("POST ") and line.split()[1].endswith("?uploads")


#: mode → (status, reason, S3 error code, message) of the answer the front end gives itself
ANSWERS = {
    "busy": (503, "Slow Down", "SlowDown", "Please reduce your request rate."),
    "deny": (403, "Forbidden", "AccessDenied", "Access Denied"),
}


class FaultyFront:
    """An HTTP/1.1 relay on 127.0.0.1 in front of moto that spoils matching requests."""

    def __init__(self, target: str, mode: str, match: Callable[[str], bool], times: int = 1) -> None:
        host, port = target.removeprefix("http://").split(":")
        self.target = (host, int(port))
        self.mode, self.match, self.left = mode, match, times
        self.spoiled: list[str] = []  # request lines that were spoiled
        self.matched: list[str] = []  # every matching request line seen
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def stop(self) -> None:
        self.server.close()
        await self.server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    @staticmethod
    async def _pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, sent: list[int]) -> None:
        """Responses, passed through until ``sent[0]`` bytes went by ``sent[1]`` (the cut)."""
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await src.read(1 << 16):
                dst.write(data[: max(0, sent[1] - sent[0])])
                sent[0] += len(data)
                if sent[0] >= sent[1]:
                    break
                await dst.drain()
        dst.transport.abort() if sent[0] >= sent[1] else dst.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection(*self.target)
        sent = [0, 1 << 62]  # response bytes relayed so far; where to cut them
        back = asyncio.create_task(self._pump(up_r, writer, sent))
        self._tasks.add(back)
        back.add_done_callback(self._tasks.discard)
        try:
            while True:  # one request per turn: clients do not pipeline
                head = await reader.readuntil(b"\r\n\r\n")
                text = head.decode("latin-1")
                line, low = text.split("\r\n", 1)[0], text.lower()
                length = int(m.group(1)) if (m := re.search(r"content-length:\s*(\d+)", low)) else 0
                if self.match(line):
                    self.matched.append(line)
                    if self.left > 0:
                        self.left -= 1
                        self.spoiled.append(line)
                        if self.mode == "short":  # relayed, but its response stops after 1 MiB
                            sent[1] = sent[0] + (1 << 20)
                        else:
                            await self._spoil(head, low, length, reader, writer, up_w)
                            return
                up_w.write(head)
                await self._relay(reader, up_w, length)
        except (asyncio.IncompleteReadError, OSError):
            pass
        finally:
            up_w.transport.abort()
            writer.transport.abort()

    @staticmethod
    async def _relay(reader: asyncio.StreamReader, dst: asyncio.StreamWriter, n: int) -> None:
        while n > 0:
            data = await reader.read(min(n, 1 << 16))
            if not data:
                raise asyncio.IncompleteReadError(b"", n)
            dst.write(data)
            await dst.drain()
            n -= len(data)

    async def _spoil(
        self,
        head: bytes,
        low: str,
        length: int,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up_w: asyncio.StreamWriter,
    ) -> None:
        if self.mode == "cut":  # moto sees half a request; the client a reset mid-body
            up_w.write(head)
            await self._relay(reader, up_w, length // 2)
            return
        status, reason, code, message = ANSWERS[self.mode]
        if "expect: 100-continue" in low:
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        await reader.readexactly(length)
        body = f"<?xml version='1.0'?><Error><Code>{code}</Code><Message>{message}</Message></Error>"
        payload = b"" if low.startswith("head ") else body.encode()
        writer.write(
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\nConnection: close\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        await writer.drain()


def checkpointer(options: dict[str, object]) -> AsyncCheckpointer:
    return AsyncCheckpointer(
        chunk_size=CHUNK,
        num_buffers=4,
        max_in_flight=4,
        backend="aiobotocore",
        backend_options=options,
        seed=7,
    )


async def stored(server: S3Endpoint, bucket: str, key: str) -> bytes:
    def get() -> bytes:
        body: bytes = server.client().get_object(Bucket=bucket, Key=key)["Body"].read()
        return body

    return await asyncio.to_thread(get)


async def uploads(server: S3Endpoint, bucket: str) -> list[str]:
    listing = await asyncio.to_thread(server.client().list_multipart_uploads, Bucket=bucket)
    return [u["Key"] for u in listing.get("Uploads", [])]


@pytest.mark.parametrize(
    ("mode", "match", "times"),
    [("cut", is_part_2, 2), ("busy", is_part, 1), ("busy", is_create, 1)],
    ids=["part-reset-mid-body-twice", "part-503-slowdown", "create-503-slowdown"],
)
async def test_a_transient_fault_on_the_only_endpoint_is_retried(
    moto_endpoint: S3Endpoint, mode: str, match: Callable[[str], bool], times: int
) -> None:
    """aiohttp itself resends an idempotent PUT once after a reset, silently; a second reset of
    the same part (or any 5xx) reaches the sink, which resends the same memoryview (botocore's
    own retry could not rewind it: UnseekableStreamError before this fix)."""
    bucket, size = await asyncio.to_thread(new_bucket, moto_endpoint), 3 * CHUNK + 1  # 4 parts
    front = FaultyFront(moto_endpoint.endpoint, mode, match, times)
    url = await front.start()
    try:
        async with checkpointer(moto_endpoint.options(endpoint_url=url)) as ckpt:
            saved = await ckpt.save(f"s3://{bucket}/r.bin", size)
            loaded = await ckpt.load(f"s3://{bucket}/r.bin", verify=True)
    finally:
        await front.stop()
    assert len(front.spoiled) == times, front.matched
    assert await stored(moto_endpoint, bucket, "r.bin") == expected_bytes(size, CHUNK, 7)
    assert saved.metadata.extra["retries"] >= 1
    assert loaded.metadata.extra["retries"] == 0
    assert "identity_note" not in loaded.metadata.extra
    assert await uploads(moto_endpoint, bucket) == []


@pytest.mark.parametrize("mode", ["busy", "short"], ids=["503-slowdown", "response-cut-mid-body"])
async def test_a_failed_range_read_is_retried(moto_endpoint: S3Endpoint, mode: str) -> None:
    bucket, size = await asyncio.to_thread(new_bucket, moto_endpoint), 2 * CHUNK + 5
    front = FaultyFront(moto_endpoint.endpoint, mode, lambda line: line.startswith(f"GET /{bucket}/g.bin "))
    url = await front.start()
    try:
        async with checkpointer(moto_endpoint.options(endpoint_url=url)) as ckpt:
            await ckpt.save(f"s3://{bucket}/g.bin", size)
            into = bytearray(size)
            loaded = await ckpt.load(f"s3://{bucket}/g.bin", verify=True, into=into)
    finally:
        await front.stop()
    assert len(front.spoiled) == 1  # the manifest's GET (another object) passed
    assert bytes(into) == expected_bytes(size, CHUNK, 7)
    assert loaded.metadata.extra["retries"] >= 1


async def test_a_persistent_slowdown_gives_up_after_max_attempts(moto_endpoint: S3Endpoint) -> None:
    bucket = await asyncio.to_thread(new_bucket, moto_endpoint)
    front = FaultyFront(moto_endpoint.endpoint, "busy", is_part, times=10**6)
    url = await front.start()
    try:
        async with checkpointer(moto_endpoint.options(endpoint_url=url, max_attempts=2)) as ckpt:
            with pytest.raises(StorageError, match=r"upload part \d+ of s3://.*SlowDown") as info:
                await ckpt.save(f"s3://{bucket}/p.bin", 2 * CHUNK + 1)
    finally:
        await front.stop()
    numbers = [_part_number(line) for line in front.matched]
    assert max(numbers.count(n) for n in set(numbers)) == 2, numbers  # tried twice, then gave up
    assert moto_endpoint.secret_key not in f"{info.value!s} {info.value!r}"
    assert await uploads(moto_endpoint, bucket) == []


async def test_access_denied_is_never_retried(moto_endpoint: S3Endpoint) -> None:
    bucket = await asyncio.to_thread(new_bucket, moto_endpoint)
    front = FaultyFront(moto_endpoint.endpoint, "deny", is_part, times=10**6)
    url = await front.start()
    try:
        async with checkpointer(moto_endpoint.options(endpoint_url=url, max_attempts=5)) as ckpt:
            with pytest.raises(StoragePermissionError, match="AccessDenied"):
                await ckpt.save(f"s3://{bucket}/d.bin", 2 * CHUNK + 1)
    finally:
        await front.stop()
    numbers = [_part_number(line) for line in front.matched]
    assert numbers and len(numbers) == len(set(numbers)), numbers  # each part tried once


def _part_number(line: str) -> int:
    m = _PART.match(line)
    assert m is not None, line
    return int(m.group(1))

"""Multi-endpoint configuration and routing, against real moto S3 endpoints sharing one store."""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from asyncckpt.errors import ConfigError
from asyncckpt.sinks.s3.endpoints import (
    EndpointRouter,
    endpoints_from_env,
    expand_template,
    is_failover_error,
    rank_endpoint,
    validate_endpoint,
)

from . import moto_multi

MiB = 1 << 20


# -- configuration ------------------------------------------------------------------------
def test_template_expands_ranges_and_keeps_padding() -> None:
    assert expand_template("http://10.0.0.{1...3}:9000") == [f"http://10.0.0.{i}:9000" for i in (1, 2, 3)]
    assert expand_template("http://n{08...10}.x:{1...2}") == [
        "http://n08.x:1",
        "http://n08.x:2",
        "http://n09.x:1",
        "http://n09.x:2",
        "http://n10.x:1",
        "http://n10.x:2",
    ]


@pytest.mark.parametrize("bad", ["http://10.0.0.{1..8}:9000", "http://10.0.0.{8...1}:9000", "http://{a...b}"])
def test_bad_template_names_the_value(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"S3_ENDPOINT_TEMPLATE .*" + bad[:10].replace(".", r"\.")):
        endpoints_from_env(env={"S3_ENDPOINT_TEMPLATE": bad})


@pytest.mark.parametrize(
    "bad", ["10.0.0.1:9000", "ftp://x:21", "http://:9000", "http://h:99999", "http://h:0"]
)
def test_bad_url_names_the_value(bad: str) -> None:
    with pytest.raises(ConfigError, match=f"endpoint {bad!r} from S3_ENDPOINT_URIS".replace("?", r"\?")):
        endpoints_from_env(env={"S3_ENDPOINT_URIS": f"http://ok:1,{bad}"})


def test_sources_in_precedence_order(tmp_path: Path) -> None:
    f = tmp_path / "eps.txt"
    f.write_text("# storage front ends\nhttp://f1:9000  # rack 1\n\nhttp://f2:9000/\n")
    env = {
        "S3_ENDPOINT_URIS": "http://u1:9000, http://u2:9000",
        "S3_ENDPOINT_TEMPLATE": "http://t{1...2}:9000",
        "S3_ENDPOINT_FILE": str(f),
        "AWS_ENDPOINT_URL": "http://aws:9000",
    }
    assert endpoints_from_env(["http://arg:1"], env) == (["http://arg:1"], "argument")
    assert endpoints_from_env(None, env) == (["http://u1:9000", "http://u2:9000"], "S3_ENDPOINT_URIS")
    del env["S3_ENDPOINT_URIS"]
    assert endpoints_from_env(None, env)[1] == "S3_ENDPOINT_TEMPLATE"
    del env["S3_ENDPOINT_TEMPLATE"]
    assert endpoints_from_env(None, env) == (["http://f1:9000", "http://f2:9000"], "S3_ENDPOINT_FILE")
    del env["S3_ENDPOINT_FILE"]
    assert endpoints_from_env(None, env) == (["http://aws:9000"], "AWS_ENDPOINT_URL")
    assert endpoints_from_env(None, {}) == ([], "none")


def test_missing_endpoint_file_and_strategy_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"S3_ENDPOINT_FILE .*nope"):
        endpoints_from_env(env={"S3_ENDPOINT_FILE": str(tmp_path / "nope")})
    with pytest.raises(ConfigError, match="'fastest' is not one of"):
        EndpointRouter.from_env(env={"AWS_ENDPOINT_URL": "http://a:1", "S3_LOAD_BALANCE_STRATEGY": "fastest"})
    with pytest.raises(ConfigError, match="no S3 endpoints"):
        EndpointRouter.from_env(env={})


def test_rank_strategy_pins_rank_modulo_n() -> None:
    urls = [f"http://e{i}:9000" for i in range(3)]
    for rank in range(7):
        env = {"S3_ENDPOINT_URIS": ",".join(urls), "S3_LOAD_BALANCE_STRATEGY": "rank"}
        env["OMPI_COMM_WORLD_RANK"], env["OMPI_COMM_WORLD_SIZE"] = str(rank), "7"
        router = EndpointRouter.from_env(env=env)
        assert {router.pick() for _ in range(5)} == {urls[rank % 3]}


def test_failover_errors_are_recognised_through_causes() -> None:
    try:
        try:
            raise ConnectionRefusedError(111, "refused")
        except OSError as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError as exc:
        assert is_failover_error(exc)
    assert not is_failover_error(ValueError("bad part"))
    assert validate_endpoint("https://s3.example:443/") == "https://s3.example:443"


# -- real endpoints ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def moto_endpoints() -> Iterator[list[str]]:
    """Three moto endpoints sharing one store, in a child process."""
    with moto_multi.started(3) as urls:
        yield urls


class Proxy:
    """A TCP proxy on 127.0.0.1 in front of one endpoint: can delay responses, or stop dead."""

    def __init__(self, upstream: str, delay_s: float = 0.0) -> None:
        host, port = upstream.removeprefix("http://").split(":")
        self.upstream = (host, int(port))
        self.delay_s = delay_s
        self.received = 0
        self.got_request = asyncio.Event()
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _pump(
        self, r: asyncio.StreamReader, w: asyncio.StreamWriter, delay: float, count: bool
    ) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await r.read(1 << 16):
                if count:
                    self.received += len(data)
                    if self.received > MiB:
                        self.got_request.set()
                if delay:
                    await asyncio.sleep(delay)  # the slow device being simulated
                w.write(data)
                await w.drain()
        w.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection(*self.upstream)
        self._writers |= {writer, up_w}
        await asyncio.gather(self._pump(reader, up_w, 0, True), self._pump(up_r, writer, self.delay_s, False))

    async def stop(self) -> None:
        """An outage: stop listening (connections refused) and cut every open connection."""
        self.server.close()
        for w in self._writers:
            w.transport.abort()
        await self.server.wait_closed()


@pytest.fixture(scope="module")
def session() -> Any:
    """One aiobotocore session with the S3 model loaded up front (a synchronous JSON load that
    would otherwise stall the event loop inside the first test)."""
    from aiobotocore.session import get_session

    s = get_session()
    asyncio.run(s.get_service_model("s3"))
    return s


@pytest.fixture(scope="module")
def payload() -> bytes:
    return os.urandom(26 * MiB)


def _parts(payload: bytes, sizes: list[int]) -> list[bytes]:
    out, at = [], 0
    for n in sizes:
        out.append(payload[at : at + n])
        at += n
    return out


@contextlib.asynccontextmanager
async def s3_clients(session: Any, urls: list[str]) -> AsyncIterator[dict[str, Any]]:
    from botocore.config import Config

    cfg = Config(
        retries={"max_attempts": 1, "mode": "standard"},  # failover is the router's job here
        connect_timeout=2,
        read_timeout=10,
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    creds = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing", "region_name": "us-east-1"}
    async with contextlib.AsyncExitStack() as stack:
        clients = {}
        for url in urls:
            clients[url] = await stack.enter_async_context(
                session.create_client("s3", endpoint_url=url, config=cfg, **creds)
            )
        yield clients


async def _multipart(
    router: EndpointRouter, clients: dict[str, Any], parts: list[bytes], complete_via: str
) -> tuple[str, str]:
    """Create on the first endpoint, upload parts through the router, complete via another."""
    first, last = next(iter(clients.values())), clients[complete_via]
    bucket, key = f"b-{uuid.uuid4().hex[:12]}", "ckpt/rank00000.bin"
    await first.create_bucket(Bucket=bucket)
    upload_id = (await first.create_multipart_upload(Bucket=bucket, Key=key))["UploadId"]

    async def put(n: int, body: bytes) -> dict[str, Any]:
        async def send(ep: str) -> dict[str, Any]:
            r = await clients[ep].upload_part(
                Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=n, Body=body
            )
            return {"PartNumber": n, "ETag": r["ETag"]}

        return await router.call(send, nbytes=len(body))

    done = await asyncio.gather(*(put(i + 1, b) for i, b in enumerate(parts)))
    await last.complete_multipart_upload(
        Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": list(done)}
    )
    return bucket, key


async def _read(client: Any, bucket: str, key: str) -> bytes:
    resp = await client.get_object(Bucket=bucket, Key=key)
    async with resp["Body"] as body:
        data: bytes = await body.read()
    return data


async def test_round_robin_spreads_parts_of_one_upload(
    moto_endpoints: list[str], session: Any, payload: bytes
) -> None:
    parts = _parts(payload, [5 * MiB, 5 * MiB, 5 * MiB, MiB])
    router = EndpointRouter(moto_endpoints, "round_robin")
    async with s3_clients(session, moto_endpoints) as clients:
        bucket, key = await _multipart(router, clients, parts, moto_endpoints[2])
        assert await _read(clients[moto_endpoints[1]], bucket, key) == b"".join(parts)
    stats = {e["endpoint"]: e for e in router.stats()["endpoints"]}
    assert [stats[u]["parts"] for u in moto_endpoints] == [2, 1, 1]
    assert sum(s["bytes"] for s in stats.values()) == 16 * MiB
    assert all(s["latency_p50_s"] > 0 and s["errors"] == 0 for s in stats.values())


async def _burst(router: EndpointRouter, clients: dict[str, Any], n: int, concurrency: int) -> None:
    bucket = f"b-{uuid.uuid4().hex[:12]}"
    await next(iter(clients.values())).create_bucket(Bucket=bucket)
    gate = asyncio.Semaphore(concurrency)
    body = bytes(range(256)) * 256

    async def one(i: int) -> None:
        async with gate:
            await router.call(
                lambda ep: clients[ep].put_object(Bucket=bucket, Key=f"o{i}", Body=body), len(body)
            )

    await asyncio.gather(*(one(i) for i in range(n)))


async def test_least_connections_avoids_a_slow_endpoint(moto_endpoints: list[str], session: Any) -> None:
    slow, fast = Proxy(moto_endpoints[0], delay_s=0.15), Proxy(moto_endpoints[1])
    urls = [await slow.start(), await fast.start()]
    try:
        async with s3_clients(session, urls) as clients:
            got = {}
            for strategy in ("round_robin", "least_connections"):  # baseline, then the strategy
                router = EndpointRouter(urls, strategy)
                await _burst(router, clients, 16, 4)
                got[strategy] = [e["parts"] for e in router.stats()["endpoints"]]
    finally:
        await slow.stop()
        await fast.stop()
    assert got["round_robin"] == [8, 8]
    slow_parts, fast_parts = got["least_connections"]
    assert slow_parts + fast_parts == 16
    assert fast_parts >= 2 * slow_parts, got


async def test_failover_when_an_endpoint_stops_mid_upload(
    moto_endpoints: list[str], session: Any, payload: bytes
) -> None:
    a, b = Proxy(moto_endpoints[0]), Proxy(moto_endpoints[2])
    urls = [await a.start(), await b.start()]
    parts = _parts(payload, [5 * MiB] * 4 + [MiB])
    router = EndpointRouter(urls, "round_robin", down_for_s=60)
    try:
        async with s3_clients(session, urls) as clients:

            async def outage() -> None:
                await b.got_request.wait()  # a part is on its way through b: now b dies
                await b.stop()

            stopper = asyncio.create_task(outage())
            bucket, key = await _multipart(router, clients, parts, urls[0])
            await stopper
            assert await _read(clients[urls[0]], bucket, key) == b"".join(parts)
    finally:
        await a.stop()
        await b.stop()
    stats = router.stats()
    ea, eb = stats["endpoints"]
    assert eb["errors"] >= 1 and eb["marked_down"] >= 1
    assert stats["retries"] == ea["retries"] >= 1
    assert ea["parts"] + eb["parts"] == len(parts)


def test_rank_endpoint_only_with_rank_strategy() -> None:
    env = {"S3_ENDPOINT_TEMPLATE": "http://10.0.0.{1...3}:9000", "S3_LOAD_BALANCE_STRATEGY": "rank"}
    assert [rank_endpoint(r, env) for r in range(4)] == [
        "http://10.0.0.1:9000",
        "http://10.0.0.2:9000",
        "http://10.0.0.3:9000",
        "http://10.0.0.1:9000",
    ]
    assert rank_endpoint(1, {**env, "S3_LOAD_BALANCE_STRATEGY": "round_robin"}) is None
    assert rank_endpoint(1, {"S3_LOAD_BALANCE_STRATEGY": "rank"}) is None
    with pytest.raises(ConfigError, match="S3_LOAD_BALANCE_STRATEGY='random'"):
        rank_endpoint(0, {**env, "S3_LOAD_BALANCE_STRATEGY": "random"})

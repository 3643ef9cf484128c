"""Multi-endpoint saves and loads through the public API, against moto front ends of one store.

Three ThreadedMotoServer instances share one in-memory store in a child process
(``tests.moto_multi``), so a part uploaded through one endpoint completes through another,
as with the front ends of a real object store.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from botocore.config import Config

from asyncckpt import AsyncCheckpointer, ConfigError, SaveResult
from asyncckpt.bench.cli import build_parser, plan_from_args
from asyncckpt.engine.seal import tail_read_size
from asyncckpt.sinks.s3 import installed

from .conftest import checkpoint_data, generated
from .test_endpoints import Proxy, moto_endpoints  # noqa: F401 - the module-scoped fixture

# moto_endpoints accepts any credentials; the secret is distinctive so leaks are detectable
ACCESS_KEY = "testing-access-key"
SECRET_KEY = "test-secret-Zq8vW3kP"
REGION = "us-east-1"

MiB = 1 << 20
CHUNK = 5 * MiB


@pytest.fixture(scope="module")
def boto(moto_endpoints: list[str]) -> Any:  # noqa: F811
    """An independent client on the first endpoint, for buckets and for checking bytes."""
    return boto3.client(
        "s3",
        endpoint_url=moto_endpoints[0],
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        region_name=REGION,
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
    )


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    for name in (
        "S3_ENDPOINT_URIS",
        "S3_ENDPOINT_TEMPLATE",
        "S3_ENDPOINT_FILE",
        "S3_LOAD_BALANCE_STRATEGY",
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_S3",
    ):
        monkeypatch.delenv(name, raising=False)
    yield monkeypatch


async def new_bucket(boto: Any) -> str:
    name = f"r-{uuid.uuid4().hex[:16]}"
    await asyncio.to_thread(boto.create_bucket, Bucket=name)
    return name


async def stored(boto: Any, bucket: str, key: str) -> bytes:
    def get() -> bytes:
        body: bytes = boto.get_object(Bucket=bucket, Key=key)["Body"].read()
        return body

    return await asyncio.to_thread(get)


def options(**extra: Any) -> dict[str, Any]:
    return {
        "access_key_id": ACCESS_KEY,
        "secret_access_key": SECRET_KEY,
        "region": REGION,
        "dotenv": False,
        **extra,
    }


def ckpt(backend: str, opts: dict[str, Any], **kw: Any) -> AsyncCheckpointer:
    return AsyncCheckpointer(
        chunk_size=CHUNK, num_buffers=4, max_in_flight=4, backend=backend, backend_options=opts, **kw
    )


def footer_read(raw: bytes) -> int:
    """What a load of ``raw`` reads before the data: the tail holding the sealed manifest."""
    return tail_read_size(len(raw))


def per_endpoint(extra: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["endpoint"]: e for e in extra["endpoints"]}


async def test_round_robin_save_and_load_spread_over_three_endpoints(
    moto_endpoints: list[str],  # noqa: F811
    boto: Any,
    clean_env: pytest.MonkeyPatch,
) -> None:
    bucket, size = await new_bucket(boto), 6 * CHUNK + 99  # 7 parts
    async with ckpt("aiobotocore", options(endpoints=moto_endpoints, lb_strategy="round_robin"), seed=3) as c:
        saved = await c.save(f"s3://{bucket}/ckpt.bin", size)
        loaded = await c.load(f"s3://{bucket}/ckpt.bin", verify=True)
    raw = await stored(boto, bucket, "ckpt.bin")
    assert checkpoint_data(raw) == await generated(size, CHUNK, 3)
    # the save sends data and sealed manifest in 7 parts; the load reads the footer, then data
    for result, count, nbytes in ((saved, 7, len(raw)), (loaded, loaded.chunks + 1, size + footer_read(raw))):
        x = result.metadata.extra
        assert x["endpoint_strategy"] == "round_robin" and x["endpoints_configured"] == 3
        stats = per_endpoint(x)
        assert list(stats) == moto_endpoints
        assert all(s["parts"] >= 1 and s["latency_p99_s"] >= s["latency_p50_s"] > 0 for s in stats.values())
        assert sum(s["parts"] for s in stats.values()) == count
        assert sum(s["bytes"] for s in stats.values()) == nbytes
        assert x["endpoint_retries"] == 0 and all(s["errors"] == 0 for s in stats.values())
    assert [per_endpoint(saved.metadata.extra)[u]["parts"] for u in moto_endpoints] == [3, 2, 2]
    assert "identity_note" not in loaded.metadata.extra  # HEAD recorded the ETag the save published
    text = str(saved)
    assert "strategy round_robin" in text and all(u in text for u in moto_endpoints)
    assert "strategy round_robin" in str(loaded)


async def test_least_connections_sends_fewer_parts_to_a_slow_endpoint(
    moto_endpoints: list[str],  # noqa: F811
    boto: Any,
    clean_env: pytest.MonkeyPatch,
) -> None:
    slow, fast = Proxy(moto_endpoints[0], delay_s=1.0), Proxy(moto_endpoints[1])
    urls = [await slow.start(), await fast.start()]
    bucket, size = await new_bucket(boto), 8 * CHUNK
    try:
        async with ckpt("aiobotocore", options(endpoints=urls, lb_strategy="least_connections"), seed=4) as c:
            result = await c.save(f"s3://{bucket}/lc.bin", size)
    finally:
        await slow.stop()
        await fast.stop()
    assert checkpoint_data(await stored(boto, bucket, "lc.bin")) == await generated(size, CHUNK, 4)
    stats = per_endpoint(result.metadata.extra)
    slow_parts, fast_parts = stats[urls[0]]["parts"], stats[urls[1]]["parts"]
    assert slow_parts + fast_parts == 9  # 8 full chunks, then the sealed manifest
    assert slow_parts < 4 < fast_parts, stats  # round robin would give 4 and 4
    assert stats[urls[0]]["latency_p50_s"] > stats[urls[1]]["latency_p50_s"]


async def test_failover_when_an_endpoint_is_cut_mid_upload(
    moto_endpoints: list[str],  # noqa: F811
    boto: Any,
    clean_env: pytest.MonkeyPatch,
) -> None:
    proxies = [Proxy(u) for u in moto_endpoints]
    urls = [await p.start() for p in proxies]
    victim = proxies[1]
    bucket, size = await new_bucket(boto), 6 * CHUNK + 7

    async def outage() -> None:
        await victim.got_request.wait()  # a part is streaming through it: cut it now
        await victim.stop()

    cutter = asyncio.create_task(outage())
    try:
        opts = options(endpoints=urls, lb_strategy="round_robin")
        async with ckpt("aiobotocore", opts, seed=5) as c:
            result = await c.save(f"s3://{bucket}/fo.bin", size)
            await cutter
            loaded = await c.load(f"s3://{bucket}/fo.bin", verify=True)  # around the dead one
    finally:
        cutter.cancel()
        for p in proxies:
            await p.stop()
    raw = await stored(boto, bucket, "fo.bin")
    assert checkpoint_data(raw) == await generated(size, CHUNK, 5)
    x = result.metadata.extra
    stats = per_endpoint(x)
    assert stats[urls[1]]["errors"] >= 1 and stats[urls[1]]["marked_down"] >= 1, stats
    assert x["endpoint_retries"] >= 1
    assert sum(s["parts"] for s in stats.values()) == 7
    assert sum(s["bytes"] for s in stats.values()) == len(raw)
    assert per_endpoint(loaded.metadata.extra)[urls[1]]["parts"] == 0  # marked down, skipped
    assert "retried elsewhere" in str(result)


@dataclass
class FromEnv:
    """The multi-endpoint moto, an independent client, and the environment the sinks read."""

    endpoints: list[str]
    boto: Any
    env: pytest.MonkeyPatch


@pytest.fixture
def from_env(
    moto_endpoints: list[str],  # noqa: F811
    boto: Any,
    clean_env: pytest.MonkeyPatch,
) -> FromEnv:
    return FromEnv(moto_endpoints, boto, clean_env)


async def saved_with_endpoints(backend: str, e: FromEnv, seed: int, chunks: int) -> tuple[SaveResult, str]:
    """(the result, its bucket) of a save of ``chunks`` chunks through ``backend`` with
    ``S3_ENDPOINT_URIS`` naming the endpoints (the other variables as ``e.env`` holds them);
    its stored data checked."""
    e.env.setenv("S3_ENDPOINT_URIS", ",".join(e.endpoints))
    boto = e.boto
    bucket, size, name = await new_bucket(boto), chunks * CHUNK, f"{backend}.bin"
    async with ckpt(backend, options(), seed=seed) as c:
        result = await c.save(f"s3://{bucket}/{name}", size)
    assert checkpoint_data(await stored(boto, bucket, name)) == await generated(size, CHUNK, seed)
    return result, bucket


async def test_endpoint_uris_from_the_environment_reach_the_sink(from_env: FromEnv) -> None:
    from_env.env.setenv("S3_LOAD_BALANCE_STRATEGY", "least_connections")
    result, _ = await saved_with_endpoints("aiobotocore", from_env, seed=6, chunks=3)
    urls = from_env.endpoints
    x = result.metadata.extra
    assert x["endpoint_strategy"] == "least_connections"
    assert list(per_endpoint(x)) == urls
    assert x["settings_from"]["endpoints"] == "environment S3_ENDPOINT_URIS"
    assert SECRET_KEY not in repr(result.to_dict()) and SECRET_KEY not in str(result)


async def test_invalid_template_fails_before_any_io(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("S3_ENDPOINT_TEMPLATE", "http://10.0.0.{1..8}:9000")  # no server exists at all
    async with ckpt("aiobotocore", options()) as c:
        with pytest.raises(ConfigError, match=r"S3_ENDPOINT_TEMPLATE 'http://10\.0\.0\.\{1\.\.8\}:9000'"):
            await c.save("s3://bucket/never.bin", CHUNK)


@pytest.mark.skipif(not installed("minio"), reason="minio is not installed (extra [minio])")
async def test_minio_pins_one_endpoint_per_rank_and_refuses_per_part_strategies(from_env: FromEnv) -> None:
    clean_env, boto, urls = from_env.env, from_env.boto, from_env.endpoints
    clean_env.setenv("OMPI_COMM_WORLD_RANK", "4")
    clean_env.setenv("OMPI_COMM_WORLD_SIZE", "5")
    result, bucket = await saved_with_endpoints("minio", from_env, seed=7, chunks=2)
    x = result.metadata.extra
    assert x["endpoint_url"] == urls[4 % 3]
    assert x["endpoint_strategy"] == "rank (per-request balancing not supported by minio)"
    assert "endpoints" not in x and "rank (per-request" in str(result)
    clean_env.setenv("S3_LOAD_BALANCE_STRATEGY", "round_robin")
    async with ckpt("minio", options()) as c:
        with pytest.raises(ConfigError, match=r"'minio' cannot send each part .*'round_robin'.*S3_LOAD_BAL"):
            await c.save(f"s3://{bucket}/never.bin", CHUNK)
    assert "Contents" not in await asyncio.to_thread(boto.list_objects_v2, Bucket=bucket, Prefix="never")


def test_bench_flags_map_to_backend_options() -> None:
    args = build_parser().parse_args(
        ["s3://b/k", "--size", "10MiB", "--endpoints", "http://a:1,http://b:2", "--lb-strategy", "rank"]
    )
    opts = plan_from_args(args).config.backend_options
    assert opts["endpoints"] == "http://a:1,http://b:2" and opts["lb_strategy"] == "rank"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["s3://b/k", "--lb-strategy", "fastest"])


def test_settings_precedence_for_endpoints(tmp_path: Any) -> None:
    from asyncckpt.sinks.s3.config import S3Settings

    f = tmp_path / "eps"
    f.write_text("http://f1:9000\nhttp://f2:9000\n")
    env = {"S3_ENDPOINT_FILE": str(f), "AWS_ENDPOINT_URL": "http://aws:9000"}
    s = S3Settings.resolve({"dotenv": False}, env)
    assert s.endpoints == ("http://f1:9000", "http://f2:9000") and s.endpoint_url == "http://f1:9000"
    assert s.path_style and s.lb_strategy == "round_robin" and not s.lb_strategy_explicit
    one = S3Settings.resolve({"dotenv": False, "endpoint_url": "http://one:1"}, env)  # explicit wins
    assert one.endpoints == () and one.endpoint_url == "http://one:1"
    opt = S3Settings.resolve(
        {"dotenv": False, "endpoints": "http://a:1,http://b:1", "lb_strategy": "rank"}, env
    )
    assert opt.endpoints == ("http://a:1", "http://b:1") and opt.lb_strategy_explicit
    assert opt.sources["endpoints"] == "backend_options"
    with pytest.raises(ConfigError, match="lb_strategy='fastest'"):
        S3Settings.resolve({"dotenv": False, "lb_strategy": "fastest"}, env)
    with pytest.raises(ConfigError, match=r"endpoint 'ftp://x:1' from argument"):
        S3Settings.resolve({"dotenv": False, "endpoints": ["http://a:1", "ftp://x:1"]}, env)


class Busy:
    """An HTTP endpoint on 127.0.0.1 that reads each request whole and answers 503 SlowDown."""

    BODY = b"<?xml version='1.0'?><Error><Code>SlowDown</Code><Message>Reduce your rate</Message></Error>"

    def __init__(self) -> None:
        self.requests = 0

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
            if "expect: 100-continue" in head:
                writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            length = next(
                (int(h.split(":")[1]) for h in head.split("\r\n") if h.startswith("content-length:")), 0
            )
            await reader.readexactly(length)
            self.requests += 1
            body = b"" if head.startswith("head ") else self.BODY  # HEAD: headers only
            writer.write(
                b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nConnection: close\r\n"
                + f"Content-Length: {len(self.BODY)}\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def stop(self) -> None:
        self.server.close()
        await self.server.wait_closed()


async def test_a_busy_endpoint_is_retried_elsewhere_but_not_marked_down(
    moto_endpoints: list[str],  # noqa: F811
    boto: Any,
    clean_env: pytest.MonkeyPatch,
) -> None:
    busy = Busy()
    urls = [await busy.start(), *moto_endpoints[:2]]  # the busy one also gets create/complete first
    bucket, size = await new_bucket(boto), 4 * CHUNK + 1
    try:
        async with ckpt("aiobotocore", options(endpoints=urls), seed=8) as c:
            saved = await c.save(f"s3://{bucket}/busy.bin", size)
            loaded = await c.load(f"s3://{bucket}/busy.bin", verify=True)
    finally:
        await busy.stop()
    raw = await stored(boto, bucket, "busy.bin")
    assert checkpoint_data(raw) == await generated(size, CHUNK, 8)
    for result, nbytes in ((saved, len(raw)), (loaded, size + footer_read(raw))):
        x = result.metadata.extra
        b = per_endpoint(x)[urls[0]]
        assert b["parts"] == 0 and b["errors"] >= 1 and b["marked_down"] == 0, x["endpoints"]
        assert x["endpoint_retries"] == b["errors"] >= 1
        assert sum(e["bytes"] for e in x["endpoints"]) == nbytes
    assert busy.requests >= 4  # create + at least one part on save, HEAD + a range GET on load

"""S3 save/load throughput on a real object store (local OpenStack Swift), library by library.

Every row writes the same ``--size`` as a multipart upload of ``--part-size`` parts with
``--in-flight`` parts in flight, then reads it back with Range GETs of ``--part-size``,
``--in-flight`` at a time. The libraries used directly (aiobotocore, boto3, s3dlio, minio,
s3torchconnectorclient; whichever are installed) are the baseline; asyncckpt's S3 backends
(names from ``asyncckpt.sinks.BACKENDS``) are measured in the same run and
compared with their library's row. Client and server share this machine's cores: the server
limits every number here (Swift ≈ 0.3–0.5 GB/s on 2 cores), so compare ratios, not absolutes.

    python benchmarks/bench_swift.py --size 1GiB --part-size 32MiB --in-flight 4 --repeat 3
    python benchmarks/bench_swift.py --endpoint http://127.0.0.1:8080 ...   # a running server
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asyncckpt.servers.embedded import endpoint_environment
from asyncckpt.servers.embedded_swift import ACCESS_KEY, QUIRKS, REGION, SECRET_KEY, SwiftServer
from asyncckpt.servers.s3compat import FAST_CLIENT_CONFIG
from asyncckpt.servers.s3endpoint import S3Endpoint
from asyncckpt.units import parse_size


class Job:
    """One object: bucket/key, size, part layout, and the part-sized source buffer."""

    def __init__(self, ep: S3Endpoint, bucket: str, key: str, size: int, part: int, inflight: int) -> None:
        self.ep, self.bucket, self.key, self.size, self.part, self.inflight = (
            ep,
            bucket,
            key,
            size,
            part,
            inflight,
        )
        self.ranges = [(off, min(part, size - off)) for off in range(0, size, part)]
        self.src = make_source(part)

    def check(self, first: bytes, total: int) -> None:
        if total != self.size or first != self.src[: len(first)]:
            raise RuntimeError(f"read back {total} bytes (want {self.size}) or wrong content")


def make_source(n: int) -> bytes:
    try:
        import dgen_py

        buf = bytearray(n)
        dgen_py.Generator(size=n, seed=1).fill_chunk(buf)
        return bytes(buf)
    except ImportError:
        return os.urandom(n)


# --- aiobotocore (create / upload_part window / complete; Range GETs) ---


def aiobotocore_client(job: Job, fast: bool) -> Any:
    from aiobotocore.session import get_session
    from botocore.config import Config

    cfg = Config(**FAST_CLIENT_CONFIG) if fast else Config(s3={"addressing_style": "path"})
    return get_session().create_client("s3", config=cfg, **job.ep.client_kwargs())


async def _aio_save(job: Job, fast: bool) -> float:
    async with aiobotocore_client(job, fast) as c:
        t0 = time.perf_counter()
        uid = (await c.create_multipart_upload(Bucket=job.bucket, Key=job.key))["UploadId"]
        sem = asyncio.Semaphore(job.inflight)

        async def part(n: int, length: int) -> dict[str, Any]:
            async with sem:
                body = job.src[:length]
                r = await c.upload_part(Bucket=job.bucket, Key=job.key, UploadId=uid, PartNumber=n, Body=body)
                return {"PartNumber": n, "ETag": r["ETag"]}

        try:
            parts = await asyncio.gather(*(part(i + 1, ln) for i, (_, ln) in enumerate(job.ranges)))
            await c.complete_multipart_upload(
                Bucket=job.bucket, Key=job.key, UploadId=uid, MultipartUpload={"Parts": list(parts)}
            )
        except BaseException:
            await c.abort_multipart_upload(Bucket=job.bucket, Key=job.key, UploadId=uid)
            raise
        return time.perf_counter() - t0


async def _aio_load(job: Job, fast: bool) -> float:
    async with aiobotocore_client(job, fast) as c:
        t0 = time.perf_counter()
        sem = asyncio.Semaphore(job.inflight)

        async def get(off: int, length: int) -> bytes:
            async with sem:
                r = await c.get_object(
                    Bucket=job.bucket, Key=job.key, Range=f"bytes={off}-{off + length - 1}"
                )
                async with r["Body"] as body:
                    data: bytes = await body.read()
                    return data

        chunks = await asyncio.gather(*(get(off, ln) for off, ln in job.ranges))
        elapsed = time.perf_counter() - t0
        job.check(chunks[0][:64], sum(map(len, chunks)))
        return elapsed


# --- thread-pool clients: boto3, s3dlio, minio, s3torchconnectorclient ---


def _threaded_load(job: Job, get: Callable[[int, int], Any]) -> float:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(job.inflight) as pool:
        chunks = list(pool.map(lambda r: get(*r), job.ranges))
    elapsed = time.perf_counter() - t0
    job.check(bytes(memoryview(chunks[0])[:64]), sum(memoryview(c).nbytes for c in chunks))
    return elapsed


def boto3_client(job: Job) -> Any:
    import boto3  # type: ignore[import-untyped]
    from botocore.config import Config

    cfg = Config(s3={"addressing_style": "path"}, max_pool_connections=max(10, job.inflight))
    return boto3.client("s3", config=cfg, **job.ep.client_kwargs())


def boto3_save(job: Job) -> float:
    c = boto3_client(job)
    t0 = time.perf_counter()
    uid = c.create_multipart_upload(Bucket=job.bucket, Key=job.key)["UploadId"]

    def part(n: int, length: int) -> dict[str, Any]:
        r = c.upload_part(Bucket=job.bucket, Key=job.key, UploadId=uid, PartNumber=n, Body=job.src[:length])
        return {"PartNumber": n, "ETag": r["ETag"]}

    with ThreadPoolExecutor(job.inflight) as pool:
        parts = list(pool.map(lambda a: part(*a), [(i + 1, ln) for i, (_, ln) in enumerate(job.ranges)]))
    c.complete_multipart_upload(
        Bucket=job.bucket, Key=job.key, UploadId=uid, MultipartUpload={"Parts": parts}
    )
    return time.perf_counter() - t0


def boto3_load(job: Job) -> float:
    c = boto3_client(job)

    def get(off: int, ln: int) -> bytes:
        body: bytes = c.get_object(Bucket=job.bucket, Key=job.key, Range=f"bytes={off}-{off + ln - 1}")[
            "Body"
        ].read()
        return body

    return _threaded_load(job, get)


def s3dlio_save(job: Job) -> float:
    import s3dlio

    t0 = time.perf_counter()
    w = s3dlio.MultipartUploadWriter.from_uri(
        f"s3://{job.bucket}/{job.key}", part_size=job.part, max_in_flight=job.inflight, abort_on_drop=True
    )
    for _, ln in job.ranges:  # zero-copy API: reserve, fill (a memcpy here), commit
        view = w.reserve(ln)
        view[:] = job.src[:ln]
        w.commit(ln)
    w.close()
    return time.perf_counter() - t0


def s3dlio_load(job: Job) -> float:
    import s3dlio

    return _threaded_load(job, lambda off, ln: s3dlio.get_range(f"s3://{job.bucket}/{job.key}", off, ln))


def minio_client(job: Job) -> Any:
    from minio import Minio

    host = job.ep.endpoint.removeprefix("http://")
    return Minio(
        host, access_key=job.ep.access_key, secret_key=job.ep.secret_key, secure=False, region=REGION
    )


class _Repeat:
    """A read-only stream of ``size`` bytes made of the part-sized source, for minio."""

    def __init__(self, job: Job) -> None:
        self.job, self.pos = job, 0

    def read(self, n: int = -1) -> bytes:
        left = self.job.size - self.pos
        n = left if n < 0 else min(n, left)
        start = self.pos % self.job.part
        n = min(n, self.job.part - start)
        self.pos += n
        return self.job.src[start : start + n]


def minio_save(job: Job) -> float:
    c = minio_client(job)
    t0 = time.perf_counter()
    c.put_object(
        job.bucket, job.key, _Repeat(job), job.size, part_size=job.part, num_parallel_uploads=job.inflight
    )
    return time.perf_counter() - t0


def minio_load(job: Job) -> float:
    c = minio_client(job)

    def get(off: int, ln: int) -> bytes:
        r = c.get_object(job.bucket, job.key, offset=off, length=ln)
        try:
            return bytes(r.read())
        finally:
            r.close()
            r.release_conn()

    return _threaded_load(job, get)


def mountpoint_client(job: Job) -> Any:
    from s3torchconnectorclient._mountpoint_s3_client import MountpointS3Client

    return MountpointS3Client(REGION, endpoint=job.ep.endpoint, force_path_style=True, part_size=job.part)


def mountpoint_save(job: Job) -> float:  # the CRT client chooses its own part concurrency
    c = mountpoint_client(job)
    t0 = time.perf_counter()
    stream = c.put_object(job.bucket, job.key)
    for _, ln in job.ranges:
        stream.write(job.src[:ln])
    stream.close()
    return time.perf_counter() - t0


def mountpoint_load(job: Job) -> float:
    c = mountpoint_client(job)
    return _threaded_load(
        job, lambda off, ln: b"".join(c.get_object(job.bucket, job.key, start=off, end=off + ln))
    )


Op = Callable[[Job], float]


def library_rows() -> dict[str, tuple[Op, Op, str]]:
    """name → (save, load, importable module); aiobotocore-fast is the reference row."""

    def aio(fast: bool) -> tuple[Op, Op, str]:
        return (
            lambda j: asyncio.run(_aio_save(j, fast)),
            lambda j: asyncio.run(_aio_load(j, fast)),
            "aiobotocore",
        )

    return {
        "aiobotocore-fast": aio(True),
        "aiobotocore": aio(False),
        "boto3": (boto3_save, boto3_load, "boto3"),
        "s3dlio": (s3dlio_save, s3dlio_load, "s3dlio"),
        "minio": (minio_save, minio_load, "minio"),
        "s3torchconnectorclient": (mountpoint_save, mountpoint_load, "s3torchconnectorclient"),
    }  # fmt: skip


# --- asyncckpt backends, through the public API (save, then load without verification) ---

#: asyncckpt backend → the library row it is compared with
BASELINE_OF = {"aiobotocore": "aiobotocore-fast", "s3dlio": "s3dlio", "minio": "minio",
               "s3torchconnector": "s3torchconnectorclient"}  # fmt: skip


def asyncckpt_rows() -> dict[str, tuple[Op, Op | None, str]]:
    from asyncckpt.checkpointer import AsyncCheckpointer
    from asyncckpt.sinks import BACKENDS

    def save(name: str) -> Op:
        async def run(job: Job) -> float:
            async with AsyncCheckpointer(backend=name, chunk_size=job.part, max_in_flight=job.inflight) as ck:
                t0 = time.perf_counter()
                await ck.save(f"s3://{job.bucket}/{job.key}", job.size)
                return time.perf_counter() - t0

        return lambda job: asyncio.run(run(job))

    def load(name: str) -> Op:
        async def run(job: Job) -> float:
            async with AsyncCheckpointer(backend=name, chunk_size=job.part, max_in_flight=job.inflight) as ck:
                t0 = time.perf_counter()
                # pure reads, like the library rows (verification has its own benchmark)
                result = await ck.load(f"s3://{job.bucket}/{job.key}", verify=False)
                elapsed = time.perf_counter() - t0
            if result.operation != "load" or result.size_bytes != job.size:
                raise RuntimeError(
                    f"load returned {result.operation} of {result.size_bytes} B, want {job.size}"
                )
            return elapsed

        return lambda job: asyncio.run(run(job))

    return {
        f"asyncckpt:{n}": (save(n), load(n), n) for n in BACKENDS if n not in ("file", "null", "memory", "s3")
    }


# --- driver ---


def measure(
    ep: S3Endpoint, bucket: str, rows: dict[str, tuple[Op, Op | None, str]], args: Any
) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name, (save, load, _) in rows.items():  # warm-up: one part, untimed; finds broken rows early
        try:
            job = Job(ep, bucket, f"warmup-{name}", args.part_size, args.part_size, 1)
            save(job)
            if load is not None:
                load(job)
            ep.request("DELETE", f"/{bucket}/{job.key}")
            results[name] = {"save_s": [], "load_s": []}
        except Exception as exc:
            results[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    for rep in range(args.repeat):
        for name, (save, load, _) in rows.items():
            if "error" in results[name]:
                continue
            job = Job(ep, bucket, f"{name}-{rep}", args.size, args.part_size, args.in_flight)
            results[name]["save_s"].append(save(job))
            if load is not None:
                results[name]["load_s"].append(load(job))
            ep.request("DELETE", f"/{bucket}/{job.key}")
    for r in results.values():
        for op in ("save", "load"):
            times = r.get(f"{op}_s")
            if times:
                r[f"{op}_gbps"] = args.size / statistics.median(times) / 1e9
    return results


def table(results: dict[str, Any], baseline_of: dict[str, str]) -> str:
    lines = [f"{'client':<30} {'save GB/s':>10} {'load GB/s':>10} {'save ×base':>11} {'load ×base':>11}"]
    for name, r in results.items():
        if "error" in r:
            lines.append(f"{name:<30} error: {r['error']}")
            continue
        base = results.get(baseline_of.get(name, "aiobotocore-fast"), {})
        cells = []
        for op in ("save", "load"):
            v, b = r.get(f"{op}_gbps"), base.get(f"{op}_gbps")
            cells.append(
                (f"{v:10.3f}" if v else f"{'n/a':>10}", f"{v / b:11.2f}" if v and b else f"{'':>11}")
            )
        lines.append(f"{name:<30} {cells[0][0]} {cells[1][0]} {cells[0][1]} {cells[1][1]}")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=lambda v: parse_size(v, name="--size"), default="256MiB")
    p.add_argument("--part-size", type=lambda v: parse_size(v, name="--part-size"), default="32MiB")
    p.add_argument("--in-flight", type=int, default=4)
    p.add_argument("--repeat", type=int, default=1, help="runs per row (median reported)")
    p.add_argument("--workers", type=int, default=1, help="Swift proxy/object workers when started here")
    p.add_argument(
        "--endpoint", default=None, help="use a running server (credentials from AWS_* or Swift's)"
    )
    p.add_argument("--clients", default=None, help="comma-separated rows to run (default: all installed)")
    p.add_argument("--json", default=None, help="also write the JSON to this file")
    args = p.parse_args()
    if args.part_size < 5 << 20 and args.size > args.part_size:
        p.error("--part-size must be >= 5MiB for multipart uploads")
    rows: dict[str, tuple[Op, Op | None, str]] = {}
    for name, (save, load, module) in library_rows().items():
        try:
            __import__(module)
        except ImportError:
            continue
        rows[name] = (save, load, module)
    rows.update(asyncckpt_rows())
    if args.clients:
        wanted = args.clients.split(",")
        rows = {k: v for k, v in rows.items() if k in wanted}
    server = SwiftServer(workers=args.workers) if args.endpoint is None else _external(args.endpoint)
    with server as ep, endpoint_environment(ep):
        bucket = ep.create_bucket()
        results = measure(ep, bucket, rows, args)
    baseline_of = {f"asyncckpt:{k}": v for k, v in BASELINE_OF.items()}
    out = {
        "server": "swift" if args.endpoint is None else args.endpoint,
        "size": args.size,
        "part_size": args.part_size,
        "in_flight": args.in_flight,
        "repeat": args.repeat,
        "cpus": os.cpu_count(),
        "results": results,
        "baseline_of": baseline_of,
    }
    print(table(results, baseline_of))
    print(json.dumps(out, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


class _external:
    """A server started elsewhere (e.g. ``python -m asyncckpt.servers.swift start``)."""

    def __init__(self, endpoint: str) -> None:
        env = os.environ
        self.ep = S3Endpoint("external", endpoint, env.get("AWS_ACCESS_KEY_ID", ACCESS_KEY),
                             env.get("AWS_SECRET_ACCESS_KEY", SECRET_KEY), REGION, QUIRKS)  # fmt: skip

    def __enter__(self) -> S3Endpoint:
        return self.ep

    def __exit__(self, *exc: object) -> None:
        pass


if __name__ == "__main__":
    sys.exit(main())

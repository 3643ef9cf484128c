"""Each S3 backend three ways, one run, one endpoint: asyncckpt save vs the library used
directly (simplest correct code, same generator, part size and parts in flight) vs the
library's I/O-only ceiling (the same direct code on pre-filled buffers, no generation).

Against moto the server is the bottleneck; by default this starts the discard endpoint
(benchmarks/s3_discard_server.py) in a subprocess so the clients are what is measured.

    python benchmarks/bench_s3_backends.py --size 2GiB --part-size 32MiB --max-in-flight 4
    python benchmarks/bench_s3_backends.py --endpoint http://127.0.0.1:9000 --bucket b  # any S3
    python benchmarks/bench_s3_backends.py --repeat 3 --loop-lag none,process  # medians of rounds
    python benchmarks/bench_s3_backends.py --pairs 5 --backends aiobotocore --size 2GiB \
        --options default,payload_signing,checksums
        # aiobotocore only: alternating pre-filled ceilings vs asyncckpt saves, per option set,
        # with CPU-s/GB (client and discard server) and the goal's ratio verdict (issue 12 goal 3)
    python benchmarks/bench_s3_backends.py --pairs 7 --backends s3dlio --size 2GiB --part-size 32MiB  # goal 2

``--pairs N`` (issue 12, goal 2) runs N alternating pairs of s3dlio used directly (generating
into ``reserve()``d memory) and asyncckpt's s3dlio save *in the default mode* (a writer
process; synthetic chunks generated in s3dlio's memory there), each run in a fresh process,
the order swapped every pair; it prints the per-pair ratios, their median and bootstrap
interval and the verdict against 0.97 (``_common.ratio_verdict``), as a table and one JSON
document. ``--caller-data`` adds to each pair a default-mode save of caller bytes (``data=``,
which keeps its copies: into the shared pool, then into s3dlio's memory) and the direct
ceiling (s3dlio fed by copying a pre-filled buffer into ``reserve()``), reported beside it.
``--with-crc`` adds to each pair s3dlio used directly plus the CRC32C of every part that
asyncckpt computes for its manifest (same kernel, overlapped with the next part's generation
as asyncckpt does), and a second, informative verdict against that. ``--integrity none``
saves through asyncckpt without any checksum (issue 29 section 4: a pure storage benchmark),
judged against the library used directly, which computes none either.

Prints a table and JSON (``--json FILE`` writes it too). Each backend runs in its own
spawned process: s3dlio and the CRT configure their clients once per process. With
``--repeat N`` the backends alternate round by round (drift on a shared machine hits them
alike) and the table shows medians. ``--loop-lag MODES`` adds, per backend, round and
isolation mode (``none``: in-process, ``process``: a writer process), one more asyncckpt save
in a fresh process with a 1 ms loop ticker: the caller's event-loop lag and its peak RSS over
the pool, i.e. what a library's own threads/runtime cost the caller (what ``needs_isolation``
is decided on); it is kept apart so the ticker never slows the GB/s runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import io
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any, get_args

import dgen_py
from _common import emit, ratio_verdict

from asyncckpt import AsyncCheckpointer
from asyncckpt.checksum import crc
from asyncckpt.modes import Integrity, ThreadBudgetRule
from asyncckpt.results.text import format_table
from asyncckpt.sinks.s3 import S3_BACKENDS, installed, sink_class
from asyncckpt.units import parse_size

SEED = 1


def chunks(size: int, part: int) -> list[tuple[int, int]]:
    return [(o, min(part, size - o)) for o in range(0, size, part)]


class Data:
    """Where a direct run gets each part: generated now (direct) or pre-filled (ceiling)."""

    def __init__(self, size: int, part: int, prefilled: bool) -> None:
        self.gen = dgen_py.Generator(size=size, seed=SEED)
        self.prefilled = bytearray(part) if prefilled else None
        if self.prefilled is not None:
            self.gen.fill_chunk(memoryview(self.prefilled))

    def part(self, n: int) -> memoryview:
        """A buffer with the next part (fresh memory when generated: the simplest correct way)."""
        if self.prefilled is not None:
            return memoryview(self.prefilled)[:n]
        buf = bytearray(n)
        self.gen.fill_chunk(memoryview(buf))
        return memoryview(buf)

    def fill(self, view: memoryview) -> None:
        if self.prefilled is not None:
            view[:] = memoryview(self.prefilled)[: len(view)]
        else:
            self.gen.fill_chunk(view)


def aiobotocore_config(
    a: argparse.Namespace, payload_signing: bool = False, checksums: str = "when_required"
) -> Any:
    """The client settings asyncckpt's aiobotocore sink uses (its defaults: unsigned, when_required)."""
    from aiobotocore.config import AioConfig

    return AioConfig(
        s3={"addressing_style": "path", "payload_signing_enabled": payload_signing},
        request_checksum_calculation=checksums,
        max_pool_connections=max(16, a.max_in_flight * 2),
        parameter_validation=False,  # botocore's validator refuses memoryview and Payload bodies
    )


async def upload_aiobotocore(
    a: argparse.Namespace, c: Any, data: Data, body: str = "bytes", key: str = "direct"
) -> None:
    """create → upload_part (``max_in_flight`` in flight) → complete.

    ``body``: "bytes" hands botocore ``bytes(part)`` (the simplest correct code: one copy per
    part, then aiohttp's own copies on the loop thread); "view" hands it what asyncckpt's sink
    sends with the same settings (its zero-copy ``PartBody`` unless the payload is signed, and
    a CRC32 computed in a worker thread when checksums are on).
    """
    import base64
    import zlib

    from asyncckpt.sinks.s3.part_body import part_body_class

    PartBody = part_body_class()

    signed = bool(c.meta.config.s3 and c.meta.config.s3.get("payload_signing_enabled"))
    crc = body == "view" and c.meta.config.request_checksum_calculation == "when_supported"
    mpu = await c.create_multipart_upload(Bucket=a.bucket, Key=key)
    window = asyncio.Semaphore(a.max_in_flight)
    etags: dict[int, str] = {}

    async def one(number: int, view: memoryview) -> None:
        try:
            payload: Any = bytes(view) if body == "bytes" else view if signed else PartBody(view)
            extra: dict[str, str] = {}
            if crc:
                value = (await asyncio.to_thread(zlib.crc32, view)).to_bytes(4, "big")
                extra = {"ChecksumAlgorithm": "CRC32", "ChecksumCRC32": base64.b64encode(value).decode()}
            r = await c.upload_part(
                Bucket=a.bucket,
                Key=key,
                UploadId=mpu["UploadId"],
                PartNumber=number,
                Body=payload,
                ContentLength=len(view),
                **extra,
            )
            etags[number] = r["ETag"]
        finally:
            window.release()

    async with asyncio.TaskGroup() as tg:
        for i, (_, n) in enumerate(chunks(a.size, a.part_size)):
            await window.acquire()
            view = await asyncio.to_thread(data.part, n)
            tg.create_task(one(i + 1, view))
    parts = [{"PartNumber": k, "ETag": etags[k]} for k in sorted(etags)]
    await c.complete_multipart_upload(
        Bucket=a.bucket, Key=key, UploadId=mpu["UploadId"], MultipartUpload={"Parts": parts}
    )


async def direct_aiobotocore(a: argparse.Namespace, data: Data) -> None:
    from aiobotocore.session import get_session

    async with get_session().create_client(
        "s3", region_name="us-east-1", endpoint_url=a.endpoint, config=aiobotocore_config(a)
    ) as c:
        await upload_aiobotocore(a, c, data)


def direct_s3dlio(a: argparse.Namespace, data: Data, *, with_crc: bool = False) -> None:
    """s3dlio's zero-copy path: each part generated straight into its ``reserve()``d memory.
    ``with_crc``: plus the integrity work asyncckpt does per chunk, a CRC32C of each committed
    part (the same kernel) in another thread while the next part is generated."""
    import s3dlio

    w = s3dlio.MultipartUploadWriter.from_uri(
        f"s3://{a.bucket}/direct{'-crc' if with_crc else ''}",
        part_size=a.part_size,
        max_in_flight=a.max_in_flight,
        abort_on_drop=True,
    )
    with ThreadPoolExecutor(1) as pool:  # its thread starts at the first CRC only
        pending: tuple[Future[int], memoryview] | None = None
        for _, n in chunks(a.size, a.part_size):
            view = w.reserve(n)
            data.fill(view)
            w.commit(n)  # the committed view stays readable (s3dlio's reserve() contract)
            if pending is not None:
                pending[0].result()
                pending[1].release()
                pending = None
            if with_crc:
                pending = (pool.submit(crc, view), view)
            else:
                view.release()
        if pending is not None:
            pending[0].result()
            pending[1].release()
    w.close()


def direct_minio(a: argparse.Namespace, data: Data) -> None:
    from minio import Minio

    class Stream(io.RawIOBase):
        def __init__(self) -> None:
            self.pending = memoryview(b"")

        def readable(self) -> bool:
            return True

        def readinto(self, b: Any) -> int:
            if not self.pending:
                self.pending = data.part(a.part_size)
            n = min(len(b), len(self.pending))
            b[:n] = self.pending[:n]
            self.pending = self.pending[n:]
            return n

    host = a.endpoint.split("://", 1)[1]
    client = Minio(host, access_key="bench", secret_key="bench-secret", secure=False, region="us-east-1")
    client.put_object(
        a.bucket, "direct", Stream(), a.size, part_size=a.part_size, num_parallel_uploads=a.max_in_flight
    )


def direct_s3torchconnector(a: argparse.Namespace, data: Data) -> None:
    from s3torchconnectorclient._mountpoint_s3_client import MountpointS3Client

    client = MountpointS3Client(
        "us-east-1", endpoint=a.endpoint, force_path_style=True, part_size=a.part_size
    )
    stream = client.put_object(a.bucket, "direct")
    for _, n in chunks(a.size, a.part_size):
        stream.write(bytes(data.part(n)))
    stream.close()


def direct_obstore(a: argparse.Namespace, data: Data) -> None:
    import obstore
    from obstore.store import S3Store

    store = S3Store(
        a.bucket,
        endpoint=a.endpoint,
        region="us-east-1",
        unsigned_payload=True,
        client_options={"allow_http": True},
    )
    # write() keeps each buffer until its part is uploaded: fresh (or unchanging) memory per part
    with obstore.open_writer(store, "direct", buffer_size=a.part_size, max_concurrency=a.max_in_flight) as w:
        for _, n in chunks(a.size, a.part_size):
            w.write(data.part(n))


DIRECT = {
    "aiobotocore": direct_aiobotocore,
    "s3dlio": direct_s3dlio,
    "minio": direct_minio,
    "s3torchconnector": direct_s3torchconnector,
    "obstore": direct_obstore,
}


async def via_asyncckpt(a: argparse.Namespace, backend: str) -> dict[str, Any]:
    options = {"endpoint_url": a.endpoint, "region": "us-east-1", "dotenv": False}
    async with AsyncCheckpointer(
        chunk_size=a.part_size,
        num_buffers=a.max_in_flight + 2,
        max_in_flight=min(a.max_in_flight, a.max_in_flight + 2),
        backend=backend,
        backend_options={**options, "max_in_flight": a.max_in_flight},
        seed=SEED,
        # each backend already runs in a spawned process of its own, like its direct row; a
        # pool worker may not start the writer process s3dlio would otherwise get
        # (benchmarks/bench_isolation.py measures that process's cost)
        isolation="none",
    ) as ckpt:
        await ckpt.save(f"s3://{a.bucket}/warmup", a.part_size)  # pool touch, client setup
        r = await ckpt.save(f"s3://{a.bucket}/asyncckpt", a.size)
    return {"wall_s": r.wall_s, "gen_s": r.gen_s, "bottleneck": r.bottleneck}


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _reset_peak_rss() -> int:
    """VmHWM := VmRSS (Linux); returns that RSS in KiB."""
    Path("/proc/self/clear_refs").write_text("5")
    return _status_kib("VmRSS")


async def loop_lag(a: argparse.Namespace, backend: str, isolation: str) -> dict[str, Any]:
    """One monitored save (fresh process): the caller's loop lag, and its peak RSS over the pool."""
    _bench_environment(a)
    num_buffers = a.max_in_flight + 2
    sink_class(backend)  # the library imported before the baseline: its runtime starts in the save
    rss_kib = _reset_peak_rss()
    async with AsyncCheckpointer(
        chunk_size=a.part_size,
        num_buffers=num_buffers,
        max_in_flight=a.max_in_flight,
        backend=backend,
        backend_options={"endpoint_url": a.endpoint, "dotenv": False, "max_in_flight": a.max_in_flight},
        seed=SEED,
        isolation=isolation,
        monitor_interval=0.001,
    ) as ckpt:
        r = await ckpt.save(f"s3://{a.bucket}/lag", a.size)
        peak_kib = _status_kib("VmHWM")
    lag = r.loop_lag_s
    return {
        f"lag_p99_ms_{isolation}": lag.p99 * 1e3,
        f"lag_max_ms_{isolation}": lag.max * 1e3,
        f"rss_over_pool_mib_{isolation}": (peak_kib - rss_kib) / 1024 - num_buffers * a.part_size / 2**20,
    }


def run_loop_lag(a: argparse.Namespace, backend: str, isolation: str) -> dict[str, Any]:
    return asyncio.run(loop_lag(a, backend, isolation))


def _bench_environment(a: argparse.Namespace) -> None:
    os.environ.update(
        {
            "AWS_ENDPOINT_URL": a.endpoint,
            "AWS_ACCESS_KEY_ID": "bench",
            "AWS_SECRET_ACCESS_KEY": "bench-secret",
        }
    )
    os.environ.update(
        {"AWS_REGION": "us-east-1", "S3DLIO_UNSIGNED_PAYLOAD": "1", "AWS_EC2_METADATA_DISABLED": "true"}
    )


def run_backend(a: argparse.Namespace, backend: str) -> dict[str, Any]:
    """One backend, all three ways (runs in a spawned child)."""
    _bench_environment(a)
    out: dict[str, Any] = {"backend": backend}
    fn = DIRECT[backend]
    warm = argparse.Namespace(**{**vars(a), "size": a.part_size})
    for label, args, prefilled in (("warmup", warm, True), ("ceiling", a, True), ("direct", a, False)):
        data = Data(args.size, a.part_size, prefilled)
        t0 = time.perf_counter()
        if asyncio.iscoroutinefunction(fn):
            asyncio.run(fn(args, data))
        else:
            fn(args, data)
        out[f"{label}_s"] = time.perf_counter() - t0
    out.update({f"asyncckpt_{k}": v for k, v in asyncio.run(via_asyncckpt(a, backend)).items()})
    for label in ("ceiling", "direct", "asyncckpt"):
        out[f"{label}_gbps"] = (
            a.size / out[f"{label}_s" if label != "asyncckpt" else "asyncckpt_wall_s"] / 1e9
        )
    out["vs_direct"] = out["asyncckpt_gbps"] / out["direct_gbps"]
    return out


#: asyncckpt aiobotocore backend options whose cost ``--pairs`` measures (name → options)
OPTION_SETS: dict[str, dict[str, Any]] = {
    "default": {},
    "payload_signing": {"payload_signing": True},
    "checksums": {"checksums": "when_supported"},
    "signing+checksums": {"payload_signing": True, "checksums": "when_supported"},
}
KINDS = ("ceiling_bytes", "ceiling_view", "asyncckpt")


def _cpu_s(pid: int | None) -> float:
    """User + system CPU seconds of process ``pid`` so far (0.0 when there is none)."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def aiobotocore_pairs(a: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    """Alternating runs, one process: per round and option set, the pre-filled ceiling with
    ``bytes`` bodies, the pre-filled ceiling with asyncckpt's body, and an asyncckpt save (the
    order rotates round by round). Clients and checkpointers are made (and warmed) first."""
    from aiobotocore.session import get_session

    _bench_environment(a)
    names = a.options.split(",")
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    warm = argparse.Namespace(**{**vars(a), "size": a.part_size})
    async with contextlib.AsyncExitStack() as stack:
        clients: dict[str, Any] = {}
        ckpts: dict[str, AsyncCheckpointer] = {}
        for name in names:
            o = OPTION_SETS[name]
            config = aiobotocore_config(
                a, o.get("payload_signing", False), o.get("checksums", "when_required")
            )
            clients[name] = await stack.enter_async_context(
                get_session().create_client(
                    "s3", region_name="us-east-1", endpoint_url=a.endpoint, config=config
                )
            )
            options = {"endpoint_url": a.endpoint, "region": "us-east-1", "dotenv": False}
            ckpts[name] = await stack.enter_async_context(
                AsyncCheckpointer(
                    chunk_size=a.part_size,
                    num_buffers=a.max_in_flight + 2,
                    max_in_flight=a.max_in_flight,
                    backend="aiobotocore",
                    backend_options={**options, "max_in_flight": a.max_in_flight, **o},
                    seed=SEED,
                    isolation="none",
                )
            )
            await ckpts[name].save(f"s3://{a.bucket}/warmup", a.part_size)
            await upload_aiobotocore(warm, clients[name], Data(a.part_size, a.part_size, True), key="warmup")
        data = Data(a.size, a.part_size, prefilled=True)
        for r in range(a.pairs):
            for name in names:
                row: dict[str, Any] = {"round": r, "options": name}
                for kind in KINDS[r % 3 :] + KINDS[: r % 3]:  # who goes first rotates
                    cpu0, srv0, t0 = time.process_time(), _cpu_s(a.server_pid), time.perf_counter()
                    if kind == "asyncckpt":
                        res = await ckpts[name].save(f"s3://{a.bucket}/asyncckpt", a.size)
                        wall = res.wall_s
                        row["asyncckpt_gen_s"] = res.gen_s
                    else:
                        body = kind.split("_")[1]
                        await upload_aiobotocore(a, clients[name], data, body=body, key="ceiling")
                        wall = time.perf_counter() - t0
                    gb = a.size / 1e9
                    row[f"{kind}_gbps"] = gb / wall
                    row[f"{kind}_cpu_s_per_gb"] = (time.process_time() - cpu0) / gb
                    row[f"{kind}_server_cpu_s_per_gb"] = (_cpu_s(a.server_pid) - srv0) / gb
                runs[name].append(row)
    return runs


def run_pairs(a: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    return asyncio.run(aiobotocore_pairs(a))


def report_pairs(a: argparse.Namespace, runs: dict[str, list[dict[str, Any]]]) -> None:
    """Goal 3 of issue 12: asyncckpt's default aiobotocore save vs its pre-filled ceiling, and
    what each option costs (medians over the rounds)."""
    from _common import emit, ratio_verdict

    med = statistics.median
    default = runs.get("default")
    rows = []
    for name, rs in runs.items():
        row: dict[str, Any] = {"options": name}
        for kind in KINDS:
            row[f"{kind} GB/s"] = med(r[f"{kind}_gbps"] for r in rs)
            row[f"{kind} CPU-s/GB"] = med(r[f"{kind}_cpu_s_per_gb"] for r in rs)
        row["server CPU-s/GB (asyncckpt)"] = med(r["asyncckpt_server_cpu_s_per_gb"] for r in rs)
        row["vs ceiling_bytes"] = med(r["asyncckpt_gbps"] / r["ceiling_bytes_gbps"] for r in rs)
        row["vs ceiling_view"] = med(r["asyncckpt_gbps"] / r["ceiling_view_gbps"] for r in rs)
        if default is not None:
            row["vs default save"] = med(r["asyncckpt_gbps"] for r in rs) / med(
                d["asyncckpt_gbps"] for d in default
            )
        rows.append(row)
    extra: dict[str, Any] = {
        "size": a.size,
        "part_size": a.part_size,
        "max_in_flight": a.max_in_flight,
        "endpoint": a.endpoint,
        "pairs": a.pairs,
        "runs": runs,
    }
    if default is not None and len(default) >= 5:
        for ceiling in ("ceiling_bytes", "ceiling_view"):
            ratios = [r["asyncckpt_gbps"] / r[f"{ceiling}_gbps"] for r in default]
            extra[f"verdict_vs_{ceiling}"] = verdict = ratio_verdict(ratios, 0.90)
            print(
                f"default save vs {ceiling}: median {verdict['median_ratio']}, 95 % CI {verdict['ci95']}, "
                f"target {verdict['target']}: {verdict['verdict']}"
            )
    headers = ["options"] + [h for h in rows[0] if h != "options"] if rows else []
    emit("s3_aiobotocore_pairs", rows, headers, extra)


def run_direct(a: argparse.Namespace, backend: str, prefilled: bool, with_crc: bool = False) -> float:
    """One direct run (after a one-part warm-up) in this fresh process; returns GB/s."""
    _bench_environment(a)
    fn = functools.partial(direct_s3dlio, with_crc=True) if with_crc else DIRECT[backend]
    warm = argparse.Namespace(**{**vars(a), "size": a.part_size})
    for args, timed in ((warm, False), (a, True)):
        data = Data(args.size, a.part_size, prefilled or not timed)
        t0 = time.perf_counter()
        if asyncio.iscoroutinefunction(fn):
            asyncio.run(fn(args, data))
        else:
            fn(args, data)
        elapsed = time.perf_counter() - t0
    return a.size / elapsed / 1e9


async def default_save(a: argparse.Namespace, backend: str, caller: bool) -> dict[str, Any]:
    """One asyncckpt save in the default mode (isolation and in-flight left to asyncckpt; part
    size and the library's own parts in flight as the direct run's), after a warm-up save."""
    data = None
    if caller:  # the caller's bytes, in memory before the save (not timed)
        buf = bytearray(a.size)
        await asyncio.to_thread(dgen_py.Generator(size=a.size, seed=SEED).fill_chunk, memoryview(buf))
        data = bytes(buf)
        del buf
    options = {"endpoint_url": a.endpoint, "region": "us-east-1", "dotenv": False}
    async with AsyncCheckpointer(
        chunk_size=a.part_size,
        backend=backend,
        backend_options={**options, "max_in_flight": a.max_in_flight},
        seed=SEED,
        # the library's defaults unless the command line overrides them
        **{
            k: v
            for k in ("thread_budget", "gen_threads", "cpu_nice", "integrity")
            if (v := getattr(a, k, None)) is not None
        },
    ) as ckpt:
        await ckpt.save(f"s3://{a.bucket}/warmup", a.part_size)  # writer process, client setup
        r = await ckpt.save(f"s3://{a.bucket}/asyncckpt", a.size, data=data)
    extra = r.metadata.extra
    return {
        "gbps": a.size / r.wall_s / 1e9,
        "gen_s": r.gen_s,
        "bottleneck": r.bottleneck,
        "isolation": extra.get("isolation"),
        "copied_into_library_bytes": extra.get("copied_into_library_bytes"),
        "generated_in_library_bytes": extra.get("generated_in_library_bytes"),
        # where the chunks were generated (the writer process) and with how many threads
        "gen_threads": r.metadata.gen_threads,
        "lag_p99_ms": r.loop_lag_s.p99 * 1e3,  # the caller's loop, during the save
    }


def run_default_save(a: argparse.Namespace, backend: str, caller: bool) -> dict[str, Any]:
    _bench_environment(a)
    return asyncio.run(default_save(a, backend, caller))


def pairs(a: argparse.Namespace, backend: str) -> None:
    """``--pairs``: alternating pairs direct vs asyncckpt default mode; ratio verdict vs 0.97."""
    ctx = mp.get_context("spawn")

    def fresh(fn: Any, *args: Any) -> Any:
        # a fresh (non-daemonic) process per run: s3dlio configures once per process, and the
        # default mode starts a writer process of its own
        with ProcessPoolExecutor(1, mp_context=ctx) as ex:
            return ex.submit(fn, a, backend, *args).result()

    rows: list[dict[str, Any]] = []
    for i in range(a.pairs):
        order = ("direct", "asyncckpt") if i % 2 == 0 else ("asyncckpt", "direct")
        if a.with_crc:  # the CRC'd direct run beside its pair, first or last in turn
            order = ("direct_crc", *order) if i % 2 == 0 else (*order, "direct_crc")
        row: dict[str, Any] = {"pair": i + 1, "order": " then ".join(order)}
        for which in order:
            if which == "direct":
                row["direct_gbps"] = fresh(run_direct, False)
            elif which == "direct_crc":
                row["direct_crc_gbps"] = fresh(run_direct, False, True)
            else:
                got = fresh(run_default_save, False)
                row["asyncckpt_gbps"] = got.pop("gbps")
                row.update({f"asyncckpt_{k}": v for k, v in got.items()})
        row["ratio"] = row["asyncckpt_gbps"] / row["direct_gbps"]
        if a.with_crc:
            row["ratio_vs_direct_crc"] = row["asyncckpt_gbps"] / row["direct_crc_gbps"]
        if a.caller_data:
            row["ceiling_gbps"] = fresh(run_direct, True)
            got = fresh(run_default_save, True)
            row["caller_gbps"] = got.pop("gbps")
            row.update({f"caller_{k}": v for k, v in got.items()})
            row["caller_vs_direct"] = row["caller_gbps"] / row["direct_gbps"]
            row["caller_vs_ceiling"] = row["caller_gbps"] / row["ceiling_gbps"]
        rows.append(row)
        print(f"pair {row['pair']}: ratio {row['ratio']:.3f}", file=sys.stderr)
    headers = ["pair", "order", "direct_gbps", "asyncckpt_gbps", "ratio", "asyncckpt_bottleneck"]
    headers += ["asyncckpt_gen_threads", "asyncckpt_lag_p99_ms"]
    if a.with_crc:
        headers += ["direct_crc_gbps", "ratio_vs_direct_crc"]
    if a.caller_data:
        headers += ["ceiling_gbps", "caller_gbps", "caller_vs_direct", "caller_vs_ceiling"]
    extra: dict[str, Any] = {
        "backend": backend,
        "size": a.size,
        "part_size": a.part_size,
        "max_in_flight": a.max_in_flight,
        "endpoint": a.endpoint,
        "integrity": a.integrity or "crc32c (default)",
        "verdict": ratio_verdict([r["ratio"] for r in rows], 0.97),
    }
    if a.with_crc:  # informative: what asyncckpt adds beyond the per-chunk CRC32C it must do
        extra["verdict_vs_direct_crc"] = ratio_verdict([r["ratio_vs_direct_crc"] for r in rows], 0.97)
    if a.caller_data:
        extra["caller_vs_direct_median"] = statistics.median(r["caller_vs_direct"] for r in rows)
        extra["caller_vs_ceiling_median"] = statistics.median(r["caller_vs_ceiling"] for r in rows)
    print(
        f"{backend}: asyncckpt default mode vs the library used directly, {a.size / 2**30:.3f} GiB, "
        f"parts {a.part_size / 2**20:.0f} MiB, {a.max_in_flight} in flight, {a.endpoint}, "
        f"integrity {extra['integrity']}"
    )
    verdict = extra["verdict"]
    ci = verdict["ci95"]
    print(f"median ratio {verdict['median_ratio']}, 95 % CI {ci}: {verdict['verdict']} (>= 0.97)")
    if a.with_crc:
        v = extra["verdict_vs_direct_crc"]
        print(f"vs direct with its CRC32C: median {v['median_ratio']}, 95 % CI {v['ci95']}: {v['verdict']}")
    emit("s3_default_vs_direct", rows, headers, extra)


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-field medians of one backend's rounds (text fields from the median-speed round)."""
    by_speed = sorted(runs, key=lambda r: r["asyncckpt_gbps"])
    out = dict(by_speed[(len(by_speed) - 1) // 2])
    for key in {k for r in runs for k, v in r.items() if isinstance(v, float)}:
        out[key] = statistics.median(r[key] for r in runs if key in r)  # a failed run has none
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="256MiB")
    p.add_argument("--part-size", default="32MiB")
    p.add_argument("--max-in-flight", type=int, default=4)
    p.add_argument("--endpoint", default=None, help="S3 endpoint (default: start the discard server)")
    p.add_argument("--bucket", default="bench")
    p.add_argument("--backends", default=",".join(S3_BACKENDS))
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--repeat", type=int, default=1, help="alternating rounds; the table shows medians")
    p.add_argument(
        "--loop-lag", default="", help="comma list of isolation modes (none,process): loop lag and RSS"
    )
    p.add_argument(
        "--pairs",
        type=int,
        default=0,
        help="N >= 5 alternating rounds, one backend: aiobotocore = pre-filled ceilings vs "
        "asyncckpt saves per option set (goal 3); any other = the library used directly vs "
        "asyncckpt's default mode (goal 2)",
    )
    p.add_argument(
        "--options", default="default", help=f"aiobotocore option sets for --pairs: {','.join(OPTION_SETS)}"
    )
    p.add_argument("--caller-data", action="store_true", help="with --pairs: also save caller data (data=)")
    p.add_argument(
        "--with-crc",
        action="store_true",
        help="with --pairs (s3dlio): also s3dlio used directly plus a CRC32C of each part, as asyncckpt does",
    )
    p.add_argument(
        "--thread-budget",
        choices=get_args(ThreadBudgetRule),
        default=None,
        help="with --pairs (not aiobotocore): asyncckpt's thread-budget rule instead of the library default",
    )
    p.add_argument(
        "--gen-threads",
        type=int,
        default=None,
        help="with --pairs (not aiobotocore): asyncckpt's gen_threads instead of its thread budget",
    )
    p.add_argument(
        "--cpu-nice",
        type=int,
        default=None,
        help="with --pairs (not aiobotocore): asyncckpt's cpu_nice (the writer's niceness)",
    )
    p.add_argument(
        "--integrity",
        choices=get_args(Integrity),
        default=None,
        help="with --pairs (not aiobotocore): asyncckpt's integrity (none: no CRC32C, judged against "
        "the library used directly without one, issue 29 section 4)",
    )
    a = p.parse_args()
    a.server_pid = None
    a.size, a.part_size = parse_size(a.size, name="--size"), parse_size(a.part_size, name="--part-size")
    if a.pairs:
        if a.pairs < 5:
            p.error("--pairs needs at least 5 pairs for a verdict")
        if "," in a.backends:
            p.error("--pairs takes one backend: --backends aiobotocore (goal 3) or s3dlio (goal 2)")
        if a.with_crc and a.backends != "s3dlio":
            p.error("--with-crc: s3dlio only (--backends s3dlio)")
    server = None
    if a.endpoint is None:
        script = Path(__file__).with_name("s3_discard_server.py")
        server = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
        assert server.stdout is not None
        a.endpoint = server.stdout.readline().split()[1]
        a.server_pid = server.pid  # a separate process: its CPU time is reported apart
    try:
        if a.pairs and a.backends == "aiobotocore":
            with mp.get_context("spawn").Pool(1) as pool:
                report_pairs(a, pool.apply(run_pairs, (a,)))
            return
        if a.pairs:
            pairs(a, a.backends)
            return
        ctx = mp.get_context("spawn")
        backends = []
        for backend in a.backends.split(","):
            if installed(backend):
                backends.append(backend)
            else:
                print(
                    f"skipping {backend}: not installed (pip install 'asyncckpt[{S3_BACKENDS[backend][3]}]')"
                )
        rounds: dict[str, list[dict[str, Any]]] = {b: [] for b in backends}
        lag_modes = [m for m in a.loop_lag.split(",") if m]
        for _ in range(a.repeat):
            for backend in backends:  # alternate: each round runs every backend once
                with ctx.Pool(1) as pool:
                    result = pool.apply(run_backend, (a, backend))
                for mode in lag_modes:  # not a Pool: its daemonic workers cannot start a writer process
                    with ProcessPoolExecutor(1, mp_context=ctx) as ex:
                        try:
                            result.update(ex.submit(run_loop_lag, a, backend, mode).result())
                        except Exception as exc:  # a failed save is a finding: shown, not hidden
                            result.setdefault("lag_failures", []).append(
                                f"{mode}: {type(exc).__name__}: {exc}"
                            )
                            print(
                                f"{backend}, isolation {mode}: {type(exc).__name__}: {exc}", file=sys.stderr
                            )
                rounds[backend].append(result)
    finally:
        if server is not None:
            server.terminate()
            server.wait()
    results = [median_of(runs) for runs in rounds.values()]
    lag_columns = [
        c for m in lag_modes for c in (f"loop p99 ms ({m})", f"loop max ms ({m})", f"RSS over pool MiB ({m})")
    ]
    rows = [
        (
            r["backend"],
            f"{r['ceiling_gbps']:.3f}",
            f"{r['direct_gbps']:.3f}",
            f"{r['asyncckpt_gbps']:.3f}",
            f"{r['vs_direct']:.2f}x",
            r["asyncckpt_bottleneck"],
            *(
                cell
                for m in lag_modes
                for cell in (
                    (
                        f"{r[f'lag_p99_ms_{m}']:.1f}",
                        f"{r[f'lag_max_ms_{m}']:.1f}",
                        f"{r[f'rss_over_pool_mib_{m}']:.0f}",
                    )
                    if f"lag_p99_ms_{m}" in r
                    else ("failed",) * 3
                )
            ),
        )
        for r in results
    ]
    print(
        f"{a.size / 2**30:.3f} GiB, parts {a.part_size / 2**20:.0f} MiB, "
        f"{a.max_in_flight} in flight, {a.endpoint}, medians of {a.repeat} alternating round(s)"
    )
    header = ("backend", "ceiling GB/s", "direct GB/s", "asyncckpt GB/s", "vs direct", "bottleneck")
    print(format_table((*header, *lag_columns), rows))
    doc = {"size": a.size, "part_size": a.part_size, "max_in_flight": a.max_in_flight, "endpoint": a.endpoint}
    doc["repeat"] = a.repeat
    text = json.dumps({**doc, "results": results, "rounds": rounds}, indent=2)
    print(text)
    if a.json is not None:
        a.json.write_text(text + "\n")


if __name__ == "__main__":
    main()

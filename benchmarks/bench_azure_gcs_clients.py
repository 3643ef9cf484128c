"""Put/get throughput of the client libraries used directly against Azurite and fake-gcs-server.

Rough figures for choosing the ``az://`` / ``gs://`` backends' clients: each row puts one
``--size`` object (a streaming upload of ``--part-size`` parts, ``--in-flight`` at a time where
the client takes it) and gets it back whole, then deletes it; the rows alternate within each of
``--repeat`` rounds (the order rotates per round). Only clients that work with the emulator
are measured (docs/azure-gcs.md): on fake-gcs-server obstore cannot write, so the object it
reads is uploaded through the JSON API, and the JSON API (standard library, resumable upload
of ``--part-size`` chunks, one at a time) is measured as the writer a backend could use. The
row ``asyncckpt gcs`` is asyncckpt's ``gs://`` backend itself (its sink, made as a checkpointer
makes it: open, ``write_part`` per part, ``complete``; one ``read_into`` of the whole object),
beside that same protocol spoken directly. ``--with-saves`` adds a row per backend of what a
user runs: ``AsyncCheckpointer.save(uri, data=...)`` and a verified ``load`` (the whole pipeline,
the per-chunk CRC32C, a writer process where the backend needs one).
Client and emulator share this machine's cores, and the emulators are slow by design:
compare rows of one run, never absolutes across machines.

    python benchmarks/bench_azure_gcs_clients.py --size 256MiB --part-size 8MiB --in-flight 4 --repeat 5
    python benchmarks/bench_azure_gcs_clients.py --size 256MiB --part-size 8MiB --in-flight 4 \
        --repeat 5 --with-saves
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import statistics
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit

import dgen_py
import obstore
from _common import bootstrap_ci, emit
from obstore.store import AzureStore, GCSStore

from asyncckpt import AsyncCheckpointer
from asyncckpt.env import AZURE_VARIABLES, export, exported
from asyncckpt.servers.azurite import AzureEndpoint, AzuriteServer
from asyncckpt.servers.gcs_emulator import GcsEmulator, GcsEndpoint
from asyncckpt.sinks import Sink, SinkOptions, make_sink
from asyncckpt.units import parse_size

HTTP = {"allow_http": True}
T = TypeVar("T")


@dataclass
class Row:
    """One client against one emulator: how it puts, gets and deletes ``key``."""

    store: str
    client: str
    put: Callable[[str, bytes], None]
    get: Callable[[str], int]
    delete: Callable[[str], None]
    note: str = ""


def azure_rows(ep: AzureEndpoint, container: str, part: int, inflight: int) -> list[Row]:
    import s3dlio  # after the variables are exported: s3dlio reads them when it builds its client

    store = AzureStore(container, config=ep.obstore_config(), client_options=HTTP)
    base = f"az://{ep.account}/{container}/"

    def ob_put(key: str, data: bytes) -> None:
        obstore.put(
            store, key, memoryview(data), use_multipart=True, chunk_size=part, max_concurrency=inflight
        )

    def s3dlio_put(key: str, data: bytes) -> None:
        writer = s3dlio.create_azure_writer(base + key)
        view = memoryview(data)
        for off in range(0, len(data), part):
            writer.write_chunk(view[off : off + part])
        writer.finalize()

    return [
        Row(
            "azure",
            "obstore",
            ob_put,
            lambda key: len(obstore.get(store, key).bytes()),
            lambda key: obstore.delete(store, key),
            f"put(use_multipart, chunk_size={part}, max_concurrency={inflight}); get().bytes()",
        ),
        Row(
            "azure",
            "s3dlio",
            s3dlio_put,
            lambda key: len(s3dlio.get(base + key)),
            lambda key: s3dlio.delete(base + key),
            "create_azure_writer + write_chunk per part (its own 4 MiB blocks); get()",
        ),
    ]


def json_request(
    ep: GcsEndpoint, method: str, path: str, body: Any = b"", headers: dict[str, str] | None = None
) -> Any:
    url = urlsplit(ep.url)
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=300)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        data = response.read()
        if response.status not in (200, 204, 308):
            raise RuntimeError(f"{method} {path}: HTTP {response.status}: {data[:300]!r}")
        return response, data
    finally:
        conn.close()


def gcs_rows(ep: GcsEndpoint, bucket: str, part: int) -> list[Row]:
    store = GCSStore(bucket, config=ep.obstore_config(), client_options=HTTP)

    def json_put(key: str, data: bytes) -> None:
        start = f"/upload/storage/v1/b/{bucket}/o?uploadType=resumable&name={quote(key, safe='')}"
        response, _ = json_request(
            ep, "POST", start, json.dumps({"name": key}), {"Content-Type": "application/json"}
        )
        session = urlsplit(response.getheader("Location"))
        path, view = f"{session.path}?{session.query}", memoryview(data)
        for off in range(0, len(data), part):
            end = min(off + part, len(data))
            total = str(len(data)) if end == len(data) else "*"
            json_request(ep, "PUT", path, view[off:end], {"Content-Range": f"bytes {off}-{end - 1}/{total}"})

    def json_get(key: str) -> int:
        _, data = json_request(
            ep, "GET", f"/download/storage/v1/b/{bucket}/o/{quote(key, safe='')}?alt=media"
        )
        return len(data)

    def delete(key: str) -> None:
        json_request(ep, "DELETE", f"/storage/v1/b/{bucket}/o/{quote(key, safe='')}")

    return [
        Row("gcs", "json-api (stdlib)", json_put, json_get, delete, f"resumable upload, {part}-byte chunks"),
        Row(
            "gcs",
            "obstore (get only)",
            json_put,  # obstore cannot write to fake-gcs-server; the put is not reported
            lambda key: len(obstore.get(store, key).bytes()),
            lambda key: obstore.delete(store, key),
            "put fails (XML API); object uploaded through the JSON API",
        ),
    ]


def asyncckpt_gcs_row(ep: GcsEndpoint, bucket: str, part: int, executor: ThreadPoolExecutor) -> Row:
    """asyncckpt's gs:// backend: its sink on a fresh event loop per call (as a checkpointer
    would run it, minus the pipeline: no data generation, no sealing)."""
    options = SinkOptions(chunk_size=part, extra={"endpoint_url": ep.url})

    def sink(key: str) -> Sink:
        return make_sink(f"gs://{bucket}/{key}", backend="gcs", executor=executor, options=options)

    async def put(key: str, data: bytes) -> None:
        s, view = sink(key), memoryview(data)
        await s.open(len(data))
        for off in range(0, len(data), part):
            await s.write_part(off, view[off : off + part])
        await s.complete()
        await s.aclose()

    async def get(key: str) -> int:
        s = sink(key)
        buf = bytearray(await s.size())
        n = await s.read_into(0, memoryview(buf))
        await s.aclose()
        return n

    async def delete(key: str) -> None:
        s = sink(key)
        await s.delete()
        await s.aclose()

    return Row(
        "gcs",
        "asyncckpt gcs",
        lambda key, data: asyncio.run(put(key, data)),
        lambda key: asyncio.run(get(key)),
        lambda key: asyncio.run(delete(key)),
        f"backend gcs (aiohttp): resumable upload, {part}-byte chunks, CRC32C compared; one ranged read",
    )


def asyncckpt_save_rows(
    stack: ExitStack,
    az: AzureEndpoint,
    container: str,
    gcs: GcsEndpoint,
    bucket: str,
    part: int,
    inflight: int,
) -> list[Row]:
    """What a user measures: ``AsyncCheckpointer.save(uri, data=...)`` (the whole pipeline:
    per-chunk CRC32C sealed into the object, the backend's writer process where it needs one)
    and ``load(uri)`` (verified), one prepared checkpointer per backend, through each backend that serves
    the emulator. Its put/get sit beside the same client's direct rows above."""
    azure = {"endpoint_url": az.account_url}  # the account and its key: the variables exported
    # s3dlio has no account-key mode: its user gives a SAS, and no key beside it
    sas_only: dict[str, str | None] = {
        name: None for key in ("account_key", "connection_string") for name in AZURE_VARIABLES[key]
    }
    sas_only["AZURE_STORAGE_SAS_TOKEN"] = az.sas().reveal()
    targets: list[tuple[str, str, str, dict[str, Any], dict[str, str | None]]] = [
        ("azure", "obstore-azure", f"az://{container}/", azure, {}),
        ("azure", "s3dlio-azure", f"az://{container}/", azure, sas_only),
        ("gcs", "gcs", f"gs://{bucket}/", {"endpoint_url": gcs.url}, {}),
    ]

    def run(variables: dict[str, str | None], runner: asyncio.Runner, call: Coroutine[Any, Any, T]) -> T:
        saved = {name: os.environ.get(name) for name in variables}
        export(variables)
        try:
            return runner.run(call)
        finally:
            export(saved)

    def row(
        store: str, backend: str, base: str, options: dict[str, Any], variables: dict[str, str | None]
    ) -> Row:
        # one checkpointer per row on a loop of its own, prepared before the first timed call
        # (its writer process started, the client library imported, the pool touched), as each
        # direct client above is made once: the rows time the saves and loads, not the setup
        runner = stack.enter_context(asyncio.Runner())
        c = AsyncCheckpointer(
            chunk_size=part, max_in_flight=inflight, backend=backend, backend_options=options
        )
        run(variables, runner, c.__aenter__())
        stack.callback(lambda: run(variables, runner, c.aclose()))
        run(variables, runner, c.prepare(base + "warm"))

        async def put(key: str, data: bytes) -> None:
            await c.save(base + key, data=data)

        async def get(key: str) -> int:
            return (await c.load(base + key)).size_bytes

        return Row(
            store,
            f"asyncckpt save/load ({backend})",
            lambda key, data: run(variables, runner, put(key, data)),
            lambda key: run(variables, runner, get(key)),
            lambda key: run(variables, runner, c.delete(base + key)),
            f"AsyncCheckpointer(backend={backend!r}, chunk_size={part}, max_in_flight={inflight}), "
            "prepared: save(data=...) with per-chunk CRC32C; load() verified",
        )

    return [row(*target) for target in targets]


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="256MiB")
    ap.add_argument("--part-size", default="8MiB")
    ap.add_argument("--in-flight", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument(
        "--with-saves",
        action="store_true",
        help="also rows of AsyncCheckpointer.save/load (the whole pipeline) through each backend",
    )
    args = ap.parse_args()
    size, part = parse_size(args.size), parse_size(args.part_size)
    data = bytearray(size)
    dgen_py.Generator(size=size, seed=1).fill_chunk(data)
    payload = bytes(data)
    samples: dict[tuple[str, str, str], list[float]] = {}
    with ExitStack() as stack:
        az = stack.enter_context(AzuriteServer())
        gcs = stack.enter_context(GcsEmulator())
        stack.enter_context(exported(az.env()))
        rows = azure_rows(az, az.create_container("bench"), part, args.in_flight)
        gcs_bucket = gcs.create_bucket("bench")
        rows += gcs_rows(gcs, gcs_bucket, part)
        rows.append(asyncckpt_gcs_row(gcs, gcs_bucket, part, stack.enter_context(ThreadPoolExecutor(4))))
        if args.with_saves:
            saves = az.create_container("saves")
            rows += asyncckpt_save_rows(stack, az, saves, gcs, gcs_bucket, part, args.in_flight)
        for r in range(args.repeat):
            for row in rows[r % len(rows) :] + rows[: r % len(rows)]:  # alternate, rotating order
                key = f"obj-{r}"
                put_s = timed(lambda row=row, key=key: row.put(key, payload))
                got: list[int] = []
                get_s = timed(lambda row=row, key=key, got=got: got.append(row.get(key)))
                if got != [size]:
                    raise RuntimeError(f"{row.store}/{row.client}: read back {got} bytes, want {size}")
                row.delete(key)
                if not row.client.endswith("(get only)"):
                    samples.setdefault((row.store, row.client, "put"), []).append(size / put_s / 1e9)
                samples.setdefault((row.store, row.client, "get"), []).append(size / get_s / 1e9)
        notes = {(row.store, row.client): row.note for row in rows}
    table = []
    for (store, client, op), values in samples.items():
        low, high = bootstrap_ci(values)
        table.append(
            {
                "store": store,
                "client": client,
                "op": op,
                "GB/s median": round(statistics.median(values), 3),
                "ci95": f"[{low:.3f}, {high:.3f}]",
                "runs": len(values),
                "samples": [round(v, 4) for v in values],
                "how": notes[(store, client)],
            }
        )
    headers = ["store", "client", "op", "GB/s median", "ci95", "runs"]
    extra = {"size": size, "part_size": part, "in_flight": args.in_flight, "repeat": args.repeat}
    emit("azure_gcs_clients", table, headers, extra)


if __name__ == "__main__":
    main()

"""One contract, every sink: file, memory and each S3 backend against each S3 server of
``--s3-server`` (moto, a mock, and OpenStack Swift, a real store).

The S3 objects are checked with an independent client (boto3), files by reading them.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from asyncckpt import TargetNotFoundError
from asyncckpt.servers.s3endpoint import S3Endpoint

from .conftest import ROOT, payload
from .plugins.s3servers import selected_kinds
from .s3_harness import CHUNK, Target, in_child, new_bucket, run_child_suite, s3_backends

LOCAL = () if in_child() else ("file", "memory")
SIZE = 2 * CHUNK + 12345  # three parts, the last one short


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``target``: each local sink once, each S3 backend on each selected server."""
    if "target" not in metafunc.fixturenames:
        return
    params = [pytest.param((b, ""), id=b) for b in LOCAL]
    for kind in selected_kinds(metafunc.config):
        marks = [pytest.mark.realstore] if kind == "swift" else []
        params += [pytest.param((b, kind), id=f"{b}-{kind}", marks=marks) for b in s3_backends()]
    metafunc.parametrize("target", params, indirect=True)


@pytest.fixture
def executor() -> Iterator[ThreadPoolExecutor]:
    pool = ThreadPoolExecutor(max_workers=8)
    yield pool
    pool.shutdown(wait=True)


@pytest.fixture
def target(request: pytest.FixtureRequest, executor: ThreadPoolExecutor, tmp_path: Path) -> Target:
    backend, kind = request.param
    if not kind:
        return Target(backend, executor, tmp_path)
    s3: S3Endpoint = request.getfixturevalue("s3_servers").get(kind)  # skips with the reason if absent
    return Target(backend, executor, tmp_path, s3=s3, bucket=new_bucket(s3), options=s3.options())


async def test_object_visible_only_after_complete_with_exact_bytes(target: Target) -> None:
    data = await payload(SIZE)
    sink = target.sink("obj")
    await sink.open(SIZE)
    view = memoryview(data)
    for offset in range(0, SIZE, CHUNK):
        await sink.write_part(offset, view[offset : offset + CHUNK])
        assert await target.published("obj") is None, "object visible before complete"
    await sink.complete()
    await sink.aclose()
    assert await target.published("obj") == bytes(data)
    assert await target.leftovers() == []


async def test_concurrent_writes_out_of_order(target: Target) -> None:
    data = await payload(SIZE)
    sink = target.sink("ooo")
    await sink.open(SIZE)
    view = memoryview(data)
    offsets = list(range(0, SIZE, CHUNK))[::-1]
    await asyncio.gather(*(sink.write_part(o, view[o : o + CHUNK]) for o in offsets))
    assert await target.published("ooo") is None
    await sink.complete()
    await sink.aclose()
    assert await target.published("ooo") == bytes(data)


async def test_abort_leaves_nothing(target: Target) -> None:
    data = await payload(SIZE)
    sink = target.sink("aborted")
    await sink.open(SIZE)
    view = memoryview(data)
    await sink.write_part(0, view[:CHUNK])
    await sink.abort()
    await sink.abort()  # idempotent
    await sink.aclose()
    assert await target.published("aborted") is None
    assert await target.leftovers() == []


async def test_small_object_below_one_part(target: Target) -> None:
    data = await payload(1000)
    sink = target.sink("small")
    await sink.open(1000)
    await sink.write_part(0, memoryview(data))
    assert await target.published("small") is None
    await sink.complete()
    await sink.aclose()
    assert await target.published("small") == bytes(data)


async def test_read_into_size_and_delete(target: Target) -> None:
    data = await payload(SIZE)
    writer = target.sink("rd")
    await writer.open(SIZE)
    view = memoryview(data)
    for offset in range(0, SIZE, CHUNK):
        await writer.write_part(offset, view[offset : offset + CHUNK])
    await writer.complete()
    await writer.aclose()

    sink = target.sink("rd")
    assert await sink.size() == SIZE
    buf = bytearray(4096)
    start = CHUNK - 1000  # across a part boundary
    assert await sink.read_into(start, memoryview(buf)) == 4096
    assert bytes(buf) == data[start : start + 4096]
    assert await sink.read_into(SIZE - 10, memoryview(buf)) == 10
    assert bytes(buf[:10]) == data[SIZE - 10 :]
    assert await sink.read_into(SIZE, memoryview(buf)) == 0
    await sink.delete()
    await sink.delete()  # absent: no error
    assert await target.published("rd") is None
    with pytest.raises(TargetNotFoundError):
        await sink.size()
    await sink.aclose()


async def test_size_of_missing_object_is_not_found(target: Target) -> None:
    sink = target.sink("never-written")
    with pytest.raises(TargetNotFoundError):
        await sink.size()
    await sink.aclose()


@pytest.mark.skipif(in_child(), reason="this is the launcher of the child suite")
def test_out_of_process_backends_pass_the_same_suite(s3_endpoint: S3Endpoint) -> None:
    """s3dlio and s3torchconnector run this module in a fresh process (fork safety, see harness)."""
    proc = run_child_suite(__file__, s3_endpoint)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-2000:]


@pytest.mark.skipif(in_child(), reason="runs once, from the main suite")
@pytest.mark.parametrize(
    "library",
    ["minio", "aiobotocore", pytest.param("s3torchconnectorclient", id="mountpoint")],
)
def test_the_harness_imports_the_client_library_before_the_tests_loop(library: str) -> None:
    """A CI run failed a test whose first ``sink()`` imported the client library on the loop
    (cold, from a fresh venv: 0.10-0.15 s asleep on the disk): the fixture imports it now, in a
    fresh interpreter here so the import is really the first. (Ids are not backend names: the
    child suite selects its tests by backend name.)"""
    backend = {"s3torchconnectorclient": "s3torchconnector"}.get(library, library)
    code = (
        "import sys\n"
        "from concurrent.futures import ThreadPoolExecutor\n"
        "from pathlib import Path\n"
        "from tests.s3_harness import Target\n"
        f"Target({backend!r}, ThreadPoolExecutor(1), Path('.'))\n"
        f"print({library!r} in sys.modules)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.stdout.strip() == "True", run.stdout + run.stderr

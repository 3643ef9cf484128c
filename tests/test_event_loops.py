"""One checkpointer, several event loops (issue 25 item 1).

Sync code calls ``asyncio.run`` more than once with one checkpointer. Before the fix the
second call failed with "Event loop is closed" (aiobotocore), or, through a writer process,
stalled until ``stall_timeout`` (nothing read the replies any more) and ``aclose`` raised
``CancelledError``. Each test here is a plain function that runs several loops, with a short
``stall_timeout`` so a regression fails in seconds instead of hanging. s3dlio, obstore and
s3torchconnector run in a child pytest process (``s3_harness``).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import warnings

import pytest

from asyncckpt import AsyncCheckpointer
from asyncckpt.servers.s3endpoint import S3Endpoint

from .s3_harness import CHUNK, in_child, new_bucket, run_child_suite

#: a regression stalls (no reply is read): it fails within this, not the default 20 s
STALL_S = 8.0
# (backend, isolation); None: the backend's default (s3dlio and obstore: a writer process)
CASES = (
    [("s3dlio", None), ("obstore", None), ("s3torchconnector", None)]
    if in_child()
    else [("aiobotocore", None), ("minio", None), ("aiobotocore", "process")]
)
IDS = [f"{b}-{i or 'default'}" for b, i in CASES]


def _checkpointer(ep: S3Endpoint, backend: str, isolation: str | None) -> AsyncCheckpointer:
    chosen = {} if isolation is None else {"isolation": isolation}
    return AsyncCheckpointer(
        chunk_size=CHUNK,
        num_buffers=3,
        backend=backend,
        backend_options=ep.options(),
        stall_timeout=STALL_S,
        **chosen,
    )


def _gone(pid: object) -> bool:
    """True when the writer process ``pid`` was reaped (or there was none)."""
    return pid is None or not os.path.exists(f"/proc/{pid}")


def _noise(caplog: pytest.LogCaptureFixture, caught: list[warnings.WarningMessage]) -> list[str]:
    """What a user would have seen: warnings and errors logged, resource warnings."""
    gc.collect()  # an unclosed client session says so when it is collected
    logged = [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= logging.WARNING]
    return logged + [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]


@pytest.mark.parametrize(("backend", "isolation"), CASES, ids=IDS)
def test_one_checkpointer_in_several_asyncio_runs(
    backend: str, isolation: str | None, moto_endpoint: S3Endpoint, caplog: pytest.LogCaptureFixture
) -> None:
    ep = moto_endpoint
    bucket = new_bucket(ep)
    ckpt = _checkpointer(ep, backend, isolation)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            saved = asyncio.run(ckpt.save(f"s3://{bucket}/a.bin", 2 * CHUNK))
            loaded = asyncio.run(ckpt.load(f"s3://{bucket}/a.bin"))  # verified against its footer
        finally:
            asyncio.run(ckpt.aclose())
        noise = _noise(caplog, caught)
    assert loaded.size_bytes == saved.size_bytes == 2 * CHUNK
    assert not noise, noise
    pids = [r.metadata.extra.get("writer_pid") for r in (saved, loaded)]
    if pids[0] is not None:  # a writer process per loop, each reaped as its loop ended
        assert len(set(pids)) == 2, pids
        assert all(_gone(pid) for pid in pids), pids


@pytest.mark.parametrize("isolation", ["none", "process"])
def test_a_loop_closed_without_shutdown(
    isolation: str, moto_endpoint: S3Endpoint, caplog: pytest.LogCaptureFixture
) -> None:
    """A loop closed without ``shutdown_asyncgens`` (``loop.close()`` after
    ``run_until_complete``) could not close what it made: the next loop replaces it without
    awaiting anything on the dead one, and the old writer process is reaped."""
    if in_child():
        pytest.skip("runs in the parent process")
    ep = moto_endpoint
    bucket = new_bucket(ep)
    ckpt = _checkpointer(ep, "aiobotocore", isolation)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loop = asyncio.new_event_loop()
        try:
            saved = loop.run_until_complete(ckpt.save(f"s3://{bucket}/a.bin", 2 * CHUNK))
        finally:
            loop.close()
        try:
            loaded = asyncio.run(ckpt.load(f"s3://{bucket}/a.bin"))
        finally:
            asyncio.run(ckpt.aclose())
        noise = _noise(caplog, caught)
    assert loaded.size_bytes == saved.size_bytes == 2 * CHUNK
    assert not noise, noise
    assert _gone(saved.metadata.extra.get("writer_pid"))


@pytest.mark.skipif(in_child(), reason="this is the launcher of the child suite")
def test_out_of_process_backends_too(moto_endpoint: S3Endpoint) -> None:
    proc = run_child_suite(__file__, moto_endpoint, "several_asyncio_runs")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "3 passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-2000:]

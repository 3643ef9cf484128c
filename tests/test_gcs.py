"""``gs://bucket/key`` (backend ``gcs``) through the public API on fake-gcs-server: round trips,
nothing visible before the final chunk, abort (the session DELETEd), integrity, the error table,
the stall watchdog, cleanup, settings and bad input.

Objects are checked with an independent client: JSON-API calls from the standard library
(``GcsEndpoint.request``), no asyncckpt sink code. Objects stay small: the emulator's resumable
path is slow (about 15 MB/s, docs/azure-gcs.md).
"""

from __future__ import annotations

import asyncio
import functools
import http.server
import json
import os
import re
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pytest

from asyncckpt import (
    AsyncCheckpointer,
    CheckpointManager,
    ChecksumMismatchError,
    ConfigError,
    IntegrityError,
    MiB,
    StallError,
    StorageError,
    StoragePermissionError,
    TargetNotFoundError,
)
from asyncckpt.secrets import Secret
from asyncckpt.servers.gcs_emulator import GcsEndpoint
from asyncckpt.sinks import leftovers
from asyncckpt.sinks.gcs import GcsSettings, parse_gs_uri
from asyncckpt.sinks.registry import capabilities

from .conftest import ROOT, holds_stream
from .gcs_token_server import KeyPair, TokenServer, key_pair
from .relay import FaultyFront
from .s3_harness import gcs_options

PART = 1 * MiB  # a multiple of 256 KiB, as GCS wants every chunk but the last


def checkpointer(ep: GcsEndpoint | str, **kw: object) -> AsyncCheckpointer:
    url = ep if isinstance(ep, str) else ep.url
    opts = {"endpoint_url": url, "max_attempts": 1}
    return AsyncCheckpointer(chunk_size=PART, num_buffers=4, backend_options=opts, **kw)  # type: ignore[arg-type]


def objects(ep: GcsEndpoint, bucket: str) -> list[str]:
    """Objects of ``bucket``, listed by an independent client."""
    status, body = ep.request("GET", f"/storage/v1/b/{bucket}/o")
    assert status == 200, body
    return sorted(item["name"] for item in json.loads(body).get("items", []))


def stored(ep: GcsEndpoint, bucket: str, key: str) -> bytes | None:
    status, body = ep.request("GET", f"/storage/v1/b/{bucket}/o/{quote(key, safe='')}?alt=media")
    return None if status == 404 else body


def is_chunk(line: str) -> bool:
    return line.startswith("PUT ") and "upload_id=" in line


def is_session_delete(line: str) -> bool:
    return line.startswith("DELETE ") and "upload_id=" in line


async def test_save_load_many_chunks_then_replace_and_delete(
    gcs_endpoint: GcsEndpoint, gcs_bucket: str
) -> None:
    ep, uri, size = gcs_endpoint, f"gs://{gcs_bucket}/ckpt/many.bin", 3 * PART + 12345
    async with checkpointer(ep, seed=7) as ckpt:
        saved = await ckpt.save(uri, size)
        body = await asyncio.to_thread(stored, ep, gcs_bucket, "ckpt/many.bin")
        loaded = await ckpt.load(uri)  # verified against the sealed manifest (CRC32C per chunk)
        await ckpt.save(uri, 1000)  # below one part: one simple upload
        assert (await ckpt.load(uri)).size_bytes == 1000
        await ckpt.delete(uri)
    assert saved.metadata.backend == "gcs" and saved.metadata.extra["parts"] == 4
    assert body is not None and await asyncio.to_thread(holds_stream, body, size, PART, 7)
    assert loaded.operation == "load" and loaded.size_bytes == size
    assert await asyncio.to_thread(objects, ep, gcs_bucket) == []


async def test_state_step_and_manager_round_trips(gcs_endpoint: GcsEndpoint, gcs_bucket: str) -> None:
    ep, root = gcs_endpoint, f"gs://{gcs_bucket}/run"
    state = {"w": np.arange(300_000, dtype=np.float32), "b": np.ones(7, dtype=np.int64)}
    async with checkpointer(ep) as ckpt:
        await ckpt.save_state(f"{root}/state.safetensors", state)
        got = await ckpt.load_state(f"{root}/state.safetensors")
        await ckpt.save_step(f"{root}/steps", 3, state)
        assert await ckpt.latest_step(f"{root}/steps") == 3
        step = await ckpt.load_step(f"{root}/steps")
    assert all(np.array_equal(got.state[k], v) for k, v in state.items())
    assert all(np.array_equal(step.state[k], v) for k, v in state.items())
    async with CheckpointManager(
        f"{root}/managed", every_n_steps=1, keep_last=1, chunk_size=PART, backend_options=gcs_options(ep)
    ) as mgr:
        for n in range(3):
            await mgr.maybe_save(n, {"x": np.full(10, n, dtype=np.int32)})
        await mgr.wait()
        assert [c.step for c in await mgr.steps()] == [2]
        assert await mgr.restore() == 2
    names = await asyncio.to_thread(objects, ep, gcs_bucket)
    assert not any("/managed/step-0" in n or "/managed/step-1" in n for n in names)


async def test_nothing_visible_before_the_final_chunk_and_abort_cancels_the_session(
    gcs_endpoint: GcsEndpoint, gcs_bucket: str
) -> None:
    ep, seen = gcs_endpoint, []
    written = 0

    def fail_after_two_chunks(nbytes: int) -> None:
        nonlocal written
        written += nbytes
        seen.append(objects(ep, gcs_bucket))  # chunks are up by now, the object is not
        if written >= 2 * PART:
            raise RuntimeError("training step failed")

    front = FaultyFront(ep.url, "pass", is_session_delete, times=0)
    relay = await front.start()
    try:
        async with checkpointer(relay) as ckpt:
            with pytest.raises(RuntimeError, match="training step failed"):
                await ckpt.save(f"gs://{gcs_bucket}/f.bin", 6 * PART, progress=fail_after_two_chunks)
    finally:
        await front.stop()
    assert seen and all(listed == [] for listed in seen)
    assert await asyncio.to_thread(objects, ep, gcs_bucket) == []
    assert len(front.matched) == 1, front.matched  # the session was cancelled (DELETE, 499)


# CI (the whole suite, twice): a socket-close callback here took 0.33 s with 0.005 s of CPU and
# 63-67 sleeps, the guard's sampler never running: the loop's thread waited for a GIL another
# thread held. Not reproduced alone or beside CPU hogs; the cause is not known.
@pytest.mark.gil_waits
async def test_a_cancelled_save_cancels_the_session(gcs_endpoint: GcsEndpoint, gcs_bucket: str) -> None:
    """The save's task cancelled while its second chunk is on the way (held by a relay): the
    session is DELETEd (seen by a second relay in front) and nothing appears."""
    ep = gcs_endpoint
    held = asyncio.Event()
    chunks = [0]

    def second_chunk(line: str) -> bool:
        chunks[0] += is_chunk(line)
        return is_chunk(line) and chunks[0] == 2

    inner = FaultyFront(ep.url, "stall", second_chunk, times=1, on_spoil=held.set)
    outer = FaultyFront(await inner.start(), "pass", is_session_delete, times=0)
    relay = await outer.start()
    try:
        async with checkpointer(relay) as ckpt:
            save = asyncio.ensure_future(ckpt.save(f"gs://{gcs_bucket}/c.bin", 4 * PART))
            await held.wait()
            save.cancel()
            with pytest.raises(asyncio.CancelledError):
                await save
    finally:
        await outer.stop()
        await inner.stop()
    assert len(outer.matched) == 1, outer.matched
    assert await asyncio.to_thread(objects, ep, gcs_bucket) == []


async def test_a_failed_save_over_a_checkpoint_leaves_it_and_nothing_for_cleanup(
    gcs_endpoint: GcsEndpoint, gcs_bucket: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ep = gcs_endpoint
    async with checkpointer(ep) as ckpt:
        await ckpt.save(f"gs://{gcs_bucket}/p/k.bin", PART + 1)  # the previous checkpoint
        with pytest.raises(RuntimeError, match="stop"):
            await ckpt.save(f"gs://{gcs_bucket}/p/k.bin", 4 * PART, progress=stop_at_once)
        assert (await ckpt.load(f"gs://{gcs_bucket}/p/k.bin")).size_bytes == PART + 1
    assert await leftovers.find(f"gs://{gcs_bucket}/p") == []
    note = leftovers.unlisted_note(f"gs://{gcs_bucket}/p")
    assert note is not None and "no call lists sessions" in note and "7 days" in note
    assert await asyncio.to_thread(objects, ep, gcs_bucket) == ["p/k.bin"]


def test_cleanup_says_there_is_nothing_to_list(gcs_endpoint: GcsEndpoint, gcs_bucket: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "asyncckpt.bench", "cleanup", f"gs://{gcs_bucket}/p"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **gcs_endpoint.env()},
    )
    assert done.returncode == 0, done.stderr
    assert f"nothing to list under gs://{gcs_bucket}/p" in done.stdout and "0 leftover(s)" in done.stdout


def stop_at_once(nbytes: int) -> None:
    raise RuntimeError("stop")


def corrupt(ep: GcsEndpoint, bucket: str, key: str, offset: int) -> None:
    """Replace the object with one byte flipped (an independent client's simple upload)."""
    body = bytearray(stored(ep, bucket, key) or b"")
    body[offset] ^= 0xFF
    path = f"/upload/storage/v1/b/{bucket}/o?uploadType=media&name={quote(key, safe='')}"
    status, answer = ep.request("POST", path, bytes(body), {"Content-Type": "application/octet-stream"})
    assert status == 200, answer


async def test_a_flipped_byte_is_refused_on_load(gcs_endpoint: GcsEndpoint, gcs_bucket: str) -> None:
    ep, uri = gcs_endpoint, f"gs://{gcs_bucket}/flip.bin"
    async with checkpointer(ep) as ckpt:
        await ckpt.save(uri, 2 * PART)
        await asyncio.to_thread(corrupt, ep, gcs_bucket, "flip.bin", PART + 17)
        with pytest.raises(ChecksumMismatchError) as info:
            await ckpt.load(uri)
    assert "flip.bin" in str(info.value) and "chunk 1 of 2" in str(info.value)


async def test_an_object_replaced_while_it_is_read_is_refused_by_name(
    gcs_endpoint: GcsEndpoint, gcs_bucket: str
) -> None:
    """Another save writes the key between two ranged reads of a load: the load asks for the
    generation its stat saw, and says the object was replaced (it read A's manifest and then B's
    bytes before: 'corrupt in chunk 0', or 'has no manifest'; CI met it in a crash test)."""
    ep, uri = gcs_endpoint, f"gs://{gcs_bucket}/moving.bin"
    async with checkpointer(ep) as ckpt:
        await ckpt.save(uri, 3 * PART)
    replaced: list[str] = []

    async def replace(line: str) -> None:
        if len(front.matched) == 2:  # the second ranged read, before it reaches the store
            await asyncio.to_thread(corrupt, ep, gcs_bucket, "moving.bin", 5)
            replaced.append(line)

    front = FaultyFront(ep.url, "pass", lambda line: "alt=media" in line, times=0, before=replace)
    relay = await front.start()
    try:
        async with checkpointer(relay) as ckpt:
            with pytest.raises(IntegrityError, match="replaced while it was being read") as info:
                await ckpt.load(uri, num_readers=1)
    finally:
        await front.stop()
    assert replaced and "generation=" in replaced[0]
    assert not isinstance(info.value, ChecksumMismatchError) and "gs://" in str(info.value)
    async with checkpointer(ep) as ckpt:  # read again, the new object is judged on its own
        with pytest.raises(ChecksumMismatchError):
            await ckpt.load(uri)


@pytest.mark.parametrize("size", [3 * PART + 99, 1000], ids=["resumable", "simple-upload"])
async def test_a_byte_flipped_on_the_way_is_an_integrity_error(
    gcs_endpoint: GcsEndpoint, gcs_bucket: str, size: int
) -> None:
    """fake-gcs-server stores what it received and ignores X-Goog-Hash: the backend's own
    comparison of the CRC32C it sent with the one the store answers is what catches it."""

    def last_request(line: str) -> bool:  # the final chunk, or the simple upload
        return (line.startswith("PUT ") and "upload_id=" in line) or "uploadType=media" in line

    ep = gcs_endpoint
    front = FaultyFront(ep.url, "flip", last_request, times=10)
    relay = await front.start()
    try:
        async with checkpointer(relay) as ckpt:
            with pytest.raises(IntegrityError, match="CRC32C") as info:
                await ckpt.save(f"gs://{gcs_bucket}/bad.bin", size)
    finally:
        await front.stop()
    assert "were sent" in str(info.value) and "gcs" in str(info.value)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Answering(http.server.BaseHTTPRequestHandler):
    """Answers every request with the server's ``status`` and GCS's JSON error; counts them."""

    def answer(self) -> None:
        status, reason = self.server.status  # type: ignore[attr-defined]
        self.server.count += 1  # type: ignore[attr-defined]
        n = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(n)
        err = {"code": status, "message": reason, "errors": [{"reason": reason, "message": reason}]}
        body = json.dumps({"error": err}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def answering() -> Iterator[http.server.ThreadingHTTPServer]:
    """A real HTTP server answering as GCS does when it refuses (status set by the test)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answering)
    server.status, server.count = (503, "backendError"), 0  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    thread.join()
    server.server_close()


ERROR_CASES = [
    "missing bucket",
    "missing bucket (save)",
    "missing object",
    "closed port",
    "wrong credential",
    "503",
]


@pytest.mark.parametrize("case", ERROR_CASES)
async def test_error_table(
    gcs_endpoint: GcsEndpoint, gcs_bucket: str, answering: http.server.ThreadingHTTPServer, case: str
) -> None:
    """Each row one line; the wrong credential against a server answering GCS's 401 (the emulator
    checks no credential at all: test_the_emulator_checks_no_credential)."""
    token = f"tok-{uuid.uuid4().hex}"
    opts: dict[str, object] = {"endpoint_url": gcs_endpoint.url, "max_attempts": 1, "token": Secret(token)}
    uri = f"gs://{gcs_bucket}/absent.bin"
    expected: type[StorageError] = TargetNotFoundError
    url = f"http://127.0.0.1:{answering.server_port}"
    if case.startswith("missing bucket"):
        uri = "gs://no-such-bucket/x.bin"
    elif case == "closed port":
        opts["endpoint_url"], expected = f"http://127.0.0.1:{free_port()}", StorageError
    elif case == "wrong credential":
        answering.status = (401, "Invalid Credentials")  # type: ignore[attr-defined]
        opts["endpoint_url"], expected = url, StoragePermissionError
    elif case == "503":
        opts.update(endpoint_url=url, max_attempts=3)
        expected = StorageError
    async with AsyncCheckpointer(chunk_size=PART, backend_options=opts) as ckpt:
        with pytest.raises(expected) as info:
            if case == "wrong credential":
                await ckpt.save(uri, 1000)
            elif case == "missing bucket (save)":
                await ckpt.save(uri, 2 * PART + 1)  # the resumable upload's start
            else:
                await ckpt.load(uri)
    text = str(info.value)
    assert "gcs" in text and token not in text and "\n" not in text, text
    assert "endpoint http://127.0.0.1:" in text  # where the requests went
    if case.startswith("missing bucket"):
        assert "no-such-bucket" in text
    if case == "closed port":
        assert "cannot reach the endpoint" in text and not isinstance(info.value, TargetNotFoundError)
    if case == "wrong credential":
        assert "HTTP 401" in text and "GOOGLE_OAUTH_ACCESS_TOKEN" in text
    if case == "503":
        assert "503" in text and "after retries" in text
        assert not isinstance(info.value, (TargetNotFoundError, StoragePermissionError))
        assert answering.count == 3  # type: ignore[attr-defined]  # retried, then given up


async def test_the_emulator_checks_no_credential(gcs_endpoint: GcsEndpoint, gcs_bucket: str) -> None:
    """Any bearer token works on fake-gcs-server: a wrong credential cannot be shown there."""
    opts = {"endpoint_url": gcs_endpoint.url, "token": Secret("certainly-wrong")}
    async with AsyncCheckpointer(chunk_size=PART, backend_options=opts) as ckpt:
        await ckpt.save(f"gs://{gcs_bucket}/t.bin", 1000)
        assert (await ckpt.load(f"gs://{gcs_bucket}/t.bin")).size_bytes == 1000


@pytest.mark.parametrize("where", ["first chunk", "final chunk"])
async def test_a_stalled_request_ends_in_a_stall_error(
    gcs_endpoint: GcsEndpoint, gcs_bucket: str, where: str
) -> None:
    """A relay that never forwards a chunk (the store stops answering mid-save): the generic
    watchdog ends the save, the session is cancelled, nothing appears."""
    ep, size = gcs_endpoint, 2 * PART + 5
    nth = 0 if where == "first chunk" else 2

    seen: list[str] = []

    def match(line: str) -> bool:
        if not is_chunk(line):
            return False
        seen.append(line)
        return len(seen) == nth + 1

    front = FaultyFront(ep.url, "stall", match, times=1)
    relay = await front.start()
    started = asyncio.get_running_loop().time()
    try:
        async with checkpointer(relay, stall_timeout=2.0) as ckpt:
            with pytest.raises(StallError):
                await ckpt.save(f"gs://{gcs_bucket}/stall.bin", size)
    finally:
        await front.stop()
    assert front.spoiled and asyncio.get_running_loop().time() - started < 30
    assert await asyncio.to_thread(objects, ep, gcs_bucket) == []


@pytest.mark.parametrize(
    "mode", ["token", "token closed port", "service-account key", "refused key", "malformed key"]
)
def test_secret_sweep(gcs_endpoint: GcsEndpoint, gcs_bucket: str, mode: str, tmp_path: Path) -> None:
    """A distinctive token or service-account key reaches no output channel (library and CLI,
    DEBUG logs of every logger, reprs, errors) and is never in a child's argv. A key (from a
    file) is exchanged at a local token endpoint (tests/gcs_token_server.py): neither its PEM
    nor the tokens issued for it appear; refused, and malformed, neither does."""
    distinct = f"Sweep-{uuid.uuid4().hex}-Secret"
    endpoint = (
        gcs_endpoint.url if mode in ("token", "service-account key") else f"http://127.0.0.1:{free_port()}"
    )
    keys = sweep_keys()
    with TokenServer(keys, "sweep@asyncckpt-test.iam.gserviceaccount.com") as tokens:
        spec: dict[str, object] = {"uri": f"gs://{gcs_bucket}/sweep.bin"}
        if mode.endswith("key"):
            key = tokens.key_info()
            if mode == "malformed key":
                key["private_key"] = distinct
            tokens.refuse = mode == "refused key"
            (tmp_path / "sa.json").write_text(json.dumps(key))
            spec.update(options={"endpoint_url": gcs_endpoint.url}, key_file=str(tmp_path / "sa.json"))
            outcome = {"service-account key": "saved", "refused key": "StoragePermissionError"}.get(
                mode, "ConfigError"
            )
        else:
            spec["options"] = {"token": distinct, "endpoint_url": endpoint}
            outcome = "saved" if mode == "token" else "StorageError"
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "S3_", "GOOGLE_", "STORAGE_"))
        }
        proc = subprocess.run(
            [sys.executable, "-m", "tests.gcs_sweep_driver", json.dumps(spec)],
            capture_output=True,
            text=True,
            timeout=180,
            cwd=tmp_path,
            env={**env, "PYTHONPATH": str(ROOT)},
        )
        issued = tokens.issued
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert f"LIBRARY-OUTCOME {outcome}" in proc.stdout, output[-3000:]
    good = mode in ("token", "service-account key")
    assert ("CLI-EXIT 0" if good else "CLI-EXIT") in proc.stdout, output[-3000:]
    assert (len(issued) >= 2) == (mode == "service-account key"), issued  # the library's and the CLI's
    needles = [distinct, *issued, *keys.body_lines()]
    leaked = [line[:300] for line in output.splitlines() if any(n in line for n in needles)]
    assert not leaked, leaked
    assert "Secret('**********')" in proc.stdout


@functools.cache
def sweep_keys() -> KeyPair:
    return key_pair()


def test_settings_sources_and_no_secret_in_them(tmp_path: Path) -> None:
    emulator = GcsEndpoint("http://127.0.0.1:9")
    s = GcsSettings.resolve({}, env=emulator.env(), cwd=tmp_path)
    assert (s.endpoint_url, s.emulator, s.token, s.project) == (emulator.url, True, None, "asyncckpt-test")
    assert s.sources["endpoint_url"] == "environment STORAGE_EMULATOR_HOST"
    # the emulator's JSON alone names it too (obstore's convention)
    only_json = {"GOOGLE_SERVICE_ACCOUNT_KEY": emulator.service_account_key()}
    assert GcsSettings.resolve({}, env=only_json, cwd=tmp_path).endpoint_url == emulator.url
    real = GcsSettings.resolve({}, env={"GOOGLE_OAUTH_ACCESS_TOKEN": "ya29.secret"}, cwd=tmp_path)
    assert real.endpoint_url == "https://storage.googleapis.com" and real.token == Secret("ya29.secret")
    assert "ya29.secret" not in repr(real) + str(real) + str(real.describe())
    (tmp_path / ".env").write_text("STORAGE_EMULATOR_HOST=127.0.0.1:4443\n")
    from_file = GcsSettings.resolve({}, env={}, cwd=tmp_path)
    assert from_file.endpoint_url == "http://127.0.0.1:4443" and from_file.sources["endpoint_url"].startswith(
        ".env"
    )


def test_bad_settings_are_refused_before_any_io(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no GCS credential"):
        GcsSettings.resolve({"dotenv": False}, env={})
    with pytest.raises(ConfigError, match="unknown GCS backend option"):
        GcsSettings.resolve({"tokn": "x"}, env={})
    key = json.dumps({"type": "service_account", "private_key": "PRIVATE-xyz"})
    with pytest.raises(ConfigError, match="lacks the field") as info:
        GcsSettings.resolve({"service_account_key": key, "dotenv": False}, env={})
    assert "PRIVATE-xyz" not in str(info.value)
    creds = tmp_path / "sa.json"
    creds.write_text(key)
    with pytest.raises(ConfigError, match=re.escape(f"(the file {str(creds)!r})")):
        GcsSettings.resolve({"dotenv": False}, env={"GOOGLE_APPLICATION_CREDENTIALS": str(creds)})
    with pytest.raises(ConfigError, match=r"no-such\.json"):
        GcsSettings.resolve({"dotenv": False}, env={"GOOGLE_APPLICATION_CREDENTIALS": "/no-such.json"})
    with pytest.raises(ConfigError, match="not a JSON object"):
        GcsSettings.resolve({"service_account_key": "PRIVATE not json", "dotenv": False}, env={})
    with pytest.raises(ConfigError, match="must look like http"):
        GcsSettings.resolve({"endpoint_url": "ftp://x", "dotenv": False}, env={})
    with pytest.raises(ConfigError, match="not a multiple of 256 KiB"):
        GcsSettings.resolve({"endpoint_url": "http://x:1", "part_size": 1000}, env={})
    # too large for a float: it was a raw OverflowError
    with pytest.raises(ConfigError, match="request_timeout must be a number of seconds > 0"):
        GcsSettings.resolve({"endpoint_url": "http://x:1", "request_timeout": 10**400}, env={})


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("gs://Bad_Name/x", "invalid bucket name 'Bad_Name'"),
        ("gs://ab/x", "invalid bucket name 'ab'"),
        ("gs://goog-bucket/x", "invalid bucket name 'goog-bucket'"),
        ("gs://192.168.1.1/x", "invalid bucket name '192.168.1.1'"),
        ("gs://good-name", "names no object"),
        ("gs://good-name/", "names no object"),
        ("gs://good-name/dir/", "names no object"),
        ("gs://good-name/x?generation=1", "has a query"),
    ],
)
def test_bad_uri_is_refused_naming_it(uri: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_gs_uri(uri)


async def test_bad_uri_is_refused_by_save_before_any_io(gcs_endpoint: GcsEndpoint) -> None:
    front = FaultyFront(gcs_endpoint.url, "pass", lambda line: True, times=0)
    relay = await front.start()
    try:
        async with checkpointer(relay) as ckpt:
            with pytest.raises(ConfigError, match="invalid bucket name 'Bad_Name'"):
                await ckpt.save("gs://Bad_Name/x.bin", 1000)
            with pytest.raises(ConfigError, match="names no object"):
                await ckpt.save("gs://bucket-1", 1000)
        odd = {"endpoint_url": relay}
        async with AsyncCheckpointer(chunk_size=409_600, backend_options=odd) as ckpt:
            with pytest.raises(ConfigError, match="chunk_size 409600 B is not a multiple of 256 KiB"):
                await ckpt.save("gs://bucket-1/x.bin", 1000)
    finally:
        await front.stop()
    assert front.connections == 0  # refused before any request


def test_gs_is_asked_by_capability() -> None:
    cls = capabilities("gs://b-1/x")
    assert cls.backend == "gcs" and not cls.needs_isolation and cls.can_list and cls.keeps_data


async def test_a_writer_process_when_asked(gcs_endpoint: GcsEndpoint, gcs_bucket: str) -> None:
    """aiohttp needs no writer process (no runtime of its own, nothing a fork breaks), but
    ``isolation="process"`` runs the sink in one like any other."""
    uri = f"gs://{gcs_bucket}/iso.bin"
    async with checkpointer(gcs_endpoint, isolation="process") as ckpt:
        saved = await ckpt.save(uri, 3 * PART + 5)
        loaded = await ckpt.load(uri)
    assert saved.metadata.extra["isolation"] == "process" and saved.metadata.extra["parts"] == 4
    assert loaded.size_bytes == 3 * PART + 5


def test_bench_on_a_gs_target_with_the_emulator_variables(gcs_endpoint: GcsEndpoint, gcs_bucket: str) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "asyncckpt.bench",
            f"gs://{gcs_bucket}/b.bin",
            *("--size", "2MiB", "--chunk-size", "1MiB", "-q"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **gcs_endpoint.env()},
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert re.search(r"load\s+streaming", done.stdout), done.stdout

"""``az://container/key`` (backend ``obstore-azure``) through the public API on Azurite, the real
Azure Blob emulator: round trips, nothing visible before commit, abort, the error table, secrets.

Blobs are checked with an independent client: SharedKey-signed REST calls from the standard
library (``AzureEndpoint.request``), no asyncckpt sink code.
"""

from __future__ import annotations

import asyncio
import base64
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
    UnsupportedSchemeError,
)
from asyncckpt.secrets import Secret
from asyncckpt.servers.azurite import ACCOUNT_KEY, AzureEndpoint
from asyncckpt.sinks import leftovers
from asyncckpt.sinks.azure.config import AzureSettings, parse_az_uri
from asyncckpt.sinks.registry import capabilities

from .conftest import ROOT, holds_stream, run_bench
from .s3_harness import azure_options

PART = 5 * MiB
BLOBS = re.compile(rb"<Name>([^<]*)</Name>")


BACKENDS = ("obstore-azure", "s3dlio-azure")


def checkpointer(ep: AzureEndpoint, backend: str = "obstore-azure", **kw: object) -> AsyncCheckpointer:
    opts = azure_options(ep, backend, max_attempts=1)
    return AsyncCheckpointer(chunk_size=PART, num_buffers=4, backend=backend, backend_options=opts, **kw)


def blobs(ep: AzureEndpoint, container: str) -> list[str]:
    """Committed blobs of ``container``, listed by an independent client."""
    status, body = ep.request("GET", f"/{container}", query={"restype": "container", "comp": "list"})
    assert status == 200, body
    return sorted(name.decode() for name in BLOBS.findall(body))


def blob(ep: AzureEndpoint, container: str, key: str) -> bytes | None:
    status, body = ep.request("GET", f"/{container}/{key}")
    return None if status == 404 else body


async def test_save_load_many_blocks_then_replace_and_delete(
    azurite_endpoint: AzureEndpoint, az_container: str
) -> None:
    ep, uri, size = azurite_endpoint, f"az://{az_container}/ckpt/many.bin", 3 * PART + 12345
    async with checkpointer(ep, seed=7) as ckpt:
        saved = await ckpt.save(uri, size)
        body = await asyncio.to_thread(blob, ep, az_container, "ckpt/many.bin")
        loaded = await ckpt.load(uri)  # verified against the sealed manifest (CRC32C per chunk)
        await ckpt.save(uri, 1000)
        assert (await ckpt.load(uri)).size_bytes == 1000
        await ckpt.delete(uri)
    assert saved.metadata.extra["parts"] == 4  # blocks of the data blob
    assert body is not None and await asyncio.to_thread(holds_stream, body, size, PART, 7)
    assert loaded.operation == "load" and loaded.size_bytes == size
    assert await asyncio.to_thread(blobs, ep, az_container) == []


def corrupt(ep: AzureEndpoint, container: str, key: str, offset: int) -> None:
    """Replace the committed blob with one byte flipped (an independent client's Put Blob)."""
    body = bytearray(blob(ep, container, key) or b"")
    body[offset] ^= 0xFF
    headers = {"x-ms-blob-type": "BlockBlob", "Content-Type": "application/octet-stream"}
    status, answer = ep.request("PUT", f"/{container}/{key}", body=bytes(body), headers=headers)
    assert status == 201, answer


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_flipped_byte_is_refused_on_load(
    azurite_endpoint: AzureEndpoint, az_container: str, backend: str
) -> None:
    ep, uri = azurite_endpoint, f"az://{az_container}/flip.bin"
    async with checkpointer(ep, backend) as ckpt:
        await ckpt.save(uri, 2 * PART)
        await asyncio.to_thread(corrupt, ep, az_container, "flip.bin", PART + 17)
        with pytest.raises(ChecksumMismatchError) as info:
            await ckpt.load(uri)
    assert "flip.bin" in str(info.value) and "chunk 1 of 2" in str(info.value)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_blob_replaced_while_it_is_read_is_named_not_corrupt(
    azurite_endpoint: AzureEndpoint, az_container: str, backend: str
) -> None:
    """Another client puts the blob again (one byte changed, far ahead) between two ranged reads
    of a load: the load says the blob was replaced, by ``If-Match`` or by comparing the ETag
    once the checksum failed; before, it called the checkpoint corrupt."""
    ep, uri = azurite_endpoint, f"az://{az_container}/moving.bin"
    replaced: list[int] = []
    async with checkpointer(ep, backend) as ckpt:
        await ckpt.save(uri, 6 * PART)
        stream = ckpt.iter_load(uri, num_readers=1)  # four buffers: chunk 4 waits for the first
        with pytest.raises(IntegrityError, match="replaced while it was being read") as info:
            async with stream:
                async for _ in stream:
                    if not replaced:
                        await asyncio.to_thread(corrupt, ep, az_container, "moving.bin", 5 * PART + 17)
                        replaced.append(stream.offset)
    assert replaced == [0]
    assert not isinstance(info.value, ChecksumMismatchError) and "moving.bin" in str(info.value)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_state_step_and_manager_round_trips(
    azurite_endpoint: AzureEndpoint, az_container: str, backend: str
) -> None:
    ep, root = azurite_endpoint, f"az://{az_container}/run"
    state = {"w": np.arange(300_000, dtype=np.float32), "b": np.ones(7, dtype=np.int64)}
    async with checkpointer(ep, backend) as ckpt:
        await ckpt.save_state(f"{root}/state.safetensors", state)
        got = await ckpt.load_state(f"{root}/state.safetensors")
        await ckpt.save_step(f"{root}/steps", 3, state)
        assert await ckpt.latest_step(f"{root}/steps") == 3
        step = await ckpt.load_step(f"{root}/steps")
    assert all(np.array_equal(got.state[k], v) for k, v in state.items())
    assert all(np.array_equal(step.state[k], v) for k, v in state.items())
    async with CheckpointManager(
        f"{root}/managed",
        every_n_steps=1,
        keep_last=1,
        chunk_size=PART,
        backend=backend,
        backend_options=azure_options(ep, backend),
    ) as mgr:
        for n in range(3):
            await mgr.maybe_save(n, {"x": np.full(10, n, dtype=np.int32)})
        await mgr.wait()
        assert [c.step for c in await mgr.steps()] == [2]
        assert await mgr.restore() == 2
    names = await asyncio.to_thread(blobs, ep, az_container)
    assert not any("/managed/step-0" in n or "/managed/step-1" in n for n in names)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_nothing_visible_before_commit_and_abort_leaves_nothing(
    azurite_endpoint: AzureEndpoint, az_container: str, backend: str
) -> None:
    ep, seen = azurite_endpoint, []
    written = 0

    def fail_after_two_chunks(nbytes: int) -> None:
        nonlocal written
        written += nbytes
        seen.append(blobs(ep, az_container))  # blocks of two chunks are up by now, uncommitted
        if written >= 2 * PART:
            raise RuntimeError("training step failed")

    async with checkpointer(ep, backend) as ckpt:
        with pytest.raises(RuntimeError, match="training step failed"):
            await ckpt.save(f"az://{az_container}/f.bin", 6 * PART, progress=fail_after_two_chunks)
    assert seen and all(listed == [] for listed in seen)
    assert await asyncio.to_thread(blobs, ep, az_container) == []


async def test_a_failed_save_leaves_nothing_for_cleanup(
    azurite_endpoint: AzureEndpoint, az_container: str
) -> None:
    """Blocks of a save that never committed are invisible to ordinary listings and reads and
    are left to Azure's garbage collection (only ``include=uncommittedblobs`` names them); a
    checkpoint already at that name is untouched; cleanup has nothing it may remove."""
    ep = azurite_endpoint
    async with checkpointer(ep) as ckpt:
        await ckpt.save(f"az://{az_container}/p/k.bin", PART + 1)  # the previous checkpoint
        with pytest.raises(RuntimeError, match="stop"):
            await ckpt.save(f"az://{az_container}/p/k.bin", 4 * PART, progress=stop_at_once)
        assert (await ckpt.load(f"az://{az_container}/p/k.bin")).size_bytes == PART + 1
    assert await leftovers.find(f"az://{az_container}/p") == []
    assert await asyncio.to_thread(blobs, ep, az_container) == ["p/k.bin"]


def stop_at_once(nbytes: int) -> None:
    raise RuntimeError("stop")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


ERROR_CASES = [
    *[(b, c) for b in BACKENDS for c in ("missing container", "missing blob", "wrong credential")],
    ("obstore-azure", "closed port"),  # s3dlio retries a dead endpoint for over a minute: its watchdog's
]


@pytest.mark.parametrize(("backend", "case"), ERROR_CASES)
async def test_error_table(
    azurite_endpoint: AzureEndpoint, az_container: str, backend: str, case: str
) -> None:
    ep = azurite_endpoint
    opts = azure_options(ep, backend, max_attempts=1)
    uri = f"az://{az_container}/absent.bin"
    expected: type[StorageError] = TargetNotFoundError
    if case == "missing container":
        uri = "az://no-such-container/x.bin"
    elif case == "wrong credential" and backend == "s3dlio-azure":
        opts["sas_token"] = Secret(ep.sas().reveal().rsplit("sig=", 1)[0] + "sig=AAAA")
        expected = StoragePermissionError
    elif case == "wrong credential":
        opts["account_key"] = Secret(base64.b64encode(b"wrong" * 13).decode())
        expected = StoragePermissionError
    elif case == "closed port":
        opts["endpoint_url"], expected = f"http://127.0.0.1:{free_port()}/{ep.account}", StorageError
    async with AsyncCheckpointer(chunk_size=PART, backend=backend, backend_options=opts) as ckpt:
        with pytest.raises(expected) as info:
            await (ckpt.load(uri) if case != "wrong credential" else ckpt.save(uri, 1000))
    text = str(info.value)
    assert backend in text and ACCOUNT_KEY.reveal() not in text
    assert ep.sas().reveal().rsplit("sig=", 1)[1] not in text
    if case == "closed port":
        assert "cannot reach the endpoint" in text
    if case == "missing container":
        assert "no-such-container" in text


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_store_error_is_one_line_with_the_servers_code_and_message(
    azurite_endpoint: AzureEndpoint, backend: str
) -> None:
    """Azure's message ends in ``RequestId:`` and ``Time:`` lines (obstore-azure printed three
    lines), and s3dlio's text gave ``404: <?xml version="1.0" ...?>`` and nothing of the error."""
    opts = azure_options(azurite_endpoint, backend, max_attempts=1)
    async with AsyncCheckpointer(chunk_size=PART, backend=backend, backend_options=opts) as ckpt:
        with pytest.raises(TargetNotFoundError) as saving:
            await ckpt.save("az://no-such-container/x.bin", 1000)
        with pytest.raises(TargetNotFoundError) as listing:
            async with CheckpointManager("az://no-such-container/run", checkpointer=ckpt) as mgr:
                await mgr.restore()
    for caught in (saving, listing):
        text = str(caught.value)
        assert "\n" not in text and "RequestId" not in text and "Time:" not in text and "<?xml" not in text
        assert "ContainerNotFound: The specified container does not exist." in text, text


def test_ls_of_an_az_root_and_its_help_naming_the_schemes(
    azurite_endpoint: AzureEndpoint, az_container: str, tmp_path: Path
) -> None:
    """``ls --help`` said "a directory or s3://bucket/prefix", so a user of az:// was left to
    guess; ``ls`` of an az:// root lists its steps (credentials from the AZURE_* variables)."""
    shown = run_bench("ls", "--help", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    text = " ".join(shown.stdout.split())
    for scheme in ("az://container/prefix", "s3://bucket/prefix", "file://", "direct://"):
        assert scheme in text, text
    assert "AZURE_STORAGE_" in text and "AWS_" in text
    root = f"az://{az_container}/run"

    async def one_step() -> None:
        options = azure_options(azurite_endpoint, "obstore-azure")
        async with CheckpointManager(root, chunk_size=PART, backend_options=options) as mgr:
            await mgr.maybe_save(4, {"x": np.zeros(10, np.int32)}, metrics={"loss": 0.5})

    asyncio.run(one_step())
    listed = run_bench("ls", root, cwd=tmp_path, env=azurite_endpoint.env())
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[2].split()[:2] == ["4", "committed"]
    assert listed.stdout.splitlines()[-1] == f"1 step(s) under {root}, 1 committed"


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that completes TCP handshakes (the kernel's backlog) and never answers: what a
    stopped server looks like."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        yield int(s.getsockname()[1])


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_silent_endpoint_ends_in_a_stall_error(
    azurite_endpoint: AzureEndpoint, silent_port: int, backend: str
) -> None:
    """s3dlio retries such an endpoint for over a minute; the watchdog ends the save."""
    opts = azure_options(
        azurite_endpoint, backend, endpoint_url=f"http://127.0.0.1:{silent_port}/devstoreaccount1"
    )
    started = asyncio.get_running_loop().time()
    async with AsyncCheckpointer(
        chunk_size=PART, stall_timeout=2.0, backend=backend, backend_options=opts
    ) as ckpt:
        with pytest.raises(StallError):
            await ckpt.save("az://c-1/x.bin", 2 * PART)
    assert asyncio.get_running_loop().time() - started < 30


def test_s3dlio_refuses_an_account_key_before_any_io(azurite_endpoint: AzureEndpoint) -> None:
    async def save() -> None:
        async with AsyncCheckpointer(
            chunk_size=PART, backend="s3dlio-azure", backend_options=azure_options(ep)
        ) as ckpt:
            await ckpt.save("az://c-1/x.bin", 1000)

    ep = azurite_endpoint
    with pytest.raises(ConfigError, match="s3dlio-azure' needs a SAS token"):
        asyncio.run(save())


class Busy(http.server.BaseHTTPRequestHandler):
    """Azure's answer when it throttles: 503 with the ServerBusy code, to every request."""

    def answer(self) -> None:
        body = b"<?xml version='1.0'?><Error><Code>ServerBusy</Code><Message>busy</Message></Error>"
        self.send_response(503)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_HEAD = do_PUT = do_DELETE = answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A real HTTP server that answers every request 503 ServerBusy (stopped off the loop)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Busy)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_port
    server.shutdown()
    thread.join()
    server.server_close()


async def test_503_is_unavailable_after_retries(busy_port: int) -> None:
    key = base64.b64encode(b"k" * 64).decode()
    opts = {"account": "acct", "account_key": key, "endpoint_url": f"http://127.0.0.1:{busy_port}/acct"}
    async with AsyncCheckpointer(chunk_size=PART, backend_options={**opts, "max_attempts": 1}) as ckpt:
        with pytest.raises(StorageError, match="503 Server Busy after retries") as info:
            await ckpt.load("az://busy/x.bin")
    assert not isinstance(info.value, (TargetNotFoundError, StoragePermissionError)) and key not in str(
        info.value
    )


@pytest.mark.parametrize("mode", ["wrong key", "wrong sas", "closed port"])
def test_secret_sweep(azurite_endpoint: AzureEndpoint, az_container: str, mode: str, tmp_path: Path) -> None:
    """A distinctive key or SAS reaches no output channel (library and CLI, DEBUG logs)."""
    ep = azurite_endpoint
    secret = distinct = base64.b64encode(f"Sweep-{uuid.uuid4().hex}-Secret".encode()).decode()
    credential = "sas_token" if mode == "wrong sas" else "account_key"
    endpoint = ep.account_url if mode != "closed port" else f"http://127.0.0.1:{free_port()}/{ep.account}"
    if mode == "wrong sas":
        secret = f"sv=2021-08-06&ss=b&srt=sco&sp=rwdlac&se=2099-01-01T00:00:00Z&sig={distinct}"
    options = {"account": ep.account, credential: secret, "endpoint_url": endpoint}
    spec = {"options": options, "uri": f"az://{az_container}/sweep.bin"}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "S3_", "AZURE_"))}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.azure_sweep_driver", json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(ROOT)},
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    outcome = "StorageError" if mode == "closed port" else "StoragePermissionError"
    assert f"LIBRARY-OUTCOME {outcome}" in proc.stdout, output[-3000:]
    assert "CLI-EXIT 1" in proc.stdout, output[-3000:]
    leaked = [line[:300] for line in output.splitlines() if distinct in line]
    assert not leaked, leaked
    assert "Secret('**********')" in proc.stdout


def test_settings_from_the_connection_string_never_print_secrets(azurite_endpoint: AzureEndpoint) -> None:
    ep = azurite_endpoint
    env = {"AZURE_STORAGE_CONNECTION_STRING": ep.connection_string().reveal()}
    s = AzureSettings.resolve({}, env=env)
    assert (s.account, s.endpoint_url, s.account_key) == (ep.account, ep.account_url, ep.key)
    assert s.sources["account_key"].startswith("connection string")
    assert ep.key.reveal() not in repr(s) + str(s) + str(s.describe())
    sas = AzureSettings.resolve(
        {}, env={"AZURE_STORAGE_ACCOUNT": "a", "AZURE_STORAGE_SAS_TOKEN": "sv=1&sig=zz"}
    )
    assert sas.sas_token == Secret("sv=1&sig=zz") and "sig=zz" not in repr(sas)


async def test_settings_from_a_dotenv_file_as_for_s3(
    azurite_endpoint: AzureEndpoint, az_container: str, tmp_path: Path
) -> None:
    """A ``.env`` beside the run (or named by ``dotenv``) is the last source: the environment
    beats it, a named file that is missing is refused naming it, and a save and load on
    Azurite work with every setting from the file."""
    ep = azurite_endpoint
    dotenv = tmp_path / ".env"
    line = f"export AZURE_STORAGE_CONNECTION_STRING='{ep.connection_string().reveal()}'"
    dotenv.write_text(f"# Azurite\n{line}\n")
    s = AzureSettings.resolve({}, env={}, cwd=tmp_path)
    assert (s.account, s.endpoint_url, s.account_key) == (ep.account, ep.account_url, ep.key)
    assert s.sources["connection_string"] == ".env AZURE_STORAGE_CONNECTION_STRING"
    assert ep.key.reveal() not in repr(s) + str(s.describe())
    first = AzureSettings.resolve({}, env={"AZURE_STORAGE_ACCOUNT": "mine"}, cwd=tmp_path)
    assert first.account == "mine" and first.sources["account"] == "environment AZURE_STORAGE_ACCOUNT"
    assert AzureSettings.resolve({"dotenv": False, "account": "a"}, env={}, cwd=tmp_path).account_key is None
    with pytest.raises(ConfigError, match=re.escape(f"dotenv={str(tmp_path / 'nope')!r}: no such file")):
        AzureSettings.resolve({"dotenv": str(tmp_path / "nope")}, env={})
    uri = f"az://{az_container}/from-dotenv.bin"
    opts = {"dotenv": str(dotenv)}
    async with AsyncCheckpointer(chunk_size=PART, num_buffers=4, backend_options=opts) as ckpt:
        saved = await ckpt.save(uri, PART + 7)
        loaded = await ckpt.load(uri)
    assert saved.size_bytes == loaded.size_bytes == PART + 7  # the load verified it (CRC32C per chunk)


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("az://Bad_Name/x", "invalid container name 'Bad_Name'"),
        ("az://ab/x", "invalid container name 'ab'"),
        ("az://good-name", "names no blob"),
        ("az://good-name/dir/", "names no blob"),
    ],
)
def test_bad_uri_is_refused_naming_it(uri: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_az_uri(uri)


def test_bad_settings_are_refused_before_any_io() -> None:
    with pytest.raises(ConfigError, match="no Azure storage account"):
        AzureSettings.resolve({}, env={})
    with pytest.raises(ConfigError, match="unknown Azure backend option"):
        AzureSettings.resolve({"acount": "x"}, env={})
    with pytest.raises(ConfigError, match="not both"):
        AzureSettings.resolve({"account": "a", "account_key": "k", "sas_token": "s"}, env={})
    with pytest.raises(ConfigError, match=r"account key \(backend_options\) is not valid base64") as info:
        AzureSettings.resolve({"account": "a", "account_key": "not base64!"}, env={})
    assert "not base64!" not in str(info.value)
    with pytest.raises(
        ConfigError, match=r"SAS token \(environment AZURE_STORAGE_SAS_TOKEN\) is not a query"
    ):
        AzureSettings.resolve({}, env={"AZURE_STORAGE_ACCOUNT": "a", "AZURE_STORAGE_SAS_TOKEN": "justsecret"})
    with pytest.raises(ConfigError, match="not valid base64"):  # at construction, no URI yet
        AsyncCheckpointer(backend_options={"account": "a", "account_key": "not base64!"})
    with pytest.raises(ConfigError, match="must look like http"):
        AzureSettings.resolve({"account": "a", "endpoint_url": "ftp://x"}, env={})
    # too large for a float: it was a raw OverflowError
    with pytest.raises(ConfigError, match="connect_timeout must be a number of seconds > 0"):
        AzureSettings.resolve({"account": "a", "connect_timeout": 10**400}, env={})


def test_az_is_isolated_by_capability() -> None:
    assert capabilities("az://c-1/x").needs_isolation
    with pytest.raises(UnsupportedSchemeError, match="unsupported URI scheme 'gcs'"):
        capabilities("gcs://bucket/x")


def test_bench_embedded_azure_runs_and_leaves_no_secret(azurite_endpoint: AzureEndpoint) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "asyncckpt.bench", "--embedded-store", "azure", "--size", "8MiB", "-q"],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    for secret in (ACCOUNT_KEY.reveal(), AzureEndpoint("http://unused").sas().reveal().rsplit("sig=", 1)[1]):
        assert secret not in done.stdout + done.stderr

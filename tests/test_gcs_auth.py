"""A GCS service-account key exchanged for bearer tokens (google-auth), against a real local
token endpoint (tests/gcs_token_server.py: checks the JWT grant, verifies its RS256 signature
against the public key of a key pair made here) and fake-gcs-server behind a relay that
records every request's head: the token reaches the store, one credential per store, a refresh
when the token expires, the token endpoint's refusal and absence, bad keys before any I/O,
the precedence of credentials.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from asyncckpt import AsyncCheckpointer, ConfigError, MiB, StorageError, StoragePermissionError
from asyncckpt.secrets import Secret
from asyncckpt.servers.gcs_emulator import GcsEndpoint
from asyncckpt.sinks.gcs import GcsSettings

from .conftest import ROOT
from .gcs_token_server import GOOGLE_AUDIENCE, KeyPair, TokenServer, key_pair
from .relay import FaultyFront
from .test_gcs import free_port, objects

PART = 1 * MiB
EMAIL = "ckpt-writer@asyncckpt-test.iam.gserviceaccount.com"
_BEARER = re.compile(r"\r\nauthorization: bearer (\S+)", re.IGNORECASE)


@pytest.fixture(scope="module")
def keys() -> KeyPair:
    return key_pair()


@pytest.fixture(autouse=True)
def no_gcs_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The settings read only what each test gives them."""
    for name in ("STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_SERVICE_ACCOUNT_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("GOOGLE_OAUTH_ACCESS_TOKEN", raising=False)


@pytest.fixture
def tokens(keys: KeyPair) -> Iterator[TokenServer]:
    with TokenServer(keys, EMAIL) as server:
        yield server


@pytest.fixture
async def relay(gcs_endpoint: GcsEndpoint) -> AsyncIterator[tuple[FaultyFront, str]]:
    """A relay before fake-gcs-server recording the head of every request."""
    front = FaultyFront(gcs_endpoint.url, "pass", lambda line: True, times=0)
    url = await front.start()
    try:
        yield front, url
    finally:
        await front.stop()


def bearers(front: FaultyFront) -> list[str | None]:
    """The bearer token of each request the store received, in order (None: no header)."""
    return [m.group(1) if (m := _BEARER.search(head)) else None for head in front.heads]


def checkpointer(url: str, **options: object) -> AsyncCheckpointer:
    opts = {"endpoint_url": url, "max_attempts": 1, "dotenv": False, **options}
    return AsyncCheckpointer(chunk_size=PART, num_buffers=4, backend_options=opts)


async def test_a_key_file_authenticates_saves_and_loads_with_one_token_per_store(
    gcs_endpoint: GcsEndpoint,
    gcs_bucket: str,
    tokens: TokenServer,
    relay: tuple[FaultyFront, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """GOOGLE_APPLICATION_CREDENTIALS names the key file; the saves (two at once, then one of
    several chunks) and the load all carry the one token issued (valid for an hour): one grant,
    however many requests ask for it at the same moment."""
    creds = tmp_path / "sa.json"
    creds.write_text(json.dumps(tokens.key_info()))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(creds))
    front, url = relay
    async with checkpointer(url) as ckpt:
        await asyncio.gather(*(ckpt.save(f"gs://{gcs_bucket}/a{n}.bin", 1000) for n in range(2)))
        saved = await ckpt.save(f"gs://{gcs_bucket}/big.bin", 2 * PART + 7)
        loaded = await ckpt.load(f"gs://{gcs_bucket}/big.bin")
    assert loaded.size_bytes == 2 * PART + 7
    assert tokens.bad == [] and len(tokens.grants) == 1, (tokens.bad, tokens.grants)
    grant = tokens.grants[0]
    assert grant.claims["iss"] == EMAIL and grant.claims["aud"] == GOOGLE_AUDIENCE
    seen = bearers(front)
    assert len(seen) >= 6 and set(seen) == {tokens.issued[0]}, seen
    described = json.dumps(saved.to_dict(), default=str)
    assert f"service-account key ({EMAIL}" in described and "GOOGLE_APPLICATION_CREDENTIALS" in described
    assert await asyncio.to_thread(objects, gcs_endpoint, gcs_bucket) == ["a0.bin", "a1.bin", "big.bin"]


async def test_an_expired_token_is_refreshed_before_the_next_request(
    gcs_bucket: str, tokens: TokenServer, relay: tuple[FaultyFront, str]
) -> None:
    """The token endpoint issues tokens that expire at once (expires_in 0): google-auth's
    expiry says each is no longer valid, so every request asks for a new one, and each request
    carries the newest: two grants for two saves, driven by the expiry (no sleep). Saves with an
    hour's token ask once (the test above)."""
    front, url = relay
    tokens.expires_in = 0
    key = Secret(json.dumps(tokens.key_info()))
    async with checkpointer(url, service_account_key=key) as ckpt:
        await ckpt.save(f"gs://{gcs_bucket}/one.bin", 1000)
        after_first = len(tokens.issued)
        await ckpt.save(f"gs://{gcs_bucket}/two.bin", 1000)
    issued = tokens.issued
    assert tokens.bad == []
    # a save below one part is one simple upload: one request, so one grant each
    assert (after_first, len(issued)) == (1, 2), (after_first, issued)
    assert bearers(front) == issued  # one grant per request, each request the newest token
    assert len(set(issued)) == len(issued)


@pytest.mark.parametrize("where", ["simple upload", "ranged read"])
async def test_a_token_refused_before_its_expiry_is_replaced_once(
    gcs_endpoint: GcsEndpoint, gcs_bucket: str, tokens: TokenServer, where: str
) -> None:
    """GCS answers 401 to a key's token that google-auth still holds valid (revoked): the token
    is dropped, a new one asked for, and the request sent once more with it."""
    uri = f"gs://{gcs_bucket}/revoked.bin"

    def first(line: str) -> bool:
        return "uploadType=media" in line if where == "simple upload" else "alt=media" in line

    front = FaultyFront(gcs_endpoint.url, "unauthorized", first, times=1)
    url = await front.start()
    try:
        key = Secret(json.dumps(tokens.key_info()))
        async with checkpointer(url, service_account_key=key) as ckpt:
            await ckpt.save(uri, 1000)
            loaded = await ckpt.load(uri)
    finally:
        await front.stop()
    assert loaded.size_bytes == 1000 and tokens.bad == []
    issued = tokens.issued
    assert len(issued) == 2 and len(front.spoiled) == 1, (issued, front.spoiled)
    refused, again = bearers(front)[:2]  # the 401 answered, then the same request once more
    assert (refused, again) == (issued[0], issued[1]) and front.matched[0] == front.matched[1]


@pytest.mark.parametrize("size", [2 * PART + 1, 1000], ids=["resumable", "simple-upload-at-commit"])
async def test_a_refused_key_is_a_permission_error_naming_the_account(
    gcs_bucket: str, tokens: TokenServer, relay: tuple[FaultyFront, str], size: int
) -> None:
    """Refused at the session's start, or at the commit of a simple upload: then the error says
    nothing was published (no request went out), not that the commit failed mid-way."""
    front, url = relay
    tokens.refuse = True  # the key was deleted: 400 invalid_grant
    info = tokens.key_info()
    async with checkpointer(url, service_account_key=json.dumps(info)) as ckpt:
        with pytest.raises(StoragePermissionError) as caught:
            await ckpt.save(f"gs://{gcs_bucket}/refused.bin", size)
    assert getattr(caught.value, "asyncckpt_published", None) is False
    text = str(caught.value)
    assert EMAIL in text and "invalid_grant" in text and tokens.uri in text and "gcs" in text, text
    assert "\n" not in text and not any(line in text for line in tokens.keys.body_lines())
    assert front.matched == [], front.matched  # nothing reached the store
    assert len(tokens.grants) == 1 and tokens.bad == []  # refused once, not retried


async def test_an_unreachable_token_endpoint_is_a_storage_error(
    gcs_bucket: str, tokens: TokenServer, relay: tuple[FaultyFront, str]
) -> None:
    front, url = relay
    info = tokens.key_info()
    info["token_uri"] = f"http://127.0.0.1:{free_port()}/token"
    async with checkpointer(url, service_account_key=json.dumps(info)) as ckpt:
        with pytest.raises(StorageError) as caught:
            await ckpt.load(f"gs://{gcs_bucket}/absent.bin")
    text = str(caught.value)
    assert not isinstance(caught.value, StoragePermissionError)
    assert "cannot reach the token endpoint" in text and info["token_uri"] in text and EMAIL in text, text
    assert "\n" not in text and front.matched == []


async def test_a_token_endpoint_that_never_answers_ends_in_a_storage_error_within_request_timeout(
    gcs_bucket: str, tokens: TokenServer, relay: tuple[FaultyFront, str]
) -> None:
    """A listening socket that accepts (in the kernel) and never answers: the blocking refresh
    in its worker thread gives up after request_timeout, and the save says so."""
    front, url = relay
    info = tokens.key_info()
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        info["token_uri"] = f"http://127.0.0.1:{silent.getsockname()[1]}/token"
        started = time.monotonic()
        async with checkpointer(url, service_account_key=json.dumps(info), request_timeout=0.5) as ckpt:
            with pytest.raises(StorageError) as caught:
                await ckpt.save(f"gs://{gcs_bucket}/silent.bin", 1000)
        took = time.monotonic() - started
    text = str(caught.value)
    assert (
        "no answer from the token endpoint" in text
        and "within request_timeout 0.5 s" in text
        and EMAIL in text
    ), text
    assert took < 10 and front.matched == []


def bad_key_files(info: dict[str, str]) -> dict[str, tuple[object, str]]:
    """name → (the file's content, what the error names)."""
    no_key = {k: v for k, v in info.items() if k != "private_key"}
    no_uri = {k: v for k, v in info.items() if k not in ("token_uri", "client_email")}
    return {
        "not json": ("{ not json", "not a JSON object"),
        "no private_key": (no_key, "lacks the field(s) private_key"),
        "no token_uri nor client_email": (no_uri, "lacks the field(s) client_email, token_uri"),
        "not a PEM": ({**info, "private_key": "PRIVATE-Sweep-xyz"}, "private_key is not a PEM private key"),
        "user credentials": ({**info, "type": "authorized_user"}, "its field type is 'authorized_user'"),
        "token_uri with a password": (
            {**info, "token_uri": "http://u:Pass-Sweep-1@127.0.0.1:9/token"},
            "'http://***@127.0.0.1:9/token' is not an http(s) URL without user information",
        ),
    }


@pytest.mark.parametrize(
    "case",
    [
        "not json",
        "no private_key",
        "no token_uri nor client_email",
        "not a PEM",
        "user credentials",
        "token_uri with a password",
    ],
)
async def test_a_bad_key_file_is_a_config_error_naming_it_before_any_io(
    gcs_bucket: str,
    tokens: TokenServer,
    relay: tuple[FaultyFront, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    case: str,
) -> None:
    content, names = bad_key_files(tokens.key_info())[case]
    creds = tmp_path / "bad-sa.json"
    creds.write_text(content if isinstance(content, str) else json.dumps(content))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(creds))
    front, url = relay
    with pytest.raises(ConfigError) as caught:
        async with checkpointer(url) as ckpt:
            await ckpt.save(f"gs://{gcs_bucket}/never.bin", 1000)
    text = str(caught.value)
    assert names in text and str(creds) in text and "GOOGLE_APPLICATION_CREDENTIALS" in text, text
    assert not any(line in text for line in tokens.keys.body_lines()) and "Sweep" not in text
    assert front.connections == 0 and tokens.grants == []  # before any I/O


async def test_a_private_key_google_auth_cannot_read_is_a_config_error(
    gcs_bucket: str, tokens: TokenServer, relay: tuple[FaultyFront, str]
) -> None:
    """A PEM whose body is not a key passes the settings' check and is refused when the
    credential is built, before any request, naming the account and not the key."""
    info = {
        **tokens.key_info(),
        "private_key": "-----BEGIN PRIVATE KEY-----\nTm90QUtleQ==\n-----END PRIVATE KEY-----\n",
    }
    front, url = relay
    async with checkpointer(url, service_account_key=json.dumps(info)) as ckpt:
        with pytest.raises(ConfigError, match=re.escape(EMAIL)) as caught:
            await ckpt.save(f"gs://{gcs_bucket}/never.bin", 1000)
    assert "Tm90QUtleQ" not in str(caught.value)
    assert front.connections == 0 and tokens.grants == []


def test_credential_precedence_and_no_key_in_the_settings(tokens: TokenServer, tmp_path: Path) -> None:
    """Explicit token > explicit key > environment token > environment key; an emulator host
    with no explicit credential sends none."""
    keys, info = tokens.keys, tokens.key_info()
    key = json.dumps(info)
    creds = tmp_path / "sa.json"
    creds.write_text(key)
    env_key = {"GOOGLE_APPLICATION_CREDENTIALS": str(creds)}
    env_token = {"GOOGLE_OAUTH_ACCESS_TOKEN": "ya29.env"}

    def chosen(options: dict[str, object], env: dict[str, str]) -> str:
        s = GcsSettings.resolve({"dotenv": False, **options}, env=env)
        assert not any(line in repr(s) + str(s.describe()) for line in keys.body_lines())
        if s.token is not None:
            assert s.service_account_key is None
            return "token " + s.token.reveal()
        return "key" if s.service_account_key is not None else "none"

    both_env = {**env_key, **env_token}
    assert chosen({"token": "ya29.opt", "service_account_key": key}, both_env) == "token ya29.opt"
    assert chosen({"service_account_key": key}, both_env) == "key"
    assert chosen({}, both_env) == "token ya29.env"
    assert chosen({}, env_key) == "key"
    s = GcsSettings.resolve({"dotenv": False}, env=env_key)
    assert s.client_email == EMAIL and s.token_uri == info["token_uri"]
    assert s.describe()["credential"].startswith(f"service-account key ({EMAIL}")
    assert s.sources["credential"] == f"environment GOOGLE_APPLICATION_CREDENTIALS (the file {str(creds)!r})"
    emulator = {**env_key, "STORAGE_EMULATOR_HOST": "127.0.0.1:4443"}
    assert chosen({}, emulator) == "none"


async def test_a_writer_process_gets_its_own_token(
    gcs_bucket: str, tokens: TokenServer, relay: tuple[FaultyFront, str]
) -> None:
    """``isolation="process"``: the sink runs in a writer process, which receives the key as a
    Secret (pickled) and makes its own grant; its requests carry that token."""
    front, url = relay
    uri = f"gs://{gcs_bucket}/iso.bin"
    opts = {"endpoint_url": url, "max_attempts": 1, "dotenv": False}
    opts["service_account_key"] = Secret(json.dumps(tokens.key_info()))
    async with AsyncCheckpointer(chunk_size=PART, backend_options=opts, isolation="process") as ckpt:
        saved = await ckpt.save(uri, 2 * PART + 3)
    assert saved.metadata.extra["isolation"] == "process" and tokens.bad == []
    seen = bearers(front)
    assert seen and set(seen) <= set(tokens.issued) and None not in seen, (seen, tokens.issued)


_WITHOUT_GOOGLE_AUTH = """
import asyncio, json, sys

class Block:  # google-auth not installed: every google.* import fails, as it would
    def find_spec(self, name, path=None, target=None):
        if name == "google" or name.startswith("google."):
            raise ImportError(f"No module named {name!r}")

sys.meta_path.insert(0, Block())
from asyncckpt import AsyncCheckpointer

async def main():
    opts = {"endpoint_url": sys.argv[1], "service_account_key": sys.argv[2], "dotenv": False}
    async with AsyncCheckpointer(chunk_size=1 << 20, backend_options=opts) as ckpt:
        await ckpt.save("gs://bucket-1/x.bin", 1000)

asyncio.run(main())
"""


def test_without_google_auth_a_key_is_a_missing_dependency_naming_the_extra(
    tokens: TokenServer, tmp_path: Path
) -> None:
    """google-auth is imported on first use: without it, asyncckpt imports and a save with a
    key says which extra to install (the key's JSON is passed in argv here only because it is
    a test key of this test)."""
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _WITHOUT_GOOGLE_AUTH,
            f"http://127.0.0.1:{free_port()}",
            json.dumps(tokens.key_info()),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 1 and "MissingDependencyError" in proc.stderr, proc.stderr[-2000:]
    assert "'google-auth'" in proc.stderr and "pip install 'asyncckpt[gcs]'" in proc.stderr, proc.stderr[
        -2000:
    ]
    assert tokens.grants == [] and not any(line in proc.stderr for line in tokens.keys.body_lines())

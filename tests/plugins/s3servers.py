"""S3 servers for tests: moto (a mock) and OpenStack Swift (a real store), one interface.

Interface — what S3 suites rely on (registered in tests/conftest.py via ``pytest_plugins``):

- ``--s3-server=moto|swift|both`` (default ``both``). With ``both``, when Swift is not
  installed and cannot be installed (not root / no apt-get), its tests are *skipped with the
  reason*; ``--s3-server=swift`` turns that into an error. A Swift that is installed but
  fails to start is always an error.
- ``s3_endpoint`` (session scope, parametrized by server → test ids ``[moto]``/``[swift]``):
  an :class:`asyncckpt.servers.s3endpoint.S3Endpoint` with ``kind``, ``endpoint``,
  ``access_key``, ``secret_key``, ``region``, ``quirks`` (how it differs from AWS, keys of
  :data:`asyncckpt.servers.s3compat.QUIRKS`) and ``env()`` (AWS_* variables), ``options(**extra)``
  (S3 ``backend_options``), ``client_kwargs()`` (for boto3/aiobotocore), ``client()`` (a boto3
  client, path style, one attempt, Swift workarounds), ``create_bucket(name=None) -> str`` (a
  fresh unique bucket), ``request()`` (a signed raw request). Any test or fixture
  that uses ``s3_endpoint`` (directly or through another fixture) runs once per server.
  Swift cases carry the ``realstore`` marker (``-m "not realstore"`` leaves them out).
  A test needing a server that ``--s3-server`` excludes is skipped with that reason.
- ``s3_env``: ``s3_endpoint`` with the process's AWS_* variables pointing at it (others
  removed) and the working directory a fresh tmp dir (no stray ``.env``).
- ``s3_bucket``: a fresh bucket on ``s3_endpoint``. ``s3_client``: a boto3 client for it
  (path style, one attempt, Swift's DeleteObjects workaround registered) to verify results.
- ``swift_endpoint`` / ``moto_endpoint``: one server only (session scope).
- moto runs in a child process (:class:`asyncckpt.servers.embedded.MotoServer`): in the test
  process it would hold the GIL and stall event loops the blocking-call detector watches.
- A child pytest started with :func:`shared_server_env` reuses the parent's server.
- ``swift_small_disk``: a separate Swift whose data lives on a small tmpfs (root only;
  16 MiB, or ``request.param`` bytes via indirect parametrization), for full-disk tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from asyncckpt.servers.embedded import MotoServer
from asyncckpt.servers.embedded_swift import SwiftServer, SwiftUnavailableError
from asyncckpt.servers.s3endpoint import S3Endpoint

KINDS = ("moto", "swift")
SMALL_DISK = 16 << 20
#: JSON of a running server's S3Endpoint, set by tests/s3_harness.run_child_suite for its child
SHARED_ENV = "ASYNCCKPT_TEST_S3_SERVER"


def endpoint_to_json(ep: S3Endpoint) -> str:
    """``ep`` for a child process's environment (test credentials only)."""
    fields = {f.name: getattr(ep, f.name) for f in dataclasses.fields(ep)}
    return json.dumps({**fields, "quirks": sorted(ep.quirks)})


def endpoint_from_json(text: str) -> S3Endpoint:
    fields = json.loads(text)
    return S3Endpoint(**{**fields, "quirks": frozenset(fields["quirks"])})


def shared_server_env(ep: S3Endpoint) -> dict[str, str]:
    """The environment that lets a child pytest use ``ep`` instead of starting its own server."""
    return {SHARED_ENV: endpoint_to_json(ep)}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--s3-server",
        choices=("moto", "swift", "both"),
        default="both",
        help="S3 server(s) for tests using s3_endpoint (default both; Swift skipped with a reason if "
        "it cannot be installed)",
    )


def selected_kinds(config: pytest.Config) -> list[str]:
    choice = config.getoption("--s3-server")
    return list(KINDS) if choice == "both" else [choice]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "s3_endpoint" in metafunc.fixturenames:
        kinds = selected_kinds(metafunc.config)
        metafunc.parametrize("s3_endpoint", kinds, indirect=True, scope="session", ids=kinds)


SWIFT_FIXTURES = {"swift_endpoint", "swift_small_disk"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        callspec = getattr(item, "callspec", None)
        uses_swift = SWIFT_FIXTURES & set(getattr(item, "fixturenames", ()))
        if uses_swift or (callspec is not None and callspec.params.get("s3_endpoint") == "swift"):
            item.add_marker(pytest.mark.realstore)


class Servers:
    """Starts each kind once per session, on first use; remembers why Swift is unavailable."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.stack = contextlib.ExitStack()
        self.started: dict[str, S3Endpoint] = {}
        self.unavailable: str | None = None

    def get(self, kind: str) -> S3Endpoint:
        if kind in self.started:
            return self.started[kind]
        if kind not in selected_kinds(self.config):
            pytest.skip(
                f"needs the {kind} S3 server, excluded by --s3-server={self.config.getoption('--s3-server')}"
            )
        inherited = endpoint_from_json(os.environ[SHARED_ENV]) if SHARED_ENV in os.environ else None
        if inherited is not None and inherited.kind == kind:  # a child suite reuses its parent's server
            self.started[kind] = inherited
        elif kind == "swift" and self.unavailable is None:
            try:
                self.started[kind] = self.stack.enter_context(SwiftServer())
            except SwiftUnavailableError as exc:
                self.unavailable = str(exc)
        elif kind == "moto":
            self.started[kind] = self.stack.enter_context(MotoServer())
        if kind == "swift" and self.unavailable is not None:
            if self.config.getoption("--s3-server") == "swift":
                pytest.fail(f"--s3-server=swift but Swift is unavailable: {self.unavailable}")
            pytest.skip(f"Swift S3 server unavailable: {self.unavailable}")
        return self.started[kind]


@pytest.fixture(scope="session")
def s3_servers(pytestconfig: pytest.Config) -> Iterator[Servers]:
    servers = Servers(pytestconfig)
    with servers.stack:
        yield servers


@pytest.fixture(scope="session")
def s3_endpoint(request: pytest.FixtureRequest, s3_servers: Servers) -> S3Endpoint:
    kind = getattr(request, "param", None)
    if kind is None:
        pytest.fail(
            "s3_endpoint was requested dynamically (getfixturevalue), so it is not parametrized by "
            "server: add pytestmark = pytest.mark.usefixtures('s3_endpoint') to the test module"
        )
    return s3_servers.get(kind)


@pytest.fixture(scope="session")
def swift_endpoint(s3_servers: Servers) -> S3Endpoint:
    return s3_servers.get("swift")


@pytest.fixture(scope="session")
def moto_endpoint(s3_servers: Servers) -> S3Endpoint:
    return s3_servers.get("moto")


@pytest.fixture
def auth_server() -> Iterator[S3Endpoint]:
    """A private moto that enforces IAM credentials, as the endpoint of a user allowed s3:*."""
    from ..s3_server import provision_user

    with MotoServer(auth=True) as server:
        yield provision_user(server)


async def private_auth_server(request: pytest.FixtureRequest) -> S3Endpoint:
    """The ``auth_server`` fixture, asked for inside an async test: its setup starts a server
    and waits for it (0.6 s), so it runs in a thread, not on the test's loop."""
    server: S3Endpoint = await asyncio.to_thread(request.getfixturevalue, "auth_server")
    return server


@pytest.fixture
def s3_bucket(s3_endpoint: S3Endpoint) -> str:
    return s3_endpoint.create_bucket()


@pytest.fixture
def s3_env(s3_endpoint: S3Endpoint, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> S3Endpoint:
    """``s3_endpoint``, with every AWS_* variable pointing at it and nothing else of AWS leaking in."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    for name, value in s3_endpoint.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.chdir(tmp_path)  # no stray .env from the working directory
    return s3_endpoint


def boto3_client(ep: S3Endpoint, **config: Any) -> Any:
    """A boto3 S3 client for ``ep``: path style, one attempt, Swift workarounds registered."""
    return ep.client(**config)


@pytest.fixture
def s3_client(s3_endpoint: S3Endpoint) -> Any:
    return boto3_client(s3_endpoint)


@pytest.fixture
def swift_small_disk(request: pytest.FixtureRequest, s3_servers: Servers) -> Iterator[S3Endpoint]:
    """A Swift of its own with its data on a tmpfs of ``request.param`` bytes (16 MiB)."""
    s3_servers.get("swift")  # skips (with the reason) when Swift is unavailable
    with small_disk_swift(getattr(request, "param", SMALL_DISK)) as ep:
        yield ep


@contextlib.contextmanager
def small_disk_swift(size: int) -> Iterator[S3Endpoint]:
    """Start a Swift with its data on a ``size``-byte tmpfs (skip if unavailable); stop it after."""
    server = SwiftServer(tmpfs_size=size)
    try:
        ep = server.start()
    except SwiftUnavailableError as exc:
        pytest.skip(f"full-disk Swift unavailable: {exc}")
    try:
        yield ep
    finally:
        server.stop()

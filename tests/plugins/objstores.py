"""Azure Blob and GCS emulators for tests: Azurite and fake-gcs-server, one session each.

Interface (registered in tests/conftest.py via ``pytest_plugins``):

- ``azurite_endpoint`` (session): an :class:`asyncckpt.servers.azurite.AzureEndpoint` of a
  running Azurite (blob service, in memory): ``blob_url``, ``account_url``, ``account``,
  ``key`` (a Secret), ``sas()``, ``env()``, ``obstore_config()``, ``request()`` (SharedKey
  signed), ``create_container(name=None)``.
- ``gcs_endpoint`` (session): an :class:`asyncckpt.servers.gcs_emulator.GcsEndpoint` of a
  running fake-gcs-server (in memory): ``url``, ``env()``, ``obstore_config()``,
  ``request()``, ``create_bucket(name=None)``.
- ``az_container`` / ``gcs_bucket``: a fresh, uniquely named container / bucket.
- When the emulator cannot be installed on this machine (no Node/npm, no registry, the wheel
  missing) its tests are *skipped with the reason*; ``--store-emulators=require`` (CI) turns
  that into a failure. An installed emulator that fails to start is always an error.
  Their tests carry the ``realstore`` marker.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from asyncckpt.servers.azurite import AzureEndpoint, AzuriteServer
from asyncckpt.servers.emulator_process import EmulatorUnavailableError
from asyncckpt.servers.gcs_emulator import GcsEmulator, GcsEndpoint

EMULATOR_FIXTURES = {"azurite_endpoint", "gcs_endpoint", "az_container", "gcs_bucket"}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--store-emulators",
        choices=("auto", "require"),
        default="auto",
        help="Azurite / fake-gcs-server: skip their tests with the reason when they cannot be "
        "installed (auto, the default), or fail (require)",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if EMULATOR_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.realstore)


@contextlib.contextmanager
def started(config: pytest.Config, server: AzuriteServer | GcsEmulator) -> Iterator[object]:
    try:
        ep = server.start()
    except EmulatorUnavailableError as exc:
        if config.getoption("--store-emulators") == "require":
            pytest.fail(f"--store-emulators=require but {exc}")
        pytest.skip(str(exc))
    try:
        yield ep
    finally:
        server.stop()


@pytest.fixture(scope="session")
def azurite_endpoint(pytestconfig: pytest.Config) -> Iterator[AzureEndpoint]:
    with started(pytestconfig, AzuriteServer()) as ep:
        assert isinstance(ep, AzureEndpoint)
        yield ep


@pytest.fixture(scope="session")
def gcs_endpoint(pytestconfig: pytest.Config) -> Iterator[GcsEndpoint]:
    with started(pytestconfig, GcsEmulator()) as ep:
        assert isinstance(ep, GcsEndpoint)
        yield ep


@pytest.fixture
def az_container(azurite_endpoint: AzureEndpoint) -> str:
    return azurite_endpoint.create_container()


@pytest.fixture
def gcs_bucket(gcs_endpoint: GcsEndpoint) -> str:
    return gcs_endpoint.create_bucket()

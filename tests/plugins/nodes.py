"""Fixtures of the two-node bed (tests/nodes.py), registered in tests/conftest.py.

- ``node_bed`` (module scope): a :class:`tests.nodes.Bed`, built after sweeping beds left by
  dead runs and torn down in the finalizer whether the tests passed or not; the tests using it
  *skip with the reason* on a machine that cannot create namespaces (not root, no
  CAP_NET_ADMIN, no ``ip``).
- ``bed_store`` (module scope): a moto S3 server of its own bound to the bed's bridge
  address (both nodes and the test process reach it) and a fresh bucket on it.
- ``bed_swift`` (module scope): the same with OpenStack Swift (its S3 proxy on the bridge);
  skipped with the reason where Swift is unavailable, as the ``swift`` S3 tests are.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from asyncckpt.servers.embedded import MotoServer
from asyncckpt.servers.embedded_swift import SwiftServer, SwiftUnavailableError
from asyncckpt.servers.s3endpoint import S3Endpoint

from .. import nodes


@pytest.fixture(scope="module")
def node_bed() -> Iterator[nodes.Bed]:
    reason = nodes.unavailable()
    if reason is not None:
        pytest.skip(f"two-node bed unavailable: {reason}")
    with nodes.bed() as bed:
        yield bed
    assert nodes.leftovers(bed.id) == []


@pytest.fixture(scope="module")
def bed_store(node_bed: nodes.Bed) -> Iterator[tuple[S3Endpoint, str]]:
    with MotoServer(host=node_bed.gateway) as ep:
        yield ep, ep.create_bucket()


@pytest.fixture(scope="module")
def bed_swift(node_bed: nodes.Bed) -> Iterator[tuple[S3Endpoint, str]]:
    server = SwiftServer(host=node_bed.gateway)
    try:
        ep = server.start()
    except SwiftUnavailableError as exc:
        pytest.skip(f"Swift S3 server unavailable: {exc}")
    try:
        yield ep, ep.create_bucket()
    finally:
        server.stop()


@pytest.fixture
def fresh_bed() -> Iterator[nodes.Bed]:
    """A bed of the test's own (0.4 s to build), for tests that change the nodes' disks."""
    reason = nodes.unavailable()
    if reason is not None:
        pytest.skip(f"two-node bed unavailable: {reason}")
    with nodes.bed() as bed:
        yield bed
    assert nodes.leftovers(bed.id) == []

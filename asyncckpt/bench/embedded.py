"""Local S3 servers for demos and tests: ``embedded_s3("swift" | "moto")``.

Both yield the same :class:`~asyncckpt.bench.s3endpoint.S3Endpoint`. Swift is a real object
store (separate processes, see :mod:`.embedded_swift`); moto is an in-process mock (threads
in this process, ≈ 0.07 GB/s) that needs ``moto[server]`` (the ``test`` extra).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from typing import Any

from ..errors import ConfigError, MissingDependencyError
from .embedded_swift import SwiftServer
from .s3endpoint import S3Endpoint

KINDS = ("swift", "moto")
MOTO_ACCESS_KEY = "moto-access-key"
#: moto accepts any credentials; distinctive so tests can assert it never leaks into output
MOTO_SECRET_KEY = "moto-test-secret-Jp3xW9"


class MotoServer:
    """moto's ThreadedMotoServer on 127.0.0.1 with an OS-chosen port; a context manager."""

    def __init__(self) -> None:
        self._server: Any = None
        self.endpoint: S3Endpoint | None = None

    def __enter__(self) -> S3Endpoint:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> S3Endpoint:
        try:
            from moto.server import ThreadedMotoServer
        except ImportError:
            raise MissingDependencyError("moto[server]", "test", "the embedded moto S3 server") from None
        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()  # the port the OS actually bound
        self.endpoint = S3Endpoint("moto", f"http://{host}:{port}", MOTO_ACCESS_KEY, MOTO_SECRET_KEY)
        return self.endpoint

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
        self._server, self.endpoint = None, None


@contextlib.contextmanager
def embedded_s3(kind: str, **swift_options: Any) -> Iterator[S3Endpoint]:
    """Start a local S3 server of ``kind`` and stop it on exit (``swift_options`` → SwiftServer)."""
    if kind == "swift":
        with SwiftServer(**swift_options) as ep:
            yield ep
    elif kind == "moto":
        with MotoServer() as ep:
            yield ep
    else:
        raise ConfigError(f"unknown embedded S3 server {kind!r}; choose one of {', '.join(KINDS)}")


@contextlib.contextmanager
def endpoint_environment(ep: S3Endpoint) -> Iterator[None]:
    """Point the AWS_* variables of this process at ``ep``; restore them on exit."""
    saved = {key: os.environ.get(key) for key in ep.env()}
    os.environ.update(ep.env())
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


BENCH_BUCKET = "asyncckpt-bench"


def start_for_bench(stack: contextlib.ExitStack, kind: str) -> str:
    """Start ``kind`` for a bench run (stopped when ``stack`` closes); return the default target.

    Sets the AWS_* variables for the run and creates :data:`BENCH_BUCKET`.
    """
    ep = stack.enter_context(embedded_s3(kind))
    stack.enter_context(endpoint_environment(ep))
    ep.create_bucket(BENCH_BUCKET)
    print(f"[asyncckpt] embedded {kind} S3 server at {ep.endpoint}, bucket {BENCH_BUCKET}", file=sys.stderr)
    return f"s3://{BENCH_BUCKET}/checkpoint.bin"

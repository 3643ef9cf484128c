"""Local S3 servers for demos and tests: ``embedded_s3("swift" | "moto")``.

Both yield the same :class:`~asyncckpt.servers.s3endpoint.S3Endpoint`. Swift is a real object
store (separate processes, see :mod:`.embedded_swift`); moto is a mock (≈ 0.07 GB/s) in a
child process that needs ``moto[server]`` (the ``test`` extra).
"""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

from ..env import child_environ, exported
from ..errors import ConfigError, MissingDependencyError, StorageError
from .embedded_swift import SwiftServer
from .s3endpoint import S3Endpoint

KINDS = ("swift", "moto")
MOTO_ACCESS_KEY = "moto-access-key"
#: moto accepts any credentials; distinctive so tests can assert it never leaks into output
MOTO_SECRET_KEY = "moto-test-secret-Jp3xW9"


class MotoServer:
    """moto's ThreadedMotoServer on ``host`` (127.0.0.1) at an OS-chosen port, in a child process.

    In the caller's process moto's request handling would hold the GIL and stall its event
    loop (up to 0.07 s per request measured in tests); as a child it competes for CPU only.
    ``auth=True`` makes moto enforce IAM credentials after the first ``unauthenticated``
    requests (used to provision a user). Stopping it is an immediate outage (SIGKILL).
    ``host``: another local address to bind, e.g. a bridge that network namespaces reach
    (tests/nodes.py); only an address of this machine, never a wildcard.
    """

    def __init__(self, *, auth: bool = False, unauthenticated: int = 3, host: str = "127.0.0.1") -> None:
        self.auth, self.unauthenticated, self.host = auth, unauthenticated, host
        self._proc: subprocess.Popen[str] | None = None
        self.endpoint: S3Endpoint | None = None

    def __enter__(self) -> S3Endpoint:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> S3Endpoint:
        if importlib.util.find_spec("moto") is None:
            raise MissingDependencyError("moto[server]", "test", "the embedded moto S3 server")
        env = child_environ()
        if self.auth:
            env["INITIAL_NO_AUTH_ACTION_COUNT"] = str(self.unauthenticated)
        proc = subprocess.Popen(
            [sys.executable, "-m", "asyncckpt.servers.embedded", "serve-moto", self.host],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None and proc.stderr is not None
        line = proc.stdout.readline()  # "ENDPOINT http://HOST:PORT" once bound
        if not line.startswith("ENDPOINT "):
            proc.kill()
            _, err = proc.communicate()
            raise StorageError(errno.EIO, f"moto server did not start: {line!r} {err[-2000:]}")
        proc.stderr.close()  # the child sends stderr to /dev/null before announcing itself
        self._proc = proc
        self.endpoint = S3Endpoint("moto", line.split()[1], MOTO_ACCESS_KEY, MOTO_SECRET_KEY)
        return self.endpoint

    def stop(self) -> None:
        """Stop now (also an outage in fault tests); idempotent."""
        proc, self._proc, self.endpoint = self._proc, None, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()


def _serve_moto(host: str) -> None:
    """Child side of :class:`MotoServer`: print the endpoint, serve until stdin closes."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address=host, port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()  # the port the OS actually bound
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)  # the parent stops reading stderr once started
    print(f"ENDPOINT http://{host}:{port}", flush=True)
    sys.stdin.read()
    server.stop()


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
    with exported(ep.env()):
        yield


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


if __name__ == "__main__":
    if sys.argv[1:2] != ["serve-moto"] or len(sys.argv) > 3:
        sys.exit(
            "usage: python -m asyncckpt.servers.embedded serve-moto [HOST]  (internal: MotoServer's child)"
        )
    _serve_moto(sys.argv[2] if len(sys.argv) == 3 else "127.0.0.1")

"""Where a local S3 server listens and how to reach it (requests signed by :mod:`..sinks.s3.sigv4`).

The embedded servers (Swift, moto) describe themselves with :class:`S3Endpoint`. Readiness
checks and bucket creation sign their requests here with the standard library only, so
starting a server needs neither boto3 nor aiobotocore: a *signed* request succeeding is the
proof that the S3 layer and its authentication are up, not just that a port is open.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import StorageError
from ..sinks.s3.sigv4 import sigv4_request
from .s3compat import register_s3compat

__all__ = ["S3Endpoint", "sigv4_request"]

_CLIENTS: dict[tuple[str, str, str], Any] = {}
#: how long start-up requests (bucket creation) keep retrying a server that is not ready
STARTUP_DEADLINE_S = 30.0
RETRY_STATUSES = (0, 429, 500, 502, 503, 504)  # 0: no answer (connection refused or reset)


@dataclass(frozen=True)
class S3Endpoint:
    """A running local S3 server: endpoint, test credentials, region; path-style addressing.

    ``kind`` is ``"swift"`` or ``"moto"``; ``quirks`` names the ways the server differs from
    AWS (see :mod:`asyncckpt.servers.s3compat`), so tests can assert the documented behaviour.
    The secret never appears in ``repr``.
    """

    kind: str
    endpoint: str
    access_key: str
    secret_key: str = field(repr=False)
    region: str = "us-east-1"
    quirks: frozenset[str] = frozenset()

    def env(self) -> dict[str, str]:
        """The AWS_* variables every S3 library here reads."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": self.region,
            "AWS_DEFAULT_REGION": self.region,
        }

    def options(self, **extra: Any) -> dict[str, Any]:
        """Explicit S3 ``backend_options`` (independent of the process environment and ``.env``)."""
        return {
            "endpoint_url": self.endpoint,
            "access_key_id": self.access_key,
            "secret_access_key": self.secret_key,
            "region": self.region,
            "dotenv": False,
            **extra,
        }

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``boto3.client("s3", ...)`` / aiobotocore ``create_client``."""
        return {
            "endpoint_url": self.endpoint,
            "aws_access_key_id": self.access_key,
            "aws_secret_access_key": self.secret_key,
            "region_name": self.region,
        }

    def client(self, key_id: str | None = None, secret: str | None = None, **config: Any) -> Any:
        """A boto3 client (path style, one attempt, Swift workarounds registered) to verify results.

        Needs boto3 (the ``test`` extra); ``config`` goes to ``botocore.config.Config``.
        """
        import boto3  # type: ignore[import-untyped]
        from botocore.config import Config

        cache_key = (self.endpoint, key_id or self.access_key, secret or self.secret_key)
        if not config and cache_key in _CLIENTS:
            return _CLIENTS[cache_key]  # boto3 clients are thread-safe; making one takes ~0.1 s
        cfg = Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}, **config)
        kwargs = self.client_kwargs()
        kwargs["aws_access_key_id"], kwargs["aws_secret_access_key"] = cache_key[1:]
        client = register_s3compat(boto3.client("s3", config=cfg, **kwargs))
        if not config:
            _CLIENTS[cache_key] = client
        return client

    def request(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        headers: Mapping[str, str] | None = None,
        timeout: float = 5.0,
    ) -> tuple[int, bytes]:
        """A signed request to this server (used for readiness and bucket setup)."""
        return sigv4_request(
            method,
            self.endpoint,
            path,
            access_key=self.access_key,
            secret_key=self.secret_key,
            region=self.region,
            body=body,
            headers=headers,
            timeout=timeout,
        )

    def ready(self) -> bool:
        """True when a signed ListBuckets succeeds."""
        try:
            status, _ = self.request("GET", "/", timeout=2.0)
        except OSError:
            return False
        return status == 200

    def create_bucket(self, name: str | None = None, *, deadline_s: float = STARTUP_DEADLINE_S) -> str:
        """Create a bucket (a unique ``test-…`` name when none is given) and return its name.

        Right after start-up a server may still refuse (Swift answered 503 "Please reduce your
        request rate" to 1 in 5 first bucket creations; a loaded machine resets connections):
        503/500/429 and connection errors are retried with backoff until ``deadline_s``.
        Any other answer fails at once.
        """
        name = name or f"test-{uuid.uuid4().hex[:16]}"
        deadline = time.monotonic() + deadline_s
        delay, retried = 0.05, False
        while True:
            try:
                status, body = self.request("PUT", f"/{name}", timeout=30.0)  # a loaded machine is slow
            except OSError as exc:
                status, body = 0, str(exc).encode()
            if status == 200:
                return name
            if retried and status == 409 and b"BucketAlreadyOwnedByYou" in body:  # an earlier try got in
                return name
            text = body.decode(errors="replace")[:300]
            if status not in RETRY_STATUSES or time.monotonic() + delay > deadline:
                raise StorageError(f"create bucket {name!r} at {self.endpoint}: HTTP {status}: {text}")
            time.sleep(delay)  # a setup step off any event loop (tests call it via to_thread)
            delay, retried = min(delay * 2, 1.0), True

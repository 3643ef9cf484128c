"""Where a local S3 server listens and how to reach it (requests signed by :mod:`..sinks.s3.sigv4`).

The embedded servers (Swift, moto) describe themselves with :class:`S3Endpoint`. Readiness
checks and bucket creation sign their requests here with the standard library only, so
starting a server needs neither boto3 nor aiobotocore: a *signed* request succeeding is the
proof that the S3 layer and its authentication are up, not just that a port is open.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import StorageError
from ..sinks.s3.sigv4 import sigv4_request

__all__ = ["S3Endpoint", "sigv4_request"]

_CLIENTS: dict[tuple[str, str, str], Any] = {}


@dataclass(frozen=True)
class S3Endpoint:
    """A running local S3 server: endpoint, test credentials, region; path-style addressing.

    ``kind`` is ``"swift"`` or ``"moto"``; ``quirks`` names the ways the server differs from
    AWS (see :mod:`asyncckpt.sinks.s3compat`), so tests can assert the documented behaviour.
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

        from ..sinks.s3compat import register_s3compat

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

    def create_bucket(self, name: str | None = None) -> str:
        """Create a bucket (a unique ``test-…`` name when none is given) and return its name."""
        name = name or f"test-{uuid.uuid4().hex[:16]}"
        status, body = self.request("PUT", f"/{name}", timeout=30.0)  # a loaded machine is slow
        if status != 200:
            text = body.decode(errors="replace")[:300]
            raise StorageError(f"create bucket {name!r} at {self.endpoint}: HTTP {status}: {text}")
        return name

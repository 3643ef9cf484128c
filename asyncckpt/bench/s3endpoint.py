"""Where a local S3 server listens and how to reach it, plus a stdlib SigV4 request.

The embedded servers (Swift, moto) describe themselves with :class:`S3Endpoint`. Readiness
checks and bucket creation sign their requests here with the standard library only, so
starting a server needs neither boto3 nor aiobotocore: a *signed* request succeeding is the
proof that the S3 layer and its authentication are up, not just that a port is open.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import http.client
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit

from ..errors import StorageError


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


def sigv4_request(
    method: str,
    endpoint: str,
    path: str,
    *,
    access_key: str,
    secret_key: str,
    region: str,
    body: bytes = b"",
    headers: Mapping[str, str] | None = None,
    timeout: float = 5.0,
) -> tuple[int, bytes]:
    """Send one SigV4-signed S3 request (path-style, no query string); return (status, body).

    ``headers`` are signed too; an ``x-amz-content-sha256`` among them replaces the body hash.
    """
    url = urlsplit(endpoint)
    if url.scheme != "http" or not url.hostname or not url.port:
        raise ValueError(f"endpoint must look like http://host:port, got {endpoint!r}")
    host = f"{url.hostname}:{url.port}"
    now = datetime.datetime.now(datetime.UTC)
    amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    hdrs = {k.lower(): v for k, v in (headers or {}).items()}
    payload = hdrs.setdefault("x-amz-content-sha256", hashlib.sha256(body).hexdigest())
    canonical_path = quote(path or "/", safe="/-_.~")
    hdrs.update({"host": host, "x-amz-date": amz_date})
    signed = ";".join(sorted(hdrs))
    canonical = "\n".join(
        [method, canonical_path, "", *(f"{k}:{hdrs[k]}" for k in sorted(hdrs)), "", signed, payload]
    )
    scope = f"{day}/{region}/s3/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = _hmac(_hmac(_hmac(_hmac(f"AWS4{secret_key}".encode(), day), region), "s3"), "aws4_request")
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    hdrs["authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, SignedHeaders={signed}, Signature={signature}"
    )
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=timeout)
    try:
        conn.request(method, canonical_path, body=body or None, headers=hdrs)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


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

        cfg = Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}, **config)
        kwargs = self.client_kwargs()
        kwargs["aws_access_key_id"] = key_id or self.access_key
        kwargs["aws_secret_access_key"] = secret or self.secret_key
        return register_s3compat(boto3.client("s3", config=cfg, **kwargs))

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
        status, body = self.request("PUT", f"/{name}")
        if status != 200:
            text = body.decode(errors="replace")[:300]
            raise StorageError(f"create bucket {name!r} at {self.endpoint}: HTTP {status}: {text}")
        return name

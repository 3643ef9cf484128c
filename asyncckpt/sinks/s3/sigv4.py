"""One SigV4-signed S3 request over the standard library (no boto3, no Rust runtime).

Used where a client library cannot send the request a server needs: s3dlio 0.10 deletes
through DeleteObjects without Content-MD5, which OpenStack Swift refuses, so the s3dlio
sink deletes with a plain signed ``DELETE`` instead; the embedded test servers use it for
readiness checks and bucket setup. Path-style or virtual-hosted, http or https (with a CA
bundle), optional session token. The secret only ever enters the HMAC key derivation.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import http.client
import re
import ssl
from collections.abc import Mapping
from typing import TYPE_CHECKING
from urllib.parse import quote, urlsplit
from xml.sax.saxutils import escape

if TYPE_CHECKING:
    from .config import S3Settings


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
    query: Mapping[str, str] | None = None,
    session_token: str | None = None,
    ca_bundle: str | None = None,
    timeout: float = 5.0,
) -> tuple[int, bytes]:
    """Send one SigV4-signed S3 request; return (status, body).

    ``endpoint`` is ``http(s)://host[:port]``; ``path`` is the unencoded request path
    (``/bucket/key`` path-style, ``/key`` with a bucket host); ``query`` its parameters (value
    ``""`` for a bare ``?uploads``). ``headers`` are signed too; an ``x-amz-content-sha256``
    among them replaces the body hash.
    """
    url = urlsplit(endpoint)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise ValueError(f"endpoint must look like http(s)://host[:port], got {endpoint!r}")
    default_port = 443 if url.scheme == "https" else 80
    port = url.port or default_port
    host = url.hostname if port == default_port else f"{url.hostname}:{port}"
    now = datetime.datetime.now(datetime.UTC)
    amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    hdrs = {k.lower(): v for k, v in (headers or {}).items()}
    payload = hdrs.setdefault("x-amz-content-sha256", hashlib.sha256(body).hexdigest())
    canonical_path = quote(path or "/", safe="/-_.~")
    canonical_query = "&".join(
        f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in sorted((query or {}).items())
    )
    hdrs.update({"host": host, "x-amz-date": amz_date})
    if session_token:
        hdrs["x-amz-security-token"] = session_token
    signed = ";".join(sorted(hdrs))
    canonical = "\n".join(
        [
            method,
            canonical_path,
            canonical_query,
            *(f"{k}:{hdrs[k]}" for k in sorted(hdrs)),
            "",
            signed,
            payload,
        ]
    )
    scope = f"{day}/{region}/s3/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = _hmac(_hmac(_hmac(_hmac(f"AWS4{secret_key}".encode(), day), region), "s3"), "aws4_request")
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    hdrs["authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, SignedHeaders={signed}, Signature={signature}"
    )
    conn: http.client.HTTPConnection
    if url.scheme == "https":
        context = ssl.create_default_context(cafile=ca_bundle)
        conn = http.client.HTTPSConnection(url.hostname, port, timeout=timeout, context=context)
    else:
        conn = http.client.HTTPConnection(url.hostname, port, timeout=timeout)
    try:
        target = f"{canonical_path}?{canonical_query}" if canonical_query else canonical_path
        conn.request(method, target, body=body or None, headers=hdrs)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def error_code(body: bytes) -> str:
    """The ``<Code>`` of an S3 XML error body ('' when there is none)."""
    found = re.search(rb"<Code>([^<]{1,100})</Code>", body)
    return found.group(1).decode(errors="replace") if found else ""


def error_message(body: bytes) -> str:
    """The ``<Message>`` of an S3 XML error body ('' when there is none)."""
    found = re.search(rb"<Message>([^<]{1,500})</Message>", body)
    return found.group(1).decode(errors="replace") if found else ""


def request_with_settings(
    settings: S3Settings, method: str, bucket: str, key: str = "", query: Mapping[str, str] | None = None
) -> tuple[int, bytes]:
    """One signed request for ``bucket``/``key`` with resolved settings (path or virtual style).

    Raises ``ValueError`` when the settings hold no explicit credentials (profiles, instance
    roles and the like are resolved by the client libraries only).
    """
    s = settings
    if s.access_key_id is None or s.secret_access_key is None:
        raise ValueError("needs AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (explicit credentials)")
    endpoint = s.endpoint_url or f"https://s3.{s.region}.amazonaws.com"
    path = f"/{bucket}/{key}" if key else f"/{bucket}"
    if not s.path_style:
        url = urlsplit(endpoint)
        endpoint, path = f"{url.scheme}://{bucket}.{url.netloc}", f"/{key}"
    return sigv4_request(
        method,
        endpoint,
        path,
        query=query,
        access_key=s.access_key_id,
        secret_key=s.secret_access_key.reveal(),
        session_token=s.revealed("session_token"),
        region=s.region,
        ca_bundle=s.ca_bundle,
        timeout=max(s.connect_timeout, s.request_timeout),
    )


def upload_ids(settings: S3Settings, bucket: str, key: str) -> list[str]:
    """Ids of unfinished multipart uploads of exactly ``key`` (first listing page)."""
    status, body = request_with_settings(settings, "GET", bucket, query={"uploads": "", "prefix": key})
    if status != 200:
        raise OSError(f"ListMultipartUploads: HTTP {status} {error_code(body)}")
    uploads = re.findall(rb"<Upload>(.*?)</Upload>", body, re.S)
    return [
        m.group(1).decode()
        for u in uploads
        if re.search(rb"<Key>" + re.escape(escape(key).encode()) + rb"</Key>", u)
        and (m := re.search(rb"<UploadId>([^<]+)</UploadId>", u))
    ]

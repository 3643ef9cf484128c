"""Where S3-compatible stores differ from AWS, and the workarounds asyncckpt uses.

Verified against OpenStack Swift 2.30.1 + s3api (Debian 12) with botocore/boto3 1.43 and
aiobotocore 3.10 over plain HTTP; the keys of :data:`QUIRKS` are what
:attr:`asyncckpt.servers.s3endpoint.S3Endpoint.quirks` lists for such a server.

What works unchanged: buckets, put/get, multipart create/upload_part/list_parts/
list_multipart_uploads/complete (ETag ``md5-of-md5s-N``)/abort (``NoSuchUpload`` after),
range GET, ``EntityTooSmall`` for non-last parts < 5 MiB. Over ``http://`` botocore sends
flexible checksums as a header (never aws-chunked), so its defaults work; the fastest
settings that work are in :data:`FAST_CLIENT_CONFIG`.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

#: quirk key → what differs from AWS and what a client must do
QUIRKS: dict[str, str] = {
    "delete-objects-needs-md5": (
        "DeleteObjects without Content-MD5 fails with InvalidRequest 'Missing required header for this "
        "request: Content-MD5' (botocore >= 1.36 sends a CRC32 instead): register add_content_md5 "
        "(see register_s3compat) or delete keys one by one. s3dlio 0.10 delete() also uses DeleteObjects "
        "without Content-MD5 (and has no single-object delete): the s3dlio sink then sends one signed "
        "DELETE itself (asyncckpt.sinks.s3.sigv4)"
    ),
    "no-partnumber-get": (
        "GET/HEAD with PartNumber= is refused with 405 MethodNotAllowed: read parts with Range GETs"
    ),
    "checksums-ignored": (
        "x-amz-checksum-* headers are neither verified nor stored: a wrong checksum is accepted, so "
        "integrity must come from Content-MD5 (verified) or from reading back"
    ),
    "no-aws-chunked": (
        "aws-chunked bodies (STREAMING-* x-amz-content-sha256, used for trailing checksums) are refused: "
        "send plain bodies — botocore does over http://; over https:// use "
        "request_checksum_calculation='when_required'"
    ),
    "full-is-503": (
        "a full disk shows as 503 ServiceUnavailable 'Please reduce your request rate', the same code as "
        "throttling: after retries are exhausted, every S3 sink reports it as 'out of space or overloaded' "
        "(asyncckpt.sinks.s3.common.UNAVAILABLE_HINT)"
    ),
}

#: botocore ``Config`` keywords that work on AWS and on Swift and skip per-part hashing work
FAST_CLIENT_CONFIG: dict[str, Any] = {
    "request_checksum_calculation": "when_required",
    "response_checksum_validation": "when_required",
    "s3": {"addressing_style": "path", "payload_signing_enabled": False},
}


def add_content_md5(params: dict[str, Any], **_: Any) -> None:
    """botocore ``before-call.s3.DeleteObjects`` handler: add the Content-MD5 Swift requires.

    ``params`` is botocore's request dict; its body is the serialized XML (bytes) by then.
    Harmless on AWS, which accepts Content-MD5 on DeleteObjects.
    """
    headers = params.setdefault("headers", {})
    body = params.get("body") or b""
    if isinstance(body, str):
        body = body.encode()
    if isinstance(body, bytes | bytearray) and "Content-MD5" not in headers:
        headers["Content-MD5"] = base64.b64encode(hashlib.md5(body).digest()).decode()


def register_s3compat(client: Any) -> Any:
    """Register the workarounds on a boto3 or aiobotocore S3 client; returns the client."""
    client.meta.events.register("before-call.s3.DeleteObjects", add_content_md5, unique_id="asyncckpt-md5")
    return client

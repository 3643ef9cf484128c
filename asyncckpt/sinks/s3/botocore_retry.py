"""Let botocore retry requests whose body is a ``memoryview`` (the pool's zero-copy buffers).

Before each retry botocore calls ``AWSRequest.reset_stream()``, which treats only ``bytes``,
``bytearray`` and ``str`` as static bodies and tries ``seek(0)`` on anything else; a
``memoryview`` has no ``seek``, so every retry of ``upload_part`` failed with
``UnseekableStreamError`` and the server's real answer (e.g. Swift's 503 on a full disk) was
lost. A memoryview is static like ``bytes``: the retry builds a new request from the same
request dict and sends the whole view again. This handler marks such requests as needing no
rewind; streams keep botocore's behaviour.
"""

from __future__ import annotations

from typing import Any


def _static_body_reset(request: Any, **_: Any) -> None:
    """``before-send`` handler (its ``request`` is the prepared request botocore rewinds).

    No rewind for a memoryview body: it is re-sent whole. Returns None: a ``before-send``
    handler that returned a response would replace the real one.
    """
    if isinstance(request.body, memoryview):
        request.reset_stream = _no_rewind


def _no_rewind() -> None:
    return None


def allow_memoryview_retries(client: Any) -> Any:
    """Register the handler on a boto3/aiobotocore S3 client; returns the client."""
    client.meta.events.register(
        "before-send.s3.UploadPart", _static_body_reset, unique_id="asyncckpt-memoryview-retry"
    )
    client.meta.events.register(
        "before-send.s3.PutObject", _static_body_reset, unique_id="asyncckpt-memoryview-retry-put"
    )
    return client

"""What every S3 sink shares: S3 targets, settings, endpoints, limits and error codes.

The object-store protocols (the error boundary, whole-object calls, multipart and append) are
the store-generic :mod:`asyncckpt.sinks.objstore`; :class:`S3SinkBase` fills its hooks with S3's
(``s3://bucket/key``, :class:`S3Settings`, several endpoints, 10 000 parts of 5 MiB or more).
Foreign exceptions (botocore, minio, s3dlio, Mountpoint, obstore) are read by each backend into
an :class:`ErrorFields`, and S3's codes (:data:`S3_ERRORS`) turn that into the asyncckpt
hierarchy. Messages are built from what the sink knows (bucket, key, backend, endpoint) and the
library's code and text; settings hold secrets as ``Secret``, so none can be part of one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, ClassVar

from ... import env
from ...errors import ConfigError, StorageError
from ...node.distributed import rank_info_from_env
from ..objstore.base import ObjectStoreSink, log
from ..objstore.errors import ErrorFields, ErrorVocabulary, matches
from ..objstore.errors import classify as classify_in
from .config import S3Settings, parse_s3_uri, plan_parts
from .endpoints import EndpointRouter

__all__ = [
    "S3_ERRORS",
    "ErrorFields",
    "S3SinkBase",
    "classify",
    "export_to_environment",
    "fields_from_text",
    "log",
    "storage_error",
]

NOT_FOUND_CODES = ("NoSuchBucket", "NoSuchKey", "NotFound", "NoSuchUpload", "404")
DENIED_CODES = (
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "InvalidClientTokenId",
    "AllAccessDisabled",
    "403",
    "Forbidden",
)


#: how a 503 looks in each library's error (code or text): S3 throttling, or a full store
UNAVAILABLE_MARKERS = (
    "ServiceUnavailable",
    "Service Unavailable",
    "SlowDown",
    "503 error responses",  # urllib3 (minio) after its retries
    "reduce your request rate",
    "Request throttled",  # Mountpoint (s3torchconnector)
)
UNAVAILABLE_HINT = (
    " (the server answered 503 Service Unavailable after retries: it is out of space or overloaded; "
    "OpenStack Swift reports a full disk this way; free space or lower the request rate)"
)


S3_ERRORS = ErrorVocabulary(
    not_found=NOT_FOUND_CODES,
    denied=DENIED_CODES,
    unavailable=UNAVAILABLE_MARKERS,
    unavailable_hint=UNAVAILABLE_HINT,
    denied_hint=(
        " (check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN and the bucket policy)"
    ),
)


def classify(fields: ErrorFields, what: str) -> StorageError:
    """The asyncckpt error for what an S3 library said (:func:`~..objstore.errors.classify`
    with S3's codes)."""
    return classify_in(fields, what, S3_ERRORS)


def storage_error(code: str, message: str, what: str, settings: S3Settings) -> StorageError:
    """The asyncckpt error for an S3 error ``code`` (or free text containing one)."""
    del settings  # messages never include settings: no secret can reach one
    return classify(ErrorFields(code=code, message=message), what)


def fields_from_text(exc: BaseException, *, unreachable_markers: tuple[str, ...]) -> ErrorFields:
    """For libraries that give only text (s3dlio, Mountpoint): names first, then whole-word
    statuses, so a request id such as "…f403a…" never turns a missing object into a denial."""
    text = str(exc)
    low = text.lower()
    message = f"{type(exc).__name__}: {text}"
    if any(n in text for n in ("NotFound", "NoSuchKey", "NoSuchBucket")) or "not found" in low:
        return ErrorFields("NotFound", message)
    if matches(S3_ERRORS.denied_re, text) or "access denied" in low or "forbidden" in low:
        return ErrorFields("AccessDenied", message)
    if re.search(r"\b404\b", text):
        return ErrorFields("NotFound", message, 404)
    if re.search(r"\b403\b", text):
        return ErrorFields("AccessDenied", message, 403)
    if any(m in low for m in unreachable_markers):
        return ErrorFields(message=message, unreachable=True)
    return ErrorFields(message=message)


class S3SinkBase(ObjectStoreSink[S3Settings]):
    """One object ``s3://bucket/key``: the S3 hooks of the generic object-store sink."""

    multi_endpoint: ClassVar[bool] = True
    scheme = "s3"
    store_name = "S3"
    error_vocabulary = S3_ERRORS
    leftover_hint = "list_multipart_uploads shows it for cleanup"
    #: whether each request may go to a different endpoint (one client per endpoint)
    per_request_endpoints: ClassVar[bool] = False

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> None:
        S3Settings.resolve({**options, "dotenv": False}, env={})

    @classmethod
    def parse_target(cls, uri: str) -> tuple[str, str]:
        return parse_s3_uri(uri)

    @classmethod
    def resolve_settings(cls, options: Mapping[str, Any]) -> S3Settings:
        return S3Settings.resolve(options)

    def plan_layout(self, size: int) -> int:
        return plan_parts(size, self.part_size, self.options.chunk_size)

    def configure(self) -> None:
        self.router: EndpointRouter | None = None
        self.endpoint_strategy: str | None = None
        if len(self.settings.endpoints) > 1:
            self._plan_endpoints()

    def _plan_endpoints(self) -> None:
        """Several endpoints: a router for backends that switch per request, else ``rank % N``.

        A per-request strategy asked for explicitly of a backend that cannot do it is an error
        (raised here, before any I/O) rather than a silent downgrade; left at its default, the
        strategy becomes ``rank`` and describe() says why.
        """
        s, rank = self.settings, rank_info_from_env().rank
        if self.per_request_endpoints:
            self.router = EndpointRouter(s.endpoints, s.lb_strategy, rank=rank)
            self.endpoint_strategy = s.lb_strategy
            return
        if s.lb_strategy != "rank" and s.lb_strategy_explicit:
            raise ConfigError(
                f"backend {self.backend!r} cannot send each part to a different endpoint, but load-balance "
                f"strategy {s.lb_strategy!r} was requested ({s.sources.get('lb_strategy', 'option')}) for "
                f"{len(s.endpoints)} endpoints; use strategy 'rank' (one endpoint per MPI rank, rank % N) "
                "or backend 'aiobotocore'"
            )
        self.settings = replace(s, endpoint_url=s.endpoints[rank % len(s.endpoints)])
        self.endpoint_strategy = f"rank (per-request balancing not supported by {self.backend})"

    def location(self) -> str:
        if self.router is not None:
            return f"endpoint {len(self.router.endpoints)} endpoints, {self.router.strategy}"
        return f"endpoint {self.settings.endpoint_url or 'AWS'}"

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        if self.endpoint_strategy is not None:
            out["endpoint_strategy"] = self.endpoint_strategy
            out["endpoints_configured"] = len(self.settings.endpoints)
        if self.router is not None:
            stats = self.router.stats()
            out["endpoint_retries"] = stats["retries"]
            out["endpoints"] = stats["endpoints"]
        return out


_SECRET_VARS = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


def export_to_environment(settings: S3Settings) -> tuple[object, ...]:
    """Publish resolved settings as AWS_* variables for libraries that only read the environment.

    s3dlio and Mountpoint's CRT take credentials and endpoint process-wide from the
    environment; this is the one place asyncckpt writes ``os.environ``, and only for those
    backends (in an isolated writer process it touches the child alone). Returns a
    fingerprint to detect a second, conflicting configuration in the same process.
    """
    values = {
        "AWS_ENDPOINT_URL": settings.endpoint_url,
        "AWS_ACCESS_KEY_ID": settings.access_key_id,
        "AWS_SECRET_ACCESS_KEY": settings.revealed("secret_access_key"),
        "AWS_SESSION_TOKEN": settings.revealed("session_token"),
        "AWS_REGION": settings.region,
        "AWS_DEFAULT_REGION": settings.region,
        "AWS_CA_BUNDLE": settings.ca_bundle,
    }
    env.export({name: value for name, value in values.items() if value is not None})
    if settings.access_key_id is not None and settings.session_token is None:
        env.export({"AWS_SESSION_TOKEN": None})  # a stale token would not match the new key
    # the fingerprint keeps secrets wrapped (Secret compares by value, prints masked)
    return (
        *(v for k, v in values.items() if k not in _SECRET_VARS),
        settings.secret_access_key,
        settings.session_token,
    )

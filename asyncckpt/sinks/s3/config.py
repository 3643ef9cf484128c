"""S3 settings resolved the way AWS users expect, validated before any I/O, never leaking secrets.

Secrets are held as :class:`~asyncckpt.secrets.Secret` (wrapped where they enter: options,
environment, ``.env``) and revealed only in the call that hands them to a client library;
endpoint URLs with ``user:password@`` are refused.

Precedence: explicit ``backend_options`` > process environment > a ``.env`` file (read, never
exported into ``os.environ``). Defaults favour honest client throughput on trusted links:
unsigned payloads and checksums only where the service requires them (measured against a
discard endpoint: aiobotocore ≈ 0.55 GB/s with SHA-256 payload signing + CRC32 per part,
≈ 1.0-1.3 GB/s without; see docs/s3.md). Turn ``payload_signing`` on over untrusted plain
HTTP; with aiobotocore the SHA-256 then runs on the event-loop thread (≈ 33 ms per 32 MiB
part measured here), which also delays everything else the loop serves.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ... import env as env_vars
from ...errors import ConfigError
from ...modes import ChecksumMode, choices
from ...secrets import Secret, as_secret, check_no_userinfo
from ...units import GiB, MiB, parse_size
from ..objstore.options import check_known
from .endpoints import STRATEGIES, endpoints_from_env, strategy_from_env

MIN_PART = 5 * MiB
MAX_PART = 5 * GiB
MAX_PARTS = 10_000
CHECKSUM_MODES = choices(ChecksumMode)
DEFAULT_REGION = "us-east-1"
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")

#: backend_options key → environment variable(s), first set wins (defined in asyncckpt.env)
_ENV_KEYS = env_vars.AWS_VARIABLES
OPTION_KEYS = frozenset(
    {*_ENV_KEYS, "path_style", "part_size", "max_in_flight", "payload_signing", "checksums"}
    | {"max_attempts", "connect_timeout", "request_timeout", "dotenv", "endpoints", "lb_strategy"}
)
SECRET_FIELDS = ("secret_access_key", "session_token")  # held as Secret


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/key`` → (bucket, key), with errors that say what is wrong."""
    parts = urlsplit(uri)
    if parts.scheme.lower() != "s3":
        raise ConfigError(f"not an S3 URI: {uri!r}; expected s3://bucket/key")
    bucket, key = parts.netloc, parts.path.lstrip("/")
    if parts.query or parts.fragment:
        raise ConfigError(f"S3 URI {uri!r} has a query or fragment; expected s3://bucket/key")
    if not bucket:
        raise ConfigError(f"S3 URI {uri!r} names no bucket; expected s3://bucket/key")
    if not _BUCKET_RE.match(bucket):
        raise ConfigError(
            f"invalid bucket name {bucket!r} in {uri!r}: 3-63 characters of a-z, 0-9, '.', '-', "
            "starting and ending with a letter or digit"
        )
    if not key:
        raise ConfigError(f"S3 URI {uri!r} names no object key; expected s3://{bucket}/key")
    if key.endswith("/"):
        raise ConfigError(f"S3 URI {uri!r} ends with '/', which names a prefix, not an object")
    return bucket, key


def _bool(name: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in (
        "1",
        "true",
        "yes",
        "on",
        "0",
        "false",
        "no",
        "off",
    ):
        return value.strip().lower() in ("1", "true", "yes", "on")
    raise ConfigError(f"backend option {name} must be a boolean, got {value!r}")


def _seconds(name: str, value: object) -> float:
    if isinstance(value, str):  # from the CLI or a .env-style source
        with contextlib.suppress(ValueError):
            value = float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise ConfigError(f"backend option {name} must be a number of seconds > 0, got {value!r}")
    return float(value)


def _int(name: str, value: object, minimum: int = 1) -> int:
    if isinstance(value, str):
        value = parse_size(value, name=name)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"backend option {name} must be an integer >= {minimum}, got {value!r}")
    return value


@dataclass(frozen=True, kw_only=True)
class S3Settings:
    """Everything an S3 client needs; ``repr``/``str`` show whether secrets are set, never them."""

    endpoint_url: str | None = None
    region: str = DEFAULT_REGION
    access_key_id: str | None = field(default=None, repr=False)
    secret_access_key: Secret | None = field(default=None, repr=False)
    session_token: Secret | None = field(default=None, repr=False)
    ca_bundle: str | None = None
    path_style: bool = True
    part_size: int | None = None  # None: the pipeline's chunk size (one chunk = one part)
    max_in_flight: int = 8  # parts a library uploads concurrently inside one writer
    payload_signing: bool = False
    checksums: ChecksumMode = "when_required"
    max_attempts: int = 3
    connect_timeout: float = 5.0
    #: longest one request waits on the server before it fails (and is retried); docs/s3.md
    request_timeout: float = 10.0
    #: several front ends of one store (multi-endpoint mode when 2 or more); see endpoints.py
    endpoints: tuple[str, ...] = ()
    lb_strategy: str = "round_robin"
    lb_strategy_explicit: bool = False  # set by option or S3_LOAD_BALANCE_STRATEGY, not defaulted
    sources: dict[str, str] = field(default_factory=dict, compare=False)  # key → where it came from

    def __repr__(self) -> str:
        shown = {
            "endpoint_url": self.endpoint_url,
            "region": self.region,
            "access_key_id": "set" if self.access_key_id else "unset",
            "secret_access_key": self.secret_access_key or "unset",
            "session_token": self.session_token or "unset",
            "ca_bundle": self.ca_bundle,
            "path_style": self.path_style,
            "part_size": self.part_size,
            "max_in_flight": self.max_in_flight,
            "payload_signing": self.payload_signing,
            "checksums": self.checksums,
            "request_timeout": self.request_timeout,
            "endpoints": self.endpoints,
            "lb_strategy": self.lb_strategy,
        }
        return "S3Settings(" + ", ".join(f"{k}={v!r}" for k, v in shown.items()) + ")"

    __str__ = __repr__

    def revealed(self, name: str) -> str | None:
        """A secret field's value, for the one call that gives it to a client library."""
        value: Secret | None = getattr(self, name)
        return None if value is None else value.reveal()

    def describe(self) -> dict[str, Any]:
        """Non-secret facts for the run metadata."""
        return {
            "endpoint_url": self.endpoint_url or "AWS default",
            "region": self.region,
            "path_style": self.path_style,
            "payload_signing": self.payload_signing,
            "checksums": self.checksums,
            "request_timeout_s": self.request_timeout,
            "settings_from": dict(self.sources),
        }

    @classmethod
    def resolve(
        cls, options: Mapping[str, Any], env: Mapping[str, str] | None = None, cwd: Path | None = None
    ) -> S3Settings:
        """Merge ``options`` > ``env`` (default os.environ) > ``.env``; validate everything."""
        check_known(options, OPTION_KEYS, "S3")
        env = env_vars.environ(env)
        dotenv = env_vars.dotenv(options.get("dotenv", True), cwd)
        values: dict[str, Any] = {}
        sources: dict[str, str] = {}
        for key, names in _ENV_KEYS.items():
            if options.get(key) is not None:
                value = options[key]
                values[key] = as_secret(key, value) if key in SECRET_FIELDS else str(value)
                sources[key] = "backend_options"
                continue
            for origin, mapping in (("environment", env), (".env", dotenv)):
                hit = next((n for n in names if mapping.get(n)), None)
                if hit is not None:
                    values[key] = Secret(mapping[hit]) if key in SECRET_FIELDS else mapping[hit]
                    sources[key] = f"{origin} {hit}"
                    break
        if values.get("endpoint_url") is not None:  # before any message can name it
            check_no_userinfo(values["endpoint_url"], f"S3 endpoint (from {sources['endpoint_url']})")
        _resolve_endpoints(options, env, values, sources)
        endpoint = values.get("endpoint_url")
        if endpoint is not None:
            ep = urlsplit(endpoint)
            if ep.scheme not in ("http", "https") or not ep.netloc:
                raise ConfigError(f"S3 endpoint {endpoint!r} must look like http(s)://host[:port]")
            values["endpoint_url"] = endpoint.rstrip("/")
        if (values.get("access_key_id") is None) != (values.get("secret_access_key") is None):
            raise ConfigError(
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must be given together "
                f"(access key {sources.get('access_key_id', 'missing')}, "
                f"secret {sources.get('secret_access_key', 'missing')})"
            )
        # custom endpoints (MinIO, Ceph, Swift, moto) rarely have wildcard DNS for buckets
        values["path_style"] = _bool("path_style", options.get("path_style", endpoint is not None))
        if options.get("part_size") is not None:
            values["part_size"] = _int("part_size", options["part_size"])
            check_part_size(values["part_size"])
        if options.get("max_in_flight") is not None:
            values["max_in_flight"] = _int("max_in_flight", options["max_in_flight"])
        values["payload_signing"] = _bool("payload_signing", options.get("payload_signing", False))
        checksums = options.get("checksums", "when_required")
        if checksums not in CHECKSUM_MODES:
            raise ConfigError(
                f"backend option checksums must be one of {', '.join(CHECKSUM_MODES)}, got {checksums!r}"
            )
        values["checksums"] = checksums
        if options.get("max_attempts") is not None:
            values["max_attempts"] = _int("max_attempts", options["max_attempts"])
        for name in ("connect_timeout", "request_timeout"):
            if options.get(name) is not None:
                values[name] = _seconds(name, options[name])
        return cls(**values, sources=sources)


def _resolve_endpoints(
    options: Mapping[str, Any], env: Mapping[str, str], values: dict[str, Any], sources: dict[str, str]
) -> None:
    """Multi-endpoint list and strategy: option ``endpoints`` > an explicit ``endpoint_url``
    option (one endpoint) > S3_ENDPOINT_URIS / _TEMPLATE / _FILE > AWS_ENDPOINT_URL(_S3)."""
    raw = options.get("endpoints")
    if isinstance(raw, str):
        raw = [u for u in raw.split(",") if u.strip()]
    if raw is not None and (not isinstance(raw, (list, tuple)) or not all(isinstance(u, str) for u in raw)):
        raise ConfigError(f"backend option endpoints must be a list of URLs or a comma list, got {raw!r}")
    urls: list[str] = []
    if raw:
        urls, origin = endpoints_from_env(list(raw), {})
        origin = "backend_options"
    elif options.get("endpoint_url") is None:
        multi_env = {
            k: env[k] for k in ("S3_ENDPOINT_URIS", "S3_ENDPOINT_TEMPLATE", "S3_ENDPOINT_FILE") if k in env
        }
        urls, origin = endpoints_from_env(None, multi_env)
        origin = f"environment {origin}"
    for url in urls:
        check_no_userinfo(url, f"S3 endpoint (from {origin})")
    if len(urls) > 1:
        values["endpoints"] = tuple(urls)
        values["endpoint_url"], sources["endpoint_url"] = urls[0], origin
        sources["endpoints"] = origin
    elif len(urls) == 1:  # one endpoint given the multi-endpoint way: the ordinary single path
        values["endpoint_url"], sources["endpoint_url"] = urls[0], origin
    strategy = options.get("lb_strategy")
    if strategy is not None:
        if strategy not in STRATEGIES:
            raise ConfigError(
                f"backend option lb_strategy={strategy!r} is not one of {', '.join(STRATEGIES)}"
            )
        values["lb_strategy"], sources["lb_strategy"] = strategy, "backend_options"
        values["lb_strategy_explicit"] = True
    else:
        values["lb_strategy"] = strategy_from_env(env)
        if env_vars.load_balance_strategy(env) is not None:
            values["lb_strategy_explicit"] = True
            sources["lb_strategy"] = "environment S3_LOAD_BALANCE_STRATEGY"


def check_part_size(part_size: int) -> None:
    """S3 limits on one part (the last part alone may be smaller)."""
    if part_size < MIN_PART:
        raise ConfigError(f"part_size {part_size} B is below the S3 minimum of 5 MiB; raise part_size")
    if part_size > MAX_PART:
        raise ConfigError(f"part_size {part_size} B exceeds the S3 maximum of 5 GiB; lower part_size")


def plan_parts(size: int, part_size: int, chunk_size: int | None) -> int:
    """Validate a multipart layout for an object of ``size``; return the number of parts."""
    check_part_size(part_size)
    nparts = -(-size // part_size)
    if nparts > MAX_PARTS:
        need = -(-size // MAX_PARTS)
        raise ConfigError(
            f"{size} B in parts of {part_size} B needs {nparts} parts, more than S3's {MAX_PARTS}; "
            f"use part_size >= {-(-need // MiB)} MiB (and a chunk_size that is a multiple of it)"
        )
    if chunk_size is not None and chunk_size % part_size:
        raise ConfigError(
            f"chunk_size {chunk_size} B is not a multiple of part_size {part_size} B; each buffer must "
            "hold whole parts: set part_size to chunk_size (the default) or to a divisor of it"
        )
    return nparts

"""Google Cloud Storage settings: endpoint, credential (a :class:`~asyncckpt.secrets.Secret`),
project, transport, validated once before any I/O.

Precedence: ``backend_options`` > the variables of :data:`asyncckpt.env.GCS_VARIABLES` (read
through :mod:`asyncckpt.env`) > the same variables in a ``.env`` file (backend option
``dotenv``, as for S3 and Azure).

Where requests go: ``endpoint_url``, else ``STORAGE_EMULATOR_HOST`` (the variable Google's own
clients honour), else the ``gcs_base_url`` of an emulator's service-account JSON (obstore's
convention, ``"disable_oauth": true``), else ``https://storage.googleapis.com``. An emulator
gets no credential (Google's clients send none to one either).

Credentials for real GCS: a bearer ``token`` (``GOOGLE_OAUTH_ACCESS_TOKEN``, e.g. from
``gcloud auth print-access-token``), or a service-account key (backend option
``service_account_key``, its JSON; ``GOOGLE_SERVICE_ACCOUNT_KEY`` holds its JSON,
``GOOGLE_APPLICATION_CREDENTIALS`` names its file, read once), exchanged for a token through
google-auth by the sink (:mod:`.auth`). Precedence: an explicit token (``backend_options``) >
an explicit key > a token from the environment > a key from the environment (> the same from a
``.env`` file). A key is validated here, before any I/O: ``type`` ``service_account``,
``client_email``, ``private_key`` (PEM) and ``token_uri`` present; a bad one is a ConfigError
naming where it came from and what is missing, never its contents (docs/azure-gcs.md).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ... import env as env_vars
from ...errors import ConfigError
from ...secrets import Secret, as_secret, check_no_userinfo, masked_url
from ...units import GiB, KiB
from ..objstore.options import check_known, layered, transport_values

#: every chunk of a resumable upload but the last is a multiple of this (GCS's rule)
CHUNK_GRANULE = 256 * KiB
MAX_OBJECT = 5 * 1024 * GiB
DEFAULT_ENDPOINT = "https://storage.googleapis.com"
#: 3-63 characters of a-z, 0-9, '-', '_' and '.', starting and ending with a letter or digit
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$")
_IP_RE = re.compile(r"^\d{1,3}(\.\d{1,3}){3}$")
SECRET_FIELDS = ("token", "service_account_key")
_ENV_KEYS = ("emulator_host", "application_credentials", "service_account_key", "project", "token")
OPTION_KEYS = frozenset(
    {"endpoint_url", "token", "service_account_key", "project", "ca_bundle", "dotenv"}
    | {"part_size", "max_in_flight", "max_attempts", "connect_timeout", "request_timeout"}
)


def parse_gs_uri(uri: str) -> tuple[str, str]:
    """``gs://bucket/key`` → (bucket, key), with errors that say what is wrong."""
    parts = urlsplit(uri)
    if parts.scheme.lower() != "gs":
        raise ConfigError(f"not a Google Cloud Storage URI: {uri!r}; expected gs://bucket/key")
    bucket, key = parts.netloc, parts.path.lstrip("/")
    if parts.query or parts.fragment:
        raise ConfigError(f"GCS URI {uri!r} has a query or fragment; expected gs://bucket/key")
    if (
        not _BUCKET_RE.match(bucket)
        or ".." in bucket
        or _IP_RE.match(bucket)
        or bucket.startswith("goog")
        or "google" in bucket
    ):
        raise ConfigError(
            f"invalid bucket name {bucket!r} in {uri!r}: 3-63 characters of a-z, 0-9, '-', '_' and '.', "
            "starting and ending with a letter or digit, not an IP address, not starting with 'goog'"
        )
    if not key or key.endswith("/"):
        raise ConfigError(f"GCS URI {uri!r} names no object; expected gs://{bucket}/key")
    if len(key.encode()) > 1024 or "\r" in key or "\n" in key or key in (".", ".."):
        raise ConfigError(f"invalid object name in {uri!r}: at most 1024 bytes, no CR or LF, not '.' or '..'")
    return bucket, key


@dataclass(frozen=True, kw_only=True)
class GcsSettings:
    """Everything the GCS client needs; ``repr`` shows whether a token is set, never it."""

    endpoint_url: str = DEFAULT_ENDPOINT
    emulator: bool = False  # an emulator endpoint: no credential is sent
    token: Secret | None = field(default=None, repr=False)
    #: a service-account key's JSON (exchanged for tokens by the sink), its account and endpoint
    service_account_key: Secret | None = field(default=None, repr=False)
    client_email: str | None = None
    token_uri: str | None = None
    project: str | None = None
    ca_bundle: str | None = None
    part_size: int | None = None
    max_in_flight: int = 1  # a resumable upload takes its chunks one after the other
    max_attempts: int = 3
    connect_timeout: float = 5.0
    request_timeout: float = 30.0
    sources: dict[str, str] = field(default_factory=dict, compare=False)

    def __repr__(self) -> str:
        return (
            f"GcsSettings(endpoint_url={self.endpoint_url!r}, emulator={self.emulator}, "
            f"token={self.token or 'unset'}, service_account_key={self.service_account_key or 'unset'}, "
            f"client_email={self.client_email!r}, project={self.project!r}, part_size={self.part_size!r})"
        )

    __str__ = __repr__

    def describe(self) -> dict[str, Any]:
        """Non-secret facts for the run metadata."""
        return {
            "endpoint_url": self.endpoint_url,
            "credential": self.credential(),
            "project": self.project,
            "request_timeout_s": self.request_timeout,
            "settings_from": dict(self.sources),
        }

    def credential(self) -> str:
        """What authenticates the requests, in words (no secret)."""
        if self.emulator:
            return "none (emulator)"
        if self.token is not None:
            return "bearer token"
        if self.service_account_key is not None:
            return f"service-account key ({self.client_email}, tokens from {self.token_uri})"
        return "none"

    @classmethod
    def resolve(
        cls, options: Mapping[str, Any], env: Mapping[str, str] | None = None, cwd: Path | None = None
    ) -> GcsSettings:
        """Merge ``options`` > ``env`` (default os.environ) > ``.env``; validate."""
        check_known(options, OPTION_KEYS, "GCS")
        raw, sources = layered(options, env, cwd, _ENV_KEYS, env_vars.gcs_variable)
        values: dict[str, Any] = {}
        token = as_secret("token", raw.get("token"))
        key = _service_account_key(raw, sources)
        base_url = _emulator_base_url(key)
        endpoint = raw.get("endpoint_url") or raw.get("emulator_host") or base_url
        if endpoint:
            where = (
                sources.get("endpoint_url") or sources.get("emulator_host") or sources["service_account_key"]
            )
            values["endpoint_url"] = _check_endpoint(str(endpoint), where)
            sources["endpoint_url"] = where
        emulator = bool(endpoint and not raw.get("endpoint_url") and (raw.get("emulator_host") or base_url))
        values["emulator"] = emulator
        if not emulator:
            chosen = _choose_credential(token, key, sources)
            if chosen == "token":
                values["token"] = token
                sources["credential"] = sources["token"]
            elif chosen == "service_account_key":
                assert key is not None
                where = sources["service_account_key"]
                info = check_service_account(key, where)
                values.update(
                    service_account_key=Secret(json.dumps(info)),
                    client_email=info["client_email"],
                    token_uri=info["token_uri"],
                )
                sources["credential"] = where
            elif not endpoint:
                raise ConfigError(
                    "no GCS credential: set GOOGLE_OAUTH_ACCESS_TOKEN (or backend option token) or "
                    "GOOGLE_APPLICATION_CREDENTIALS (a service-account key file) for "
                    "storage.googleapis.com, or STORAGE_EMULATOR_HOST for an emulator"
                )
        if raw.get("project") is not None:
            values["project"] = str(raw["project"])
        if raw.get("ca_bundle") is not None:
            values["ca_bundle"] = str(raw["ca_bundle"])
        values.update(transport_values(options))
        if "part_size" in values:
            check_chunk_granule(values["part_size"], "part_size")
        return cls(**values, sources=sources)


def _service_account_key(raw: dict[str, Any], sources: dict[str, str]) -> dict[str, Any] | None:
    """The service-account JSON (given, or read from GOOGLE_APPLICATION_CREDENTIALS' file);
    errors name where it came from, never its contents."""
    given = raw.get("service_account_key")
    if given is None and raw.get("application_credentials") is not None:
        path = Path(str(raw["application_credentials"]))
        where = sources["application_credentials"]
        try:
            given = Secret(path.read_text())
        except OSError as exc:
            raise ConfigError(f"GCS credentials file {str(path)!r} ({where}): {exc.strerror}") from None
        sources["service_account_key"] = f"{where} (the file {str(path)!r})"
    if given is None:
        return None
    secret = as_secret("service_account_key", given)
    assert secret is not None
    try:
        info = json.loads(secret.reveal())
    except ValueError:
        info = None
    if not isinstance(info, dict):
        raise ConfigError(
            f"the GCS service-account key ({sources['service_account_key']}) is not a JSON object"
        )
    return info


#: a source's rank for the credential's precedence: explicit > environment > .env
def _tier(source: str) -> int:
    return 0 if source == "backend_options" else 1 if source.startswith("environment") else 2


def _choose_credential(
    token: Secret | None, key: Mapping[str, Any] | None, sources: Mapping[str, str]
) -> str:
    """Which credential wins: an explicit token > an explicit key > an environment token > an
    environment key (> the same from ``.env``); "" when there is none."""
    ranked = []
    if token is not None:
        ranked.append((_tier(sources["token"]), 0, "token"))
    if key is not None and _emulator_base_url(key) is None:
        ranked.append((_tier(sources["service_account_key"]), 1, "service_account_key"))
    return min(ranked)[2] if ranked else ""


#: the fields a service-account key must have for the token exchange
KEY_FIELDS = ("client_email", "private_key", "token_uri")


def check_service_account(info: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``info`` if it is a usable service-account key, else a ConfigError naming ``where`` and
    the field at fault (never a value but the type's and the token endpoint's)."""
    kind = info.get("type")
    if kind != "service_account":
        raise ConfigError(
            f"the GCS credential ({where}) is not a service-account key: its field type is {kind!r}, "
            "expected 'service_account' (for other credentials give a bearer token: backend option "
            "token or GOOGLE_OAUTH_ACCESS_TOKEN, e.g. from gcloud auth print-access-token)"
        )
    missing = [name for name in KEY_FIELDS if not isinstance(info.get(name), str) or not info[name]]
    if missing:
        raise ConfigError(
            f"the GCS service-account key ({where}) lacks the field(s) {', '.join(missing)} "
            f"(a key needs type, {', '.join(KEY_FIELDS)})"
        )
    if "PRIVATE KEY-----" not in info["private_key"]:
        raise ConfigError(
            f"the GCS service-account key ({where}): its field private_key is not a PEM private key"
        )
    uri = urlsplit(info["token_uri"])
    if uri.scheme not in ("http", "https") or not uri.netloc or "@" in uri.netloc:
        shown = masked_url(info["token_uri"])
        raise ConfigError(
            f"the GCS service-account key ({where}): its field token_uri {shown!r} is not an http(s) "
            "URL without user information"
        )
    return dict(info)


def _emulator_base_url(key: Mapping[str, Any] | None) -> str | None:
    """An emulator's JSON (``gcs_base_url`` with ``disable_oauth``) names where it listens."""
    if key is not None and key.get("disable_oauth") is True and isinstance(key.get("gcs_base_url"), str):
        return str(key["gcs_base_url"])
    return None


def _check_endpoint(url: str, where: str) -> str:
    if "://" not in url:  # STORAGE_EMULATOR_HOST may be host:port
        url = f"http://{url}"
    check_no_userinfo(url, f"GCS endpoint (from {where})")
    ep = urlsplit(url)
    if ep.scheme not in ("http", "https") or not ep.netloc or ep.path.strip("/") or ep.query:
        raise ConfigError(f"GCS endpoint {url!r} ({where}) must look like http(s)://host[:port]")
    return url.rstrip("/")


def check_chunk_granule(size: int, name: str) -> None:
    if size % CHUNK_GRANULE:
        raise ConfigError(
            f"{name} {size} B is not a multiple of 256 KiB, which every chunk of a GCS resumable upload "
            f"but the last must be; use e.g. {max(1, size // CHUNK_GRANULE) * CHUNK_GRANULE} B"
        )


def plan_chunks(size: int, part_size: int, chunk_size: int | None) -> int:
    """Validate the upload's chunk layout for an object of ``size``; return the chunk count."""
    check_chunk_granule(part_size, "part_size" if chunk_size != part_size else "chunk_size")
    if size > MAX_OBJECT:
        raise ConfigError(f"{size} B exceeds GCS's object maximum of 5 TiB")
    if chunk_size is not None and chunk_size % part_size:
        raise ConfigError(
            f"chunk_size {chunk_size} B is not a multiple of part_size {part_size} B; each buffer must "
            "hold whole upload chunks: set part_size to chunk_size (the default) or to a divisor of it"
        )
    return -(-size // part_size)

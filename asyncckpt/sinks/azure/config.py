"""Azure Blob settings: account, key or SAS (as :class:`~asyncckpt.secrets.Secret`), endpoint,
validated once before any I/O.

Precedence: ``backend_options`` > ``AZURE_STORAGE_*`` variables (read through
:mod:`asyncckpt.env`) > the same variables in a ``.env`` file (backend option ``dotenv``, as
for S3) > the fields of ``AZURE_STORAGE_CONNECTION_STRING``. The endpoint is the
*account* URL (``http://127.0.0.1:10000/devstoreaccount1`` for Azurite), given to obstore
explicitly: ``use_emulator`` would ignore it and go to port 10000 (docs/azure-gcs.md).
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ... import env as env_vars
from ...errors import ConfigError
from ...secrets import Secret, as_secret, check_no_userinfo
from ...units import MiB
from ..objstore.options import check_known, layered, transport_values

MAX_BLOCK = 4000 * MiB
MAX_BLOCKS = 50_000
_CONTAINER_RE = re.compile(r"^(?=.{3,63}$)[a-z0-9](?:[a-z0-9]|-(?!-))*[a-z0-9]$")
#: settings key → its connection-string field
_CONNECTION_FIELDS = {
    "account": "AccountName",
    "account_key": "AccountKey",
    "sas_token": "SharedAccessSignature",
    "endpoint_url": "BlobEndpoint",
}
SECRET_FIELDS = ("account_key", "sas_token", "connection_string")
_ENV_KEYS = {"account", "account_key", "sas_token", "connection_string", "endpoint"}
OPTION_KEYS = frozenset(
    {"account", "account_key", "sas_token", "connection_string", "endpoint_url", "ca_bundle", "dotenv"}
    | {"part_size", "max_in_flight", "max_attempts", "connect_timeout", "request_timeout"}
)


def parse_az_uri(uri: str) -> tuple[str, str]:
    """``az://container/key`` → (container, key), with errors that say what is wrong."""
    parts = urlsplit(uri)
    if parts.scheme.lower() != "az":
        raise ConfigError(f"not an Azure Blob URI: {uri!r}; expected az://container/key")
    container, key = parts.netloc, parts.path.lstrip("/")
    if parts.query or parts.fragment:
        raise ConfigError(f"Azure Blob URI {uri!r} has a query or fragment; expected az://container/key")
    if not _CONTAINER_RE.match(container):
        raise ConfigError(
            f"invalid container name {container!r} in {uri!r}: 3-63 characters of a-z, 0-9 and single "
            "'-', starting and ending with a letter or digit"
        )
    if not key or key.endswith("/"):
        raise ConfigError(f"Azure Blob URI {uri!r} names no blob; expected az://{container}/key")
    return container, key


def parse_connection_string(text: str) -> dict[str, str]:
    """``Name=value;...`` fields (a value may contain '=': SAS tokens and keys do)."""
    fields = dict(part.split("=", 1) for part in text.split(";") if "=" in part)
    return {key: fields[name] for key, name in _CONNECTION_FIELDS.items() if fields.get(name)}


@dataclass(frozen=True, kw_only=True)
class AzureSettings:
    """Everything an Azure Blob client needs; ``repr`` shows whether secrets are set, never them."""

    account: str | None = None
    account_key: Secret | None = field(default=None, repr=False)
    sas_token: Secret | None = field(default=None, repr=False)
    endpoint_url: str | None = None  # the account URL; None: https://<account>.blob.core.windows.net
    ca_bundle: str | None = None
    part_size: int | None = None
    max_in_flight: int = 8
    max_attempts: int = 3
    connect_timeout: float = 5.0
    request_timeout: float = 10.0
    sources: dict[str, str] = field(default_factory=dict, compare=False)

    def __repr__(self) -> str:
        return (
            f"AzureSettings(account={self.account!r}, account_key={self.account_key or 'unset'}, "
            f"sas_token={self.sas_token or 'unset'}, endpoint_url={self.endpoint_url!r}, "
            f"part_size={self.part_size!r}, max_in_flight={self.max_in_flight})"
        )

    __str__ = __repr__

    def describe(self) -> dict[str, Any]:
        """Non-secret facts for the run metadata."""
        return {
            "endpoint_url": self.endpoint_url or "Azure default",
            "account": self.account,
            "credential": "account key" if self.account_key else "SAS" if self.sas_token else "none",
            "request_timeout_s": self.request_timeout,
            "settings_from": dict(self.sources),
        }

    @classmethod
    def resolve(
        cls, options: Mapping[str, Any], env: Mapping[str, str] | None = None, cwd: Path | None = None
    ) -> AzureSettings:
        """Merge ``options`` > ``env`` (default os.environ) > ``.env`` > its connection string;
        validate."""
        check_known(options, OPTION_KEYS, "Azure")
        raw, sources = _raw_values(options, env, cwd)
        values: dict[str, Any] = {k: v for k, v in raw.items() if k != "connection_string"}
        for key in ("account_key", "sas_token"):
            if key in values:
                values[key] = as_secret(key, values[key])
        if values.get("endpoint_url") is not None:
            url = str(values["endpoint_url"])
            check_no_userinfo(url, f"Azure endpoint (from {sources['endpoint_url']})")
            ep = urlsplit(url)
            if ep.scheme not in ("http", "https") or not ep.netloc:
                raise ConfigError(f"Azure endpoint {url!r} must look like http(s)://host[:port][/account]")
            values["endpoint_url"] = url.rstrip("/")
        if values.get("account") is None:
            raise ConfigError(
                "no Azure storage account: set AZURE_STORAGE_ACCOUNT (or AZURE_STORAGE_ACCOUNT_NAME, "
                "AZURE_STORAGE_CONNECTION_STRING) or backend option account"
            )
        if values.get("account_key") is not None and values.get("sas_token") is not None:
            raise ConfigError(
                f"give one Azure credential, not both an account key ({sources['account_key']}) "
                f"and a SAS token ({sources['sas_token']})"
            )
        if values.get("account_key") is not None:
            check_account_key(values["account_key"], sources["account_key"])
        if values.get("sas_token") is not None:
            check_sas(values["sas_token"], sources["sas_token"])
        values.update(transport_values(options))
        if "part_size" in values:
            check_block_size(values["part_size"])
        return cls(**values, sources=sources)


def _raw_values(
    options: Mapping[str, Any], env: Mapping[str, str] | None, cwd: Path | None
) -> tuple[dict[str, Any], dict[str, str]]:
    """Each setting's value and where it came from, before validation (secrets still raw); a
    connection string fills in what nothing else set."""
    values, sources = layered(
        options, env, cwd, _ENV_KEYS, env_vars.azure_variable, {"endpoint": "endpoint_url"}
    )
    connection = values.get("connection_string")
    if connection is not None:
        text = connection.reveal() if isinstance(connection, Secret) else str(connection)
        for key, value in parse_connection_string(text).items():
            if key not in values:
                values[key], sources[key] = value, f"connection string ({sources['connection_string']})"
    return values, sources


def check_account_key(key: Secret, source: str) -> None:
    """An account key is base64 (obstore would refuse it only when the store is built, outside
    the error boundary); the message names where it came from, never the value."""
    try:
        base64.b64decode(key.reveal(), validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError(f"the Azure account key ({source}) is not valid base64") from None


def check_sas(sas: Secret, source: str) -> None:
    """A SAS is a query string of ``name=value`` pairs with a signature (obstore refuses another
    shape only when the store is built, outside the error boundary); the value is never named."""
    pairs = [p for p in sas.reveal().lstrip("?").split("&") if p]
    if not pairs or not all("=" in p for p in pairs) or not any(p.startswith("sig=") for p in pairs):
        raise ConfigError(
            f"the Azure SAS token ({source}) is not a query string of name=value pairs with a sig= signature"
        )


def check_block_size(part_size: int) -> None:
    if part_size > MAX_BLOCK:
        raise ConfigError(
            f"part_size {part_size} B exceeds Azure's block maximum of 4000 MiB; lower part_size"
        )


def plan_blocks(size: int, part_size: int, chunk_size: int | None) -> int:
    """Validate a block layout for a blob of ``size``; return the number of blocks."""
    check_block_size(part_size)
    nparts = -(-size // part_size)
    if nparts > MAX_BLOCKS:
        raise ConfigError(
            f"{size} B in blocks of {part_size} B needs {nparts} blocks, more than Azure's {MAX_BLOCKS}; "
            f"raise part_size to at least {-(-size // MAX_BLOCKS)} B"
        )
    if chunk_size is not None and chunk_size % part_size:
        raise ConfigError(
            f"chunk_size {chunk_size} B is not a multiple of part_size {part_size} B; each buffer must "
            "hold whole blocks: set part_size to chunk_size (the default) or to a divisor of it"
        )
    return nparts

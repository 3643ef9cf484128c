"""The one module that reads the process environment.

Every variable asyncckpt honours is named here with its meaning and default, and read through
an accessor that takes an optional ``env`` mapping (tests and the CLI pass one; ``None`` is the
live process environment). A test (tests/test_env.py) fails if another module reads
``os.environ``, so this table stays complete. Values are validated where they are read: a bad
one is a :class:`~asyncckpt.errors.ConfigError` naming the variable, before any I/O.

Variables (meaning; default when unset):

- ``ASYNCCKPT_DATA_GEN``: synthetic data generator, :data:`modes.Generator`; ``dgen``.
- ``ASYNCCKPT_SHARED_MEMORY``: writer arena kind, :data:`modes.SharedMemoryKind`; ``auto``.
- ``ASYNCCKPT_MP_START_METHOD``, then ``MLPS_CHECKPOINT_MP_START_METHOD``: writer start method
  when the config gives none, :data:`modes.StartMethod`; ``auto``.
- ``S3_ENDPOINT_URIS``, ``S3_ENDPOINT_TEMPLATE``, ``S3_ENDPOINT_FILE`` (first set wins), then
  ``AWS_ENDPOINT_URL``: the endpoints of one S3 store; none.
- ``S3_LOAD_BALANCE_STRATEGY``: parts over endpoints, :data:`modes.LoadBalanceStrategy`;
  ``round_robin``.
- ``AWS_*`` (:data:`AWS_VARIABLES`): S3 endpoint, credentials, region, CA bundle; unset.
- ``S3DLIO_*`` (:data:`S3DLIO_VARIABLES`): s3dlio's own client settings; unset.
- ``AZURE_STORAGE_*`` (:data:`AZURE_VARIABLES`): Azure Blob account, key, SAS, endpoint; unset.
- ``STORAGE_EMULATOR_HOST``, ``GOOGLE_*`` (:data:`GCS_VARIABLES`): GCS emulator, credentials
  (a bearer token, or a service-account key: its JSON, or the file
  ``GOOGLE_APPLICATION_CREDENTIALS`` names, read once) and project; unset.
- ``XDG_CACHE_HOME``: where tools asyncckpt installs for tests live (Azurite); ``~/.cache``.
- a ``.env`` file (``KEY=value`` lines, :func:`dotenv`): the S3, Azure and GCS settings' last
  source, after ``backend_options`` and the process environment; never exported.
- launcher variables (``RANK``, ``OMPI_COMM_WORLD_*``, ``SLURM_*``, …, named in
  :mod:`asyncckpt.node.launcher`): rank and world size; a single process.

Writes (variables exported for a client library or a child process) go through
:func:`export` / :func:`exported` here too; the two that cannot (a writer child restoring its
parent's environment, dgen-py's thread count set before its pool starts) carry an
``# env-write:`` comment saying why.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from . import modes
from .errors import ConfigError

DATA_GEN: Final = "ASYNCCKPT_DATA_GEN"
SHARED_MEMORY: Final = "ASYNCCKPT_SHARED_MEMORY"
#: read in this order when the caller gives no start method
START_METHOD_VARS: Final = ("ASYNCCKPT_MP_START_METHOD", "MLPS_CHECKPOINT_MP_START_METHOD")
LOAD_BALANCE_STRATEGY: Final = "S3_LOAD_BALANCE_STRATEGY"
#: S3 settings key → its AWS variables, first set wins (the names AWS SDKs and CLIs use)
AWS_VARIABLES: Final[Mapping[str, tuple[str, ...]]] = {
    "endpoint_url": ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
    "access_key_id": ("AWS_ACCESS_KEY_ID",),
    "secret_access_key": ("AWS_SECRET_ACCESS_KEY",),
    "session_token": ("AWS_SESSION_TOKEN",),
    "region": ("AWS_REGION", "AWS_DEFAULT_REGION"),
    "ca_bundle": ("AWS_CA_BUNDLE",),
}
#: s3dlio reads these itself when it builds its client: whole seconds, and "1" for unsigned payloads
S3DLIO_VARIABLES: Final = (
    "S3DLIO_OPERATION_TIMEOUT_SECS",
    "S3DLIO_CONNECT_TIMEOUT_SECS",
    "S3DLIO_UNSIGNED_PAYLOAD",
)
#: Azure settings key → its variables, first set wins (obstore's names, then the Azure CLI's)
AZURE_VARIABLES: Final[Mapping[str, tuple[str, ...]]] = {
    "account": ("AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT"),
    "account_key": ("AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_KEY"),
    "sas_token": ("AZURE_STORAGE_SAS_TOKEN",),
    "connection_string": ("AZURE_STORAGE_CONNECTION_STRING",),
    # obstore: the account URL; s3dlio: the host it appends the account to (docs/azure-gcs.md)
    "endpoint": ("AZURE_STORAGE_ENDPOINT",),
}
#: GCS settings key → its variables (the emulator host is the one Google's own clients honour)
GCS_VARIABLES: Final[Mapping[str, tuple[str, ...]]] = {
    "emulator_host": ("STORAGE_EMULATOR_HOST",),
    "application_credentials": ("GOOGLE_APPLICATION_CREDENTIALS",),
    "service_account_key": ("GOOGLE_SERVICE_ACCOUNT_KEY",),
    "project": ("GOOGLE_CLOUD_PROJECT",),
    # a bearer token for real GCS (the name Terraform and Google's tools use)
    "token": ("GOOGLE_OAUTH_ACCESS_TOKEN",),
}


def environ(env: Mapping[str, str] | None = None) -> Mapping[str, str]:
    """``env`` when given, else the live process environment (to read, never to write)."""
    return os.environ if env is None else env


def _set(name: str, env: Mapping[str, str] | None) -> str:
    """The variable's value stripped; "" when unset or blank."""
    return environ(env).get(name, "").strip()


def data_generator(env: Mapping[str, str] | None = None) -> modes.Generator:
    """``ASYNCCKPT_DATA_GEN``: the default synthetic generator; ``dgen`` when unset."""
    generator: modes.Generator = modes.parse(
        DATA_GEN, _set(DATA_GEN, env) or "dgen", modes.Generator, variable=True
    )
    return generator


def shared_memory_kind(env: Mapping[str, str] | None = None) -> modes.SharedMemoryKind:
    """``ASYNCCKPT_SHARED_MEMORY``: memfd or a /dev/shm file for writer arenas; ``auto`` when unset."""
    kind: modes.SharedMemoryKind = modes.parse(
        SHARED_MEMORY, _set(SHARED_MEMORY, env) or "auto", modes.SharedMemoryKind, variable=True
    )
    return kind


def start_method(env: Mapping[str, str] | None = None) -> tuple[modes.StartMethod, str] | None:
    """(method, variable) from the first of :data:`START_METHOD_VARS` set; None when none is."""
    for name in START_METHOD_VARS:
        value = _set(name, env)
        if value:
            method: modes.StartMethod = modes.parse(name, value, modes.StartMethod, variable=True)
            return method, name
    return None


@dataclass(frozen=True)
class S3EndpointVars:
    """The multi-endpoint variables as set ("" when unset); asyncckpt.sinks.s3.endpoints parses them.

    ``uris``: comma-separated URLs; ``template``: one URL with ``{1...4}`` ranges; ``file``: a
    path to a file listing URLs; ``aws_endpoint_url``: the single-endpoint fallback.
    """

    uris: str = ""
    template: str = ""
    file: str = ""
    aws_endpoint_url: str = ""


def s3_endpoint_vars(env: Mapping[str, str] | None = None) -> S3EndpointVars:
    """``S3_ENDPOINT_URIS``, ``S3_ENDPOINT_TEMPLATE``, ``S3_ENDPOINT_FILE``, ``AWS_ENDPOINT_URL``."""
    return S3EndpointVars(
        uris=_set("S3_ENDPOINT_URIS", env),
        template=_set("S3_ENDPOINT_TEMPLATE", env),
        file=_set("S3_ENDPOINT_FILE", env),
        aws_endpoint_url=_set("AWS_ENDPOINT_URL", env),
    )


def load_balance_strategy(env: Mapping[str, str] | None = None) -> modes.LoadBalanceStrategy | None:
    """``S3_LOAD_BALANCE_STRATEGY`` validated; None when unset (the caller's default applies)."""
    value = _set(LOAD_BALANCE_STRATEGY, env)
    if not value:
        return None
    strategy: modes.LoadBalanceStrategy = modes.parse(
        LOAD_BALANCE_STRATEGY, value, modes.LoadBalanceStrategy, variable=True
    )
    return strategy


def aws_variable(key: str, env: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """(variable, value) of the first non-empty :data:`AWS_VARIABLES` ``[key]``; None when none is.

    Values are returned as set (not stripped): secrets are wrapped by the caller.
    """
    e = environ(env)
    return next(((n, e[n]) for n in AWS_VARIABLES[key] if e.get(n)), None)


def s3dlio_variable(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """One of :data:`S3DLIO_VARIABLES` as set, or None (e.g. to keep a value the user exported)."""
    if name not in S3DLIO_VARIABLES:
        raise KeyError(f"{name} is not an s3dlio variable asyncckpt knows")
    return environ(env).get(name)


def azure_variable(key: str, env: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """(variable, value) of the first non-empty :data:`AZURE_VARIABLES` ``[key]``; None when none is."""
    e = environ(env)
    return next(((n, e[n]) for n in AZURE_VARIABLES[key] if e.get(n)), None)


def gcs_variable(key: str, env: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """(variable, value) of the first non-empty :data:`GCS_VARIABLES` ``[key]``; None when none is."""
    e = environ(env)
    return next(((n, e[n]) for n in GCS_VARIABLES[key] if e.get(n)), None)


def cache_home(env: Mapping[str, str] | None = None) -> Path:
    """``XDG_CACHE_HOME``, else ``~/.cache``: where asyncckpt keeps tools it installs for tests."""
    value = _set("XDG_CACHE_HOME", env)
    return Path(value) if value else Path.home() / ".cache"


def child_environ(**overrides: str) -> dict[str, str]:
    """A copy of this process's environment plus ``overrides``, for a subprocess or writer child."""
    return {**os.environ, **overrides}


def export(values: Mapping[str, str | None]) -> None:
    """Set (or, for None, unset) variables in this process, for libraries that read only those."""
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@contextlib.contextmanager
def exported(values: Mapping[str, str]) -> Iterator[None]:
    """:func:`export` ``values`` for the block; the previous values (or their absence) come back."""
    saved = {name: os.environ.get(name) for name in values}
    export(values)
    try:
        yield
    finally:
        export(saved)


def read_dotenv(path: Path) -> dict[str, str]:
    """``KEY=value`` lines (optional ``export``, quotes, ``#`` comments); os.environ untouched."""
    out: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        name, _, value = line.removeprefix("export ").partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        elif " #" in value:
            value = value.split(" #", 1)[0].rstrip()
        out[name.strip()] = value
    return out


def dotenv(option: object = True, cwd: Path | None = None) -> dict[str, str]:
    """A store's ``dotenv`` backend option: ``True`` reads ``./.env`` when there is one, a path
    reads that file (a ConfigError naming it when it is missing), ``False`` reads nothing."""
    if option is False:
        return {}
    path = Path(option) if isinstance(option, (str, os.PathLike)) else (cwd or Path.cwd()) / ".env"
    if path.is_file():
        return read_dotenv(path)
    if option is not True:
        raise ConfigError(f"backend option dotenv={str(option)!r}: no such file")
    return {}

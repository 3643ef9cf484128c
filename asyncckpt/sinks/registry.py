"""The backend registry: backend names, URI schemes, and the sink class behind each."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..errors import ConfigError, UnsupportedSchemeError
from .azure import AZURE_BACKENDS, AZURE_DEFAULT, azure_factory, azure_sink_class
from .azure.config import OPTION_KEYS as AZURE_OPTION_KEYS
from .base import Sink, SinkOptions
from .direct import DirectFileSink
from .file import FileSink, path_from_uri
from .gcs import GCS_DEFAULT, GcsSink
from .gcs import OPTION_KEYS as GCS_OPTION_KEYS
from .memory import MemorySink, NullSink
from .s3 import S3_BACKENDS, auto_backend, factory, make_auto, sink_class
from .s3.config import OPTION_KEYS as S3_OPTION_KEYS

SinkFactory = Callable[..., Sink]

#: backend name → factory; object-store backends register here too
BACKENDS: dict[str, SinkFactory] = {
    "file": FileSink,
    "direct": DirectFileSink,  # files with O_DIRECT required
    "null": NullSink,
    "memory": MemorySink,
    "s3": make_auto,  # s3dlio when installed, else aiobotocore
    **{name: factory(name) for name in S3_BACKENDS},
    **{name: azure_factory(name) for name in AZURE_BACKENDS},
    GCS_DEFAULT: GcsSink,  # GCS's JSON API over aiohttp, imported on first use
}
#: URI scheme → default backend name
SCHEMES: dict[str, str] = {
    "": "file",
    "file": "file",
    "direct": "direct",
    "null": "null",
    "memory": "memory",
    "s3": "s3",
    "az": AZURE_DEFAULT,
    "gs": GCS_DEFAULT,
}
#: schemes known to have no backend, and why (a clearer answer than "unsupported scheme")
NO_BACKEND: dict[str, str] = {}


def register_backend(name: str, factory: SinkFactory, *, scheme: str | None = None) -> None:
    """Add a backend (and optionally make it the default for a URI scheme)."""
    BACKENDS[name] = factory
    if scheme is not None:
        SCHEMES[scheme] = name


def scheme_of(uri: str) -> str:
    """The URI scheme, or "" for a plain path (including Windows-looking drive letters)."""
    if "://" not in uri and not uri.startswith("file:"):
        return ""
    return urlsplit(uri).scheme.lower()


def check_backend(name: str) -> None:
    """An unknown backend name is bad input, named with the choices (not a bare KeyError)."""
    if name not in BACKENDS:
        raise UnsupportedSchemeError(f"unknown backend {name!r}; choose one of {', '.join(sorted(BACKENDS))}")


def resolve_backend(uri: str, backend: str | None = None) -> str:
    """The name of the library that will serve ``uri``: ``backend`` when it serves the URI's
    kind of store (files, S3, Azure, GCS), else the scheme's default.

    ``s3`` (the scheme's default, or asked for by name) is resolved here to the S3 library that
    is installed, so every decision taken from the name (isolation above all: s3dlio's runtime
    must not run in the caller) sees the library that will really run.
    """
    scheme = scheme_of(uri)
    if scheme in NO_BACKEND and scheme not in SCHEMES:
        raise UnsupportedSchemeError(f"{uri!r}: {NO_BACKEND[scheme]}")
    if scheme not in SCHEMES:
        known = ", ".join(f"{s}://" for s in sorted(SCHEMES) if s) + ", or a plain path"
        raise UnsupportedSchemeError(f"unsupported URI scheme {scheme!r} in {uri!r}; use {known}")
    if backend is not None:
        check_backend(backend)
    default = SCHEMES[scheme]
    name = backend if backend is not None and _kind(backend) == _kind(default) else default
    return auto_backend() if name == "s3" else name


def serves(backend: str, uri: str) -> bool:
    """Whether an explicit ``backend`` serves ``uri`` (its kind of store); otherwise the URI's
    default library does, which a caller that named a library may need to say."""
    return _kind(backend) == _kind(SCHEMES.get(scheme_of(uri), ""))


def _kind(name: str) -> str:
    """The kind of store a backend serves: an explicit ``backend`` chooses the library for the
    URIs of its kind only (a tiered manager's ``backend="aiobotocore"`` is for its ``s3://``
    remote; its local tier stays files)."""
    if name == "s3" or name in S3_BACKENDS:
        return "s3"
    if name in AZURE_BACKENDS:
        return "az"
    if name == GCS_DEFAULT:
        return "gs"
    return "file" if name in ("file", "direct") else name


def backend_class(name: str) -> type[Sink]:
    """The sink class behind backend ``name`` (resolved by :func:`resolve_backend`), whose class
    attributes are its capabilities (``default_in_flight``, ...). Imports asyncckpt's module for
    it, never the client library itself."""
    if name in S3_BACKENDS:
        return sink_class(name)
    if name in AZURE_BACKENDS:
        return azure_sink_class(name)
    check_backend(name)
    factory = BACKENDS[name]
    if not (isinstance(factory, type) and issubclass(factory, Sink)):
        raise ConfigError(f"backend {name!r} is registered as a factory, not a Sink class")
    return factory


def check_backend_options(backend: str | None, options: Mapping[str, Any]) -> None:
    """``options`` checked by the backend that takes them; with no backend named (the URI, not
    known here, will choose it) by the ``s3://`` scheme's, unless they are Azure or GCS options S3
    does not know (``account_key``, ``token``, ...): then by that scheme's. The sink checks them again
    against its own scheme, still before any I/O. Nothing imported but asyncckpt's modules."""
    if not options:
        return
    if backend is None and not set(options) <= S3_OPTION_KEYS and set(options) <= AZURE_OPTION_KEYS:
        backend = AZURE_DEFAULT
    if backend is None and not set(options) <= S3_OPTION_KEYS and set(options) <= GCS_OPTION_KEYS:
        backend = GCS_DEFAULT
    backend_class(auto_backend() if backend in (None, "s3") else backend).check_options(options)


def capabilities(uri: str, backend: str | None = None) -> type[Sink]:
    """The sink class that would serve ``uri``: ask its class attributes (``has_directories``,
    ``keeps_data``, ``multi_endpoint``, ...) instead of the URI's scheme. No I/O."""
    return backend_class(resolve_backend(uri, backend))


def local_path(uri: str) -> Path | None:
    """The local file system path ``uri`` names (a plain path, ``file://``, ``direct://``), else None."""
    return path_from_uri(uri) if capabilities(uri).has_directories else None


def join_uri(base: str, name: str) -> str:
    """``name`` under ``base``: a path join for a local directory, ``/`` for an object prefix."""
    return os.path.join(base, name) if local_path(base) is not None else f"{base.rstrip('/')}/{name}"


def import_backend(name: str) -> None:
    """Import the module and client library of backend ``name`` (blocking: ``import s3dlio``
    takes over a second, so a checkpointer does it in a thread before its first sink)."""
    if name in S3_BACKENDS:
        sink_class(name).import_library()
    elif name in AZURE_BACKENDS:
        azure_sink_class(name).import_library()  # a sink module may defer its library
    elif name == GCS_DEFAULT:
        GcsSink.import_library()


def make_sink(uri: str, *, backend: str | None, executor: Executor, options: SinkOptions) -> Sink:
    """Instantiate the sink for ``uri`` (no I/O happens here)."""
    name = resolve_backend(uri, backend)
    return BACKENDS[name](uri, executor=executor, options=options)

"""Storage: one small sink class per backend, a store per backend, and the router that turns a
URI into a watched handle. Outside this package storage is asked by capability, never by
backend name or URI scheme."""

from __future__ import annotations

from .base import Sink, SinkOptions
from .file import FileSink, path_from_uri
from .memory import MEMORY_STORE, MemorySink, NullSink
from .registry import (
    BACKENDS,
    SCHEMES,
    backend_class,
    capabilities,
    check_backend,
    check_backend_options,
    import_backend,
    join_uri,
    local_path,
    make_sink,
    register_backend,
    resolve_backend,
    scheme_of,
    serves,
)
from .router import Routing, StorageRouter

__all__ = [
    "BACKENDS",
    "MEMORY_STORE",
    "SCHEMES",
    "FileSink",
    "MemorySink",
    "NullSink",
    "Routing",
    "Sink",
    "SinkOptions",
    "StorageRouter",
    "backend_class",
    "capabilities",
    "check_backend",
    "check_backend_options",
    "import_backend",
    "join_uri",
    "local_path",
    "make_sink",
    "path_from_uri",
    "register_backend",
    "resolve_backend",
    "scheme_of",
    "serves",
]

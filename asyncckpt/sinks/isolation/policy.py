"""Which writer runs where: the isolation policy and the child start method.

Some client libraries keep process-global runtimes (s3dlio's Tokio runtime, dgen-py's Rayon
pool). A child made by ``fork`` after the parent used one inherits its locks but not its
threads and hangs on its first call; so object stores get ``forkserver`` and fork is refused
for them. Files have no such state and fork starts fastest. This module only decides; it
imports no client library and does no I/O, so a bad choice fails before anything starts.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Mapping
from dataclasses import dataclass

from ... import env, modes
from ...errors import ConfigError
from ..registry import backend_class

ISOLATIONS = modes.choices(modes.Isolation)
START_METHODS = modes.choices(modes.StartMethod)
#: read in this order when the caller gives no start method
START_METHOD_ENV = env.START_METHOD_VARS
#: backends that write local files or memory: no foreign runtime, fork is safe
LOCAL_BACKENDS = frozenset({"file", "direct", "null", "memory"})
#: a missing method degrades along this chain
_FALLBACK = ("fork", "forkserver", "spawn")

FORK_DEADLOCK = (
    "mp_start_method='fork' is refused for the object-store backend {backend!r} (from {source}): "
    "a forked child inherits the locks of the parent's client runtimes (s3dlio's Tokio runtime, "
    "dgen-py's thread pool) but not their threads, and hangs on its first call; use "
    "'forkserver' (the default for object stores) or 'spawn'"
)


@dataclass(frozen=True)
class WriterPolicy:
    """The resolved decision, recorded in the result metadata."""

    isolation: str  # "process" or "none"
    start_method: str | None  # None when isolation is "none"
    source: str  # where the start method came from: argument, an env var name, or "auto"
    reason: str

    def facts(self) -> dict[str, str | None]:
        return {
            "isolation": self.isolation,
            "mp_start_method": self.start_method,
            "mp_start_method_source": self.source,
            "isolation_reason": self.reason,
        }


def needs_isolation(backend: str) -> bool:
    """The backend class's capability: a client runtime that must stay out of the caller."""
    if backend in LOCAL_BACKENDS:
        return False
    return backend_class(backend).needs_isolation


def is_object_store(backend: str) -> bool:
    return backend not in LOCAL_BACKENDS


def requested_start_method(
    argument: str | None, environ: Mapping[str, str] | None = None
) -> tuple[modes.StartMethod, str]:
    """(method, source): the argument, else the first env var set, else "auto"."""
    if argument is not None:
        method: modes.StartMethod = modes.parse("mp_start_method", argument, modes.StartMethod)
        return method, "argument"
    return env.start_method(environ) or ("auto", "auto")


def available(method: str) -> tuple[str, str]:
    """The first method from ``method`` on along fork → forkserver → spawn this platform has."""
    have = multiprocessing.get_all_start_methods()
    for candidate in _FALLBACK[_FALLBACK.index(method) :]:
        if candidate in have:
            note = "" if candidate == method else f"; {method} is unavailable here, degraded to {candidate}"
            return candidate, note
    raise ConfigError(f"no usable multiprocessing start method (have {have})")


def resolve_policy(
    backend: str,
    *,
    isolation: str = "auto",
    mp_start_method: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> WriterPolicy:
    """Decide isolation and start method for ``backend`` (a backend *name*; nothing imported)."""
    isolation = modes.parse("isolation", isolation, modes.Isolation)
    method, source = requested_start_method(mp_start_method, environ)
    if method == "fork" and is_object_store(backend):
        raise ConfigError(FORK_DEADLOCK.format(backend=backend, source=source))
    if isolation == "auto":
        isolation = "process" if needs_isolation(backend) else "none"
        why = f"auto: {backend} {'runs' if isolation == 'process' else 'does not run'} in a writer process"
    else:
        why = f"isolation={isolation!r} requested"
    if isolation == "none":
        return WriterPolicy("none", None, source, why)
    if backend == "memory":
        raise ConfigError(
            "backend 'memory' keeps the object in the writer's memory, which a writer process "
            "would take with it; use isolation='none' for memory://"
        )
    if method == "auto":
        method = "forkserver" if is_object_store(backend) else "fork"
        why += f"; auto start method for {'an object store' if is_object_store(backend) else 'files'}"
    started, degraded = available(method)
    return WriterPolicy("process", started, source, why + degraded)

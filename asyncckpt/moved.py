"""Import paths of modules that moved when the package was layered (0.2), kept working.

``import asyncckpt.collectives`` still gives the module, now ``asyncckpt.node.collectives``,
with a ``DeprecationWarning`` naming the new path: the same module object, not a copy, so
``isinstance`` checks and module state agree whichever path a caller used. One table and
one finder instead of a shim file per old path: the layering test then sees no upward
imports, and the table is the CHANGELOG's list of deprecated paths.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType

#: old path -> new path, both below ``asyncckpt.``
MOVED: dict[str, str] = {
    "_blocking": "blocking",
    "aggregate": "bench.aggregate",
    "collectives": "node.collectives",
    "commit": "sinks.commit",
    "compare": "bench.compare",
    "distributed": "node.distributed",
    "endpoints": "sinks.s3.endpoints",
    "htmlreport": "bench.htmlreport",
    "isolation": "sinks.isolation",
    "isolation._proc": "sinks.isolation.proc",
    "isolation.child": "sinks.isolation.child",
    "isolation.policy": "sinks.isolation.policy",
    "isolation.process_sink": "sinks.isolation.process_sink",
    "isolation.shm": "sinks.shm",
    "launcher": "node.launcher",
    "leftovers": "sinks.leftovers",
    "load_api": "engine.load",
    "loader": "engine.loader",
    "manifest": "engine.manifest",
    "manifest_schema": "engine.manifest_schema",
    "metrics": "results.metrics",
    "monitor": "engine.monitor",
    "pipeline": "engine.pipeline",
    "plots": "bench.plots",
    "report": "results.text",
    "runinfo": "engine.runinfo",
    "schema": "results.schema",
    "seal": "engine.seal",
    "sinks.s3.ahead": "sinks.objstore.ahead",
    "topology": "node.topology",
    "verify": "engine.verify",
    "watchdog": "sinks.watchdog",
    "state.chunks": "engine.chunks",
    "state.dtypes": "engine.dtypes",
    "state.header": "engine.header",
    "state.safetensors_format": "engine.safetensors_format",
}


class _Alias(importlib.abc.Loader):
    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{spec.name} moved to {self.new}; the old path will be removed in a later release",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(self.new)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the new module is already imported."""


class MovedFinder(importlib.abc.MetaPathFinder):
    """Finds ``asyncckpt.<old>`` for every old path in :data:`MOVED`."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        prefix, _, rest = fullname.partition(".")
        if prefix != "asyncckpt" or rest not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(f"asyncckpt.{MOVED[rest]}"))


def install() -> None:
    """Add the finder once (``asyncckpt/__init__.py`` calls it)."""
    if not any(isinstance(f, MovedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, MovedFinder())  # before path finders: an old file left in a
        # stale install must not shadow the moved module

"""Azure Blob sinks (``az://container/key``), one class per client library, imported only when
used (the library is an optional extra).

``obstore-azure`` is the default (it takes an account key or a SAS and fails fast on a dead
endpoint); ``s3dlio-azure`` takes a SAS only. The names say the store: a backend name is global
(capabilities are asked of it without a URI) and ``obstore`` already names obstore's S3 sink.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

from ...errors import MissingDependencyError
from ..base import Sink

#: backend name → (module in this package, class, importable package, pip extra)
AZURE_BACKENDS: dict[str, tuple[str, str, str, str]] = {
    "obstore-azure": ("obstore_sink", "AzureObstoreSink", "obstore", "obstore"),
    "s3dlio-azure": ("s3dlio_sink", "AzureS3dlioSink", "s3dlio", "s3dlio"),
}
AZURE_DEFAULT = "obstore-azure"


def azure_sink_class(name: str) -> type[Sink]:
    module, cls, package, extra = AZURE_BACKENDS[name]
    if importlib.util.find_spec(package) is None:
        raise MissingDependencyError(package, extra, f"backend {name!r} (az://)")
    found: type[Sink] = getattr(importlib.import_module(f"{__name__}.{module}"), cls)
    return found


def azure_factory(name: str) -> Any:
    """A BACKENDS entry that imports the library only when a sink is made."""

    def make(uri: str, **kwargs: Any) -> Sink:
        return azure_sink_class(name)(uri, **kwargs)

    make.__name__ = f"make_{name.replace('-', '_')}_sink"
    return make

"""S3 sinks, one small class per client library, imported only when used.

Each library is an optional extra; asking for a backend whose library is missing raises
:class:`MissingDependencyError` naming the extra. ``s3://`` without an explicit backend uses
s3dlio when it is installed, else aiobotocore.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

from ...errors import MissingDependencyError
from ..base import Sink

#: backend name → (module in this package, class, importable package, pip extra)
S3_BACKENDS: dict[str, tuple[str, str, str, str]] = {
    "aiobotocore": ("botocore_sink", "AiobotocoreSink", "aiobotocore", "aiobotocore"),
    "s3dlio": ("s3dlio_sink", "S3dlioSink", "s3dlio", "s3dlio"),
    "minio": ("minio_sink", "MinioSink", "minio", "minio"),
    "obstore": ("obstore_sink", "ObstoreSink", "obstore", "obstore"),
    "s3torchconnector": ("s3torch_sink", "S3TorchSink", "s3torchconnectorclient", "s3torchconnector"),
}
AUTO_ORDER = ("s3dlio", "aiobotocore")


def installed(name: str) -> bool:
    """Whether the library behind backend ``name`` can be imported (nothing is imported)."""
    return importlib.util.find_spec(S3_BACKENDS[name][2]) is not None


def installed_backends() -> list[str]:
    return [name for name in S3_BACKENDS if installed(name)]


def auto_backend() -> str:
    """The default for ``s3://``: s3dlio when installed, else aiobotocore (may be missing)."""
    return next((name for name in AUTO_ORDER if installed(name)), AUTO_ORDER[-1])


def sink_class(name: str) -> type[Sink]:
    module, cls, package, extra = S3_BACKENDS[name]
    if not installed(name):
        raise MissingDependencyError(package, extra, f"backend {name!r} (s3://)")
    found: type[Sink] = getattr(importlib.import_module(f"{__name__}.{module}"), cls)
    return found


def factory(name: str) -> Any:
    """A BACKENDS entry that imports the library only when a sink is made."""

    def make(uri: str, **kwargs: Any) -> Sink:
        return sink_class(name)(uri, **kwargs)

    make.__name__ = f"make_{name}_sink"
    return make


def make_auto(uri: str, **kwargs: Any) -> Sink:
    return sink_class(auto_backend())(uri, **kwargs)

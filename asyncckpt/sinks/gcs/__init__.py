"""Google Cloud Storage sinks (``gs://bucket/key``).

One backend, ``gcs``: GCS's JSON API (resumable uploads, ranged reads) spoken directly with
aiohttp on the event loop (:mod:`.json_sink`; aiohttp is imported on first use). It is named
after the store, not a client library, because it is the store's own protocol with no GCS client
library in between; a library's backend would be named after it (``obstore-gcs``), as
``obstore-azure`` is (docs/azure-gcs.md says why obstore does not write here).
"""

from __future__ import annotations

from .config import OPTION_KEYS, GcsSettings, parse_gs_uri
from .json_sink import GcsSink

GCS_DEFAULT = "gcs"

__all__ = ["GCS_DEFAULT", "OPTION_KEYS", "GcsSettings", "GcsSink", "parse_gs_uri"]

"""Object stores, whatever the store: the generic sink (target, settings type, error boundary,
whole-object calls), the multipart and the append upload protocols, and obstore's sink on any of
its stores (``obstore_common``, imported only by a store that uses obstore).

A store (``sinks/s3/`` today; Azure Blob and GCS next) subclasses
:class:`~.base.ObjectStoreSink` once with its settings and hooks; each client library then
picks a protocol and supplies its primitives.
"""

from __future__ import annotations

from .append import AppendSink, InOrder
from .base import ObjectStoreSink, StoreSettings
from .errors import ErrorFields, ErrorVocabulary, classify
from .multipart import MultipartSink

__all__ = [
    "AppendSink",
    "ErrorFields",
    "ErrorVocabulary",
    "InOrder",
    "MultipartSink",
    "ObjectStoreSink",
    "StoreSettings",
    "classify",
]

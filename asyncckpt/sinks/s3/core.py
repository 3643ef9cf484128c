"""The two upload protocols over S3: the store-generic ones (:mod:`asyncckpt.sinks.objstore`)
with S3's hooks (:class:`~.common.S3SinkBase`).

*Multipart* libraries (aiobotocore, minio) expose the S3 calls and subclass
:class:`MultipartSink`; *append* libraries (s3dlio, Mountpoint) expose a stream that uploads
parts itself and subclass :class:`AppendSink`. obstore's sink is the generic
:class:`~asyncckpt.sinks.objstore.obstore_common.ObstoreSink` with the same S3 hooks.
"""

from __future__ import annotations

from ..objstore import append, multipart
from ..objstore.ahead import Placed
from .common import S3SinkBase
from .config import S3Settings

__all__ = ["AppendSink", "MultipartSink", "Placed"]


class MultipartSink(S3SinkBase, multipart.MultipartSink[S3Settings]):
    """An S3 object through a library's multipart calls."""


class AppendSink(S3SinkBase, append.AppendSink[S3Settings]):
    """An S3 object through a library's append stream."""

"""obstore on S3: the store-generic obstore sink (``objstore/obstore_common.py``: the writer fed
in offset order, obstore's exceptions, its async whole-object calls) with S3's hooks and an
``S3Store`` built from :class:`~.config.S3Settings`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...errors import MissingDependencyError
from ..objstore import obstore_common
from .common import S3SinkBase
from .config import S3Settings

try:
    from obstore.store import S3Store
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise MissingDependencyError("obstore", "obstore", "backend 'obstore' (s3://)") from exc

if TYPE_CHECKING:
    from obstore.store import S3Config


class ObstoreSink(S3SinkBase, obstore_common.ObstoreSink[S3Settings]):
    """``s3://bucket/key`` through obstore's ``S3Store``."""

    def build_store(self) -> S3Store:
        return S3Store(
            self.bucket,
            config=self.s3_config(),
            client_options=self.client_options(),
            retry_config=self.retry_config(),
        )

    def s3_config(self) -> S3Config:
        """What asyncckpt resolved, explicit: it wins over obstore's own reading of ``AWS_*``
        variables, which only fills what is unset (no keys given: its credential chain)."""
        s = self.settings
        config: S3Config = {
            "region": s.region,
            "virtual_hosted_style_request": not s.path_style,
            "unsigned_payload": not s.payload_signing,
        }
        if s.endpoint_url:
            config["endpoint"] = s.endpoint_url
        if s.access_key_id is not None:
            config["access_key_id"] = s.access_key_id
        secret, token = s.revealed("secret_access_key"), s.revealed("session_token")
        if secret is not None:
            config["secret_access_key"] = secret
        if token is not None:
            config["session_token"] = token
        if s.checksums == "when_supported":
            config["checksum_algorithm"] = "sha256"  # the only algorithm object_store sends
        return config

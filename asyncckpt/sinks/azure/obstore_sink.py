"""obstore on Azure Blob: the store-generic obstore sink (the writer fed in offset order, its
exceptions, its async whole-object calls) with Azure's hooks and an ``AzureStore`` built from
:class:`~.config.AzureSettings`. The writer puts one block per buffer and commits the block
list at close; an aborted writer commits nothing.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from ...errors import MissingDependencyError
from ..objstore import obstore_common
from .common import AzureSinkBase
from .config import AzureSettings

try:
    from obstore.store import AzureStore
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise MissingDependencyError("obstore", "obstore", "backend 'obstore-azure' (az://)") from exc

if TYPE_CHECKING:
    from obstore.store import AzureConfig


class AzureObstoreSink(AzureSinkBase, obstore_common.ObstoreSink[AzureSettings]):
    """``az://container/key`` through obstore's ``AzureStore``."""

    backend = "obstore-azure"

    def build_store(self) -> AzureStore:
        return AzureStore(
            self.bucket,
            config=self.azure_config(),
            client_options=self.client_options(),
            retry_config=self.retry_config(),
        )

    async def _delete(self) -> None:
        # Azure answers 404 for a missing blob where S3 succeeds; absent is not an error here
        with contextlib.suppress(FileNotFoundError):
            await super()._delete()

    def azure_config(self) -> AzureConfig:
        """What asyncckpt resolved, explicit; never ``use_emulator`` (it ignores ``endpoint``)."""
        s = self.settings
        config: AzureConfig = {}
        if s.account is not None:
            config["account_name"] = s.account
        if s.endpoint_url is not None:
            config["endpoint"] = s.endpoint_url
        if s.account_key is not None:
            config["account_key"] = s.account_key.reveal()
        if s.sas_token is not None:
            config["sas_key"] = s.sas_token.reveal().lstrip("?")
        return config

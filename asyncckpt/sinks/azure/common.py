"""Azure Blob's hooks of the store-generic object sink: ``az://container/key``,
:class:`~.config.AzureSettings`, blocks of at most 4000 MiB and 50 000 per blob, and Azure's
error codes.

A blob is written as blocks (Put Block) made visible by one Put Block List: nothing is
visible before commit. Blocks never committed are not listed anywhere a client can clean up;
Azure discards them by itself (after about a week), so there is no leftover to list.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..objstore.base import ObjectStoreSink
from ..objstore.errors import ErrorVocabulary
from .config import AzureSettings, parse_az_uri, plan_blocks

AZURE_ERRORS = ErrorVocabulary(
    not_found=("ContainerNotFound", "BlobNotFound", "ResourceNotFound", "NotFound"),
    denied=(
        "AuthenticationFailed",
        "AuthorizationFailure",
        "AuthorizationPermissionMismatch",
        "InsufficientAccountPermissions",
        "PermissionDenied",
    ),
    unavailable=("ServerBusy", "Service Unavailable", "OperationTimedOut"),
    unavailable_hint=" (the server answered 503 Server Busy after retries: lower the request rate)",
    denied_hint=(
        " (check AZURE_STORAGE_ACCOUNT and AZURE_STORAGE_KEY / AZURE_STORAGE_SAS_TOKEN / "
        "AZURE_STORAGE_CONNECTION_STRING)"
    ),
)


class AzureSinkBase(ObjectStoreSink[AzureSettings]):
    """One blob ``az://container/key`` (account and endpoint from the settings)."""

    scheme = "az"
    container_word = "container"
    store_name = "Azure Blob"
    error_vocabulary = AZURE_ERRORS
    leftover_hint = "Azure discards uncommitted blocks by itself (after about 7 days); nothing is visible"

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> None:
        AzureSettings.resolve(options, env={"AZURE_STORAGE_ACCOUNT": "check"})

    @classmethod
    def parse_target(cls, uri: str) -> tuple[str, str]:
        return parse_az_uri(uri)

    @classmethod
    def resolve_settings(cls, options: Mapping[str, Any]) -> AzureSettings:
        return AzureSettings.resolve(options)

    def plan_layout(self, size: int) -> int:
        return plan_blocks(size, self.part_size, self.options.chunk_size)

    def location(self) -> str:
        s = self.settings
        return f"endpoint {s.endpoint_url or f'https://{s.account}.blob.core.windows.net'}"

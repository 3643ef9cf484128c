"""The versioned format of result files: version constant, the shipped JSON Schema, checks.

``schema_version`` is ``MAJOR.MINOR``: adding a field bumps MINOR (old readers still
understand the file), removing or changing one bumps MAJOR. Readers accept their own MAJOR
and refuse a newer one with a clear error rather than misreading it.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

from .errors import ConfigError

SCHEMA_VERSION = "1.0"
SCHEMA_RESOURCE = "schemas/result.schema.json"


@cache
def load_schema() -> dict[str, Any]:
    """The JSON Schema shipped in the package (package data, no network)."""
    text = resources.files("asyncckpt").joinpath(SCHEMA_RESOURCE).read_text(encoding="utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


def check_version(doc: dict[str, Any], source: str = "result") -> str:
    """The document's schema version; ConfigError for a missing or newer-major one."""
    version = doc.get("schema_version")
    if not isinstance(version, str):
        raise ConfigError(
            f"{source}: no schema_version; not an asyncckpt result file (or one written before "
            f"versioning: re-run it with this release)"
        )
    major = version.split(".", 1)[0]
    if major != SCHEMA_VERSION.split(".", 1)[0]:
        raise ConfigError(
            f"{source}: schema_version {version} is not readable by this release "
            f"(reads {SCHEMA_VERSION.split('.')[0]}.x)"
        )
    return version

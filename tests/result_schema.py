"""Validate result documents against the JSON Schema shipped in the package."""

from __future__ import annotations

from typing import Any

import jsonschema

from asyncckpt.results.schema import SCHEMA_VERSION, load_schema


def assert_valid(doc: dict[str, Any]) -> None:
    """Every violation listed, not just the first (``oneOf`` hides the useful message)."""
    assert doc.get("schema_version") == SCHEMA_VERSION
    jsonschema.Draft202012Validator.check_schema(load_schema())
    sub = "singleRun" if doc.get("mode") == "single" else "mpiRun"
    schema = {**load_schema(), "oneOf": [{"$ref": f"#/$defs/{sub}"}]}
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(doc), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors[:20])
    jsonschema.validate(doc, load_schema())  # and the real schema, oneOf included

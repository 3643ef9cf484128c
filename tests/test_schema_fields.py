"""The shipped result schema agrees with the result dataclasses, field by field, so a new field
is one dataclass line, one schema entry and its docs (CONTRIBUTING.md), and a forgotten one
fails here by name rather than in a run's output."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from asyncckpt.results.metrics import ChunkRecord, ReadRecord
from asyncckpt.results.records import LoadResult, RunMetadata, SaveResult
from asyncckpt.results.schema import load_schema


def _props(name: str) -> set[str]:
    defs = load_schema()["$defs"]
    d: dict[str, Any] = defs[name]
    props = set(d.get("properties", {}))
    for part in d.get("allOf", []):
        ref = part.get("$ref", "")
        if ref.startswith("#/$defs/"):
            props |= _props(ref.removeprefix("#/$defs/"))
    return props


def _fields(cls: type) -> set[str]:
    if dataclasses.is_dataclass(cls):
        return {f.name for f in dataclasses.fields(cls)}
    return set(cls._fields)  # type: ignore[attr-defined]  # a NamedTuple's own field list


@pytest.mark.parametrize(
    ("cls", "schema", "serialised_apart"),
    [
        (SaveResult, "saveResult", {"metadata", "records"}),
        (LoadResult, "loadResult", {"metadata", "records"}),
        (RunMetadata, "metadata", set()),
        (ChunkRecord, "saveRecord", set()),
        (ReadRecord, "readRecord", set()),
    ],
)
def test_every_dataclass_field_is_in_the_schema_and_back(
    cls: type, schema: str, serialised_apart: set[str]
) -> None:
    fields, props = _fields(cls), _props(schema)
    missing = sorted(fields - props - serialised_apart)
    assert not missing, f"{cls.__name__} fields missing from $defs/{schema}: {missing}"
    # rates to_dict adds: the properties, and one difference of two fields
    derived = {n for n in dir(cls) if isinstance(getattr(cls, n, None), property)}
    derived.add("pool_peak_over_baseline_bytes")
    extra = sorted(props - fields - derived - {"schema_version", "operation", *serialised_apart})
    assert not extra, f"$defs/{schema} properties with no {cls.__name__} field: {extra}"

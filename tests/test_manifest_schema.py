"""The manifest is untrusted input: a strict schema, checked before anything is allocated for it.

Regressions first (each was a TypeError or a terabyte mapping before the schema), then
property-based tests: random and mutated manifests beside a real checkpoint file, and random
``CheckpointConfig`` options. Only :class:`AsyncCkptError` subclasses may come out, a corrupt
object is never passed as good, and memory stays bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import shutil
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asyncckpt import AsyncCheckpointer, AsyncCkptError, ConfigError
from asyncckpt.config import CheckpointConfig
from asyncckpt.engine.manifest import Manifest
from asyncckpt.errors import ChecksumMismatchError, IntegrityError, ManifestError
from asyncckpt.units import GiB, MiB

from .conftest import to_legacy

CHUNK = 64 * 1024
SIZE = 3 * CHUNK + 100
VERIFY = (True, "regenerate", False)
#: the property tests are reproducible (CI must not flake) and take seconds, not minutes
PROPS = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=150,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes, dict[str, Any]]:
    """A real saved checkpoint in the sidecar layout (where a manifest can be swapped without
    touching the data): (path, its bytes, its manifest as parsed JSON)."""
    path = tmp_path_factory.mktemp("ckpt") / "ck.bin"

    async def save() -> None:
        async with AsyncCheckpointer(chunk_size=CHUNK, num_buffers=2, seed=7) as ckpt:
            await ckpt.save(path, SIZE)

    asyncio.run(save())
    to_legacy(path)
    return path, path.read_bytes(), json.loads(Path(f"{path}.manifest.json").read_text())


def load(path: Path, verify: object) -> None:
    async def run() -> None:
        async with AsyncCheckpointer(chunk_size=CHUNK, num_buffers=2) as ckpt:
            await ckpt.load(path, verify=verify)

    asyncio.run(run())


def with_manifest(path: Path, manifest: dict[str, Any] | bytes) -> None:
    raw = manifest if isinstance(manifest, bytes) else json.dumps(manifest).encode()
    Path(f"{path}.manifest.json").write_bytes(raw)


# -- regressions --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("chunk_size", "32MiB", "chunk_size must be an integer, got '32MiB'"),
        ("chunk_size", 2**40, "chunk_size must be in"),
        ("chunk_size", 4096 + 1, "multiple of 4096"),
        ("seed", "abc", "seed must be an integer, got 'abc'"),
        ("seed", -1, "seed must be in"),
        ("size", True, "size must be an integer"),
        ("generator", ["dgen"], "generator must be one of"),
        ("backend", [], "backend must be an object"),
        ("surprise", 1, "unknown field"),
    ],
)
def test_bad_field_is_a_manifest_error_naming_it(
    checkpoint: tuple[Path, bytes, dict[str, Any]], field: str, value: object, match: str
) -> None:
    _, _, good = checkpoint
    bad = {**good, field: value}
    with pytest.raises(ManifestError, match=match):
        Manifest.from_json(json.dumps(bad).encode(), "m.json")


@pytest.mark.parametrize("verify", [True, "regenerate"])
def test_bad_seed_and_flipped_byte_is_an_integrity_error(
    checkpoint: tuple[Path, bytes, dict[str, Any]], tmp_path: Path, verify: object
) -> None:
    src, data, good = checkpoint
    path = tmp_path / src.name
    flipped = bytearray(data)
    flipped[CHUNK + 5] ^= 0x01
    path.write_bytes(bytes(flipped))
    with_manifest(path, good)
    with pytest.raises(ChecksumMismatchError, match=f"offset {CHUNK + 5}"):
        load(path, verify)
    with_manifest(path, {**good, "seed": "abc"})
    with pytest.raises(IntegrityError, match="seed must be an integer"):  # not a TypeError
        load(path, verify)


def test_terabyte_chunk_size_is_refused_before_any_allocation(
    checkpoint: tuple[Path, bytes, dict[str, Any]], tmp_path: Path
) -> None:
    src, data, good = checkpoint
    path = tmp_path / src.name
    path.write_bytes(data)
    crc = good["checksum"]["object"]
    # consistent otherwise: one chunk of 2^40 bytes covers the object
    with_manifest(path, {**good, "chunk_size": 2**40, "checksum": {**good["checksum"], "chunks": [crc]}})
    before = peak_rss_bytes()
    with pytest.raises(ManifestError, match="chunk_size must be in"):
        load(path, "regenerate")
    assert peak_rss_bytes() - before < 64 * MiB


def test_every_manifest_field_has_a_rule(checkpoint: tuple[Path, bytes, dict[str, Any]]) -> None:
    """A field added to Manifest without a schema rule fails here (and in from_json)."""
    src, _, _ = checkpoint
    raw = Path(f"{src}.manifest.json").read_bytes()
    manifest = Manifest.from_json(raw, "m.json")
    assert Manifest.from_json(manifest.to_json(), "m.json") == manifest
    assert {f.name for f in fields(Manifest)} <= {*manifest.__dict__}


def test_config_chunk_size_is_bounded_like_the_manifest() -> None:
    with pytest.raises(ConfigError, match="chunk_size must be <="):
        CheckpointConfig(chunk_size=2 * GiB)
    with pytest.raises(ConfigError, match="unknown option"):
        AsyncCheckpointer(chunksize=4096)


# -- properties ---------------------------------------------------------------------------
SPECIAL_INTS = st.sampled_from([0, 1, -1, 4095, 4096, CHUNK, SIZE, 2**31, 2**40, 2**63, 2**64, 10**30])
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    SPECIAL_INTS,
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["dgen", "numpy", "caller", "crc32c", "0000abcd", "32MiB", "asyncckpt-manifest"]),
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)
#: fields whose values a mutation replaces (format and version are rarer: they end the parse early)
VALUE_KEYS = st.sampled_from(
    ["size", "chunk_size", "generator", "seed", "object", "backend", "created", "writer"]
)
#: mutation kinds, repeated to weight them: mostly a wrong value in a field the load uses
KINDS = st.sampled_from(
    ["set"] * 6 + ["plausible"] * 4 + ["checksum", "chunk"] * 2 + ["delete", "add", "flip", "meta"]
)
#: values of the right type that still lie: a load must fail on the bytes, or pass honestly
PLAUSIBLE = {
    "seed": st.one_of(st.none(), st.integers(0, 2**64 - 1)),
    "generator": st.sampled_from(["dgen", "numpy", "caller"]),
    "chunk_size": st.sampled_from([4096, CHUNK // 2, CHUNK, 2 * CHUNK, 2**30]),
    "size": st.sampled_from([1, SIZE - 1, SIZE, SIZE + 1, 2**62]),
    "object": st.text(max_size=10),
    "backend": st.dictionaries(st.sampled_from(["identity", "etag"]), JSON, max_size=2),
}


@st.composite
def mutated(draw: st.DrawFn, good: dict[str, Any]) -> dict[str, Any] | bytes:
    doc = json.loads(json.dumps(good))
    for _ in range(draw(st.integers(1, 2))):
        kind = draw(KINDS)
        if kind == "set":
            doc[draw(VALUE_KEYS)] = draw(JSON)
        elif kind == "plausible":
            key = draw(st.sampled_from(sorted(PLAUSIBLE)))
            doc[key] = draw(PLAUSIBLE[key])
        elif kind == "meta":
            doc[draw(st.sampled_from(["format", "version"]))] = draw(JSON)
        elif kind == "delete":
            doc.pop(draw(st.sampled_from(sorted(doc))), None)
        elif kind == "add":
            doc[draw(st.text(max_size=8))] = draw(JSON)
        elif kind == "checksum" and isinstance(doc.get("checksum"), dict):
            doc["checksum"][draw(st.sampled_from(["algorithm", "chunks", "object", "x"]))] = draw(JSON)
        elif kind == "chunk" and isinstance(doc.get("checksum"), dict):
            chunks = doc["checksum"].get("chunks")
            if isinstance(chunks, list) and chunks:
                chunks[draw(st.integers(0, len(chunks) - 1))] = draw(JSON)
        elif kind == "flip":  # one flipped bit anywhere in the document
            raw = bytearray(json.dumps(doc).encode())
            raw[draw(st.integers(0, len(raw) - 1))] ^= 1 << draw(st.integers(0, 7))
            return bytes(raw)
    return doc


@PROPS
@given(raw=st.one_of(st.binary(max_size=300), JSON.map(lambda v: json.dumps(v).encode())))
def test_random_bytes_never_escape_as_foreign_errors(raw: bytes) -> None:
    with contextlib.suppress(ManifestError):  # anything else fails the test
        Manifest.from_json(raw, "m.json")


@PROPS
@given(data=st.data(), verify=st.sampled_from(VERIFY), corrupt=st.booleans())
def test_mutated_manifests_load_only_with_asyncckpt_errors(
    checkpoint: tuple[Path, bytes, dict[str, Any]],
    tmp_path_factory: pytest.TempPathFactory,
    data: st.DataObject,
    verify: object,
    corrupt: bool,
) -> None:
    src, pristine, good = checkpoint
    path = tmp_path_factory.mktemp("m") / src.name
    content = bytearray(pristine)
    if corrupt:
        content[data.draw(st.integers(0, SIZE - 1))] ^= 0x80
    path.write_bytes(bytes(content))
    with_manifest(path, data.draw(mutated(good)))
    before = peak_rss_bytes()
    try:
        load(path, verify)
    except AsyncCkptError:
        pass
    else:
        assert not (corrupt and verify), "a corrupt object passed a verifying load"
    finally:
        shutil.rmtree(path.parent)
    assert peak_rss_bytes() - before < 64 * MiB


CONFIG_KEYS = st.sampled_from([f.name for f in fields(CheckpointConfig)] + ["chunksize", "threads", ""])


@PROPS
@given(
    options=st.dictionaries(CONFIG_KEYS, st.one_of(JSON, SPECIAL_INTS.map(lambda i: i * 4096)), max_size=5)
)
def test_random_config_options_raise_only_config_errors(options: dict[str, Any]) -> None:
    try:
        ckpt = AsyncCheckpointer(**options)
    except ConfigError:
        return
    cfg = ckpt.config
    assert 4096 <= cfg.chunk_size <= GiB and cfg.chunk_size % 4096 == 0
    assert isinstance(cfg.fsync, bool) and isinstance(cfg.reserve_space, bool)

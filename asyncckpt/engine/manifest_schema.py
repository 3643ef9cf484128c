"""The manifest's schema, checked field by field before anything trusts (or allocates for) it.

A manifest is read from storage, so it is untrusted input: a wrong type must not surface as a
``TypeError`` deep in a verifier (hiding the corruption it was about to report), and a huge
``chunk_size`` must not make a load map a terabyte. Version 1 always lists checksums; version
2 adds ``integrity``, and a manifest whose integrity is ``"none"`` lists none (and must not).
Every rule here turns a defect into a :class:`ValueError` naming the field and the bad
value; ``Manifest.from_json`` makes that a ``ManifestError``. Consistency with the object's
real size is checked by the loader (``check_size``) before any data buffer is made.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Any

from .. import modes
from ..checksum import ALGORITHM
from ..config import ALIGN, MAX_CHUNK_SIZE, MAX_SEED

GENERATORS = ("dgen", "numpy", "caller")
SYNTHETIC = ("dgen", "numpy")
MAX_OBJECT_SIZE = 2**62  # beyond any store; keeps every offset a signed 64-bit integer
MAX_TEXT = 4096  # object names, timestamps, writer names
_HEX8 = re.compile(r"[0-9a-f]{8}")
#: fields a manifest must have (the others have defaults in Manifest)
REQUIRED = ("version", "object", "size", "chunk_size", "generator", "seed")


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _int(name: str, value: object, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {_shown(value)}")
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be in {lo}..{hi}, got {value}")
    return value


def _text(name: str, value: object) -> str:
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise ValueError(f"{name} must be a string of at most {MAX_TEXT} characters, got {_shown(value)}")
    return value


def _crc(name: str, value: object) -> int:
    if not isinstance(value, str) or not _HEX8.fullmatch(value):
        raise ValueError(f"{name} must be 8 lower-case hex digits, got {_shown(value)}")
    return int(value, 16)


def _checksum(value: object, chunks: int) -> tuple[tuple[int, ...], int]:
    if not isinstance(value, dict) or set(value) != {"algorithm", "chunks", "object"}:
        raise ValueError(f"checksum must be an object with algorithm, chunks and object, got {_shown(value)}")
    if value["algorithm"] != ALGORITHM:
        raise ValueError(f"checksum algorithm {_shown(value['algorithm'])} is not {ALGORITHM}")
    listed = value["chunks"]
    if not isinstance(listed, list):
        raise ValueError(f"checksum.chunks must be a list, got {_shown(listed)}")
    if len(listed) != chunks:
        raise ValueError(f"{len(listed)} chunk checksums listed; size and chunk_size make {chunks} chunks")
    crcs = tuple(_crc(f"checksum.chunks[{i}]", c) for i, c in enumerate(listed))
    return crcs, _crc("checksum.object", value["object"])


def _version(value: object, newest: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= newest:
        raise ValueError(f"format version {_shown(value)}, this reader knows 1..{newest}")
    return value


def _integrity(data: dict[Any, Any], version: int) -> str:
    """The save's integrity mode: version 1 always had checksums; version 2 names it."""
    if version < 2:
        return "crc32c"
    value = data.get("integrity")
    allowed = modes.choices(modes.Integrity)
    if value not in allowed:
        raise ValueError(f"integrity must be one of {', '.join(allowed)}, got {_shown(value)}")
    return str(value)


def manifest_fields(
    data: object, fields: Collection[str], *, format_name: str, newest: int
) -> dict[str, Any]:
    """``Manifest`` keyword arguments from a parsed JSON document, or ValueError naming the defect.

    ``fields`` are the dataclass's field names: a field added there without a rule here is an
    error (tests/test_manifest_schema.py checks each has one), so nothing passes unchecked.
    """
    if not isinstance(data, dict):
        raise ValueError(f"not a JSON object but {type(data).__name__}")
    if data.get("format") != format_name:
        raise ValueError(f"not an {format_name} document (format {_shown(data.get('format'))})")
    version = _version(data.get("version"), newest)
    allowed = {*fields, "format", "checksum"} - {"chunk_crc32c", "object_crc32c"}
    if version < 2:
        allowed.discard("integrity")
    unknown = sorted(str(k) for k in data if k not in allowed)
    if unknown:
        raise ValueError(f"unknown field(s) {', '.join(unknown)[:200]}")
    integrity = _integrity(data, version)
    sums = ("checksum",) if integrity == "crc32c" else ()
    missing = [k for k in (*REQUIRED, *sums) if k not in data]
    if missing:
        raise ValueError(f"missing field(s) {', '.join(missing)}")
    if not sums and "checksum" in data:
        raise ValueError("integrity 'none' says no checksums were computed, yet checksums are listed")
    out: dict[str, Any] = {"version": version, "integrity": integrity}
    out["object"] = _text("object", data["object"])
    size = out["size"] = _int("size", data["size"], 1, MAX_OBJECT_SIZE)
    chunk = out["chunk_size"] = _int("chunk_size", data["chunk_size"], ALIGN, MAX_CHUNK_SIZE)
    if chunk % ALIGN:
        raise ValueError(f"chunk_size must be a multiple of {ALIGN}, got {chunk}")
    generator = data["generator"]
    if generator not in GENERATORS or not isinstance(generator, str):
        raise ValueError(f"generator must be one of {', '.join(GENERATORS)}, got {_shown(generator)}")
    out["generator"] = generator
    seed = data["seed"]
    if seed is not None or generator in SYNTHETIC:
        seed = _int("seed", seed, 0, MAX_SEED)
    out["seed"] = seed
    if sums:
        out["chunk_crc32c"], out["object_crc32c"] = _checksum(data["checksum"], -(-size // chunk))
    else:
        out["chunk_crc32c"], out["object_crc32c"] = (), None
    backend = data.get("backend", {})
    if not isinstance(backend, dict):
        raise ValueError(f"backend must be an object, got {_shown(backend)}")
    out["backend"] = backend
    for name in ("created", "writer"):
        if name in data:
            out[name] = _text(name, data[name])
    unchecked = set(fields) - set(out) - {"created", "writer"}
    if unchecked:  # a new Manifest field with no rule above
        raise ValueError(f"this reader has no rule for field(s) {', '.join(sorted(unchecked))}")
    return out

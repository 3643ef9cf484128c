"""The safetensors container: build and strictly parse its header.

Layout (the safetensors spec, as its reference reader checks it): 8 bytes little-endian
header length ``N``; ``N`` bytes of UTF-8 JSON ``{"__metadata__": {str: str}, name:
{"dtype", "shape", "data_offsets": [begin, end]}}``; then the data buffer. Sorted by
offset, the tensors must tile the buffer exactly: the first begins at 0, each begins where
the previous ended, the last ends at the end of the file (no holes, nothing after).

So tensors cannot be padded apart; only the data *start* is aligned: the JSON is padded
with spaces (which JSON allows) until ``8 + N`` is a multiple of ``align`` (4096, so every
chunk write of the pipeline stays O_DIRECT-aligned; a large state asks for its checksum
block, ``asyncckpt.state.api.header_align``). The order of the tensors is the caller's.

The header carries its own CRC32C (``asyncckpt.header_crc32c``), computed with that value
written as ``00000000``: the per-chunk CRCs cannot cover the header that contains them,
and a flipped digit in a shape or a saved scalar would otherwise load silently.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..checksum import crc
from ..errors import ConfigError, StateFormatError
from . import dtypes
from .dtypes import DType

MAX_HEADER = 100_000_000  # the safetensors reader's own limit
ALIGN = 4096
METADATA = "__metadata__"
K_FORMAT = "asyncckpt.format"
FORMAT_VALUE = "state/1"
K_TREE = "asyncckpt.tree"
K_CHUNK = "asyncckpt.chunk_size"
K_CRCS = "asyncckpt.crc32c"
K_HEADER_CRC = "asyncckpt.header_crc32c"
_PLACEHOLDER = "00000000"
_CRC_FIELD = f'"{K_HEADER_CRC}":"'.encode()


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of the header; ``start``/``end`` are offsets in the data buffer."""

    name: str
    dtype: DType
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Header:
    tensors: tuple[TensorEntry, ...]  # in offset order
    metadata: dict[str, str]
    data_start: int  # 8 + N: where the data buffer begins in the object
    size: int  # the whole object

    @property
    def data_size(self) -> int:
        return self.size - self.data_start


def tensors_json(tensors: Sequence[TensorEntry]) -> str:
    """The header's tensor members as JSON text, ``"name":{...}`` joined by commas, exactly as
    ``json.dumps`` writes them. A save builds its header two or three times (the CRC count
    converges, then the CRCs are filled in) over the same tensors, so this is made once: a
    dict per tensor encoded each time took 0.3 s per header of 80 000 tensors."""
    quote = json.encoder.encode_basestring_ascii
    return ",".join(
        f'{quote(t.name)}:{{"dtype":{quote(t.dtype.code)},"shape":[{",".join(map(str, t.shape))}],'
        f'"data_offsets":[{t.start},{t.end}]}}'
        for t in tensors
    )


def build_header(
    tensors: Sequence[TensorEntry] | str, metadata: Mapping[str, str], *, align: int = ALIGN
) -> bytearray:
    """The object's prefix (length + JSON + space padding), ``align``-sized, header CRC set;
    ``tensors`` as entries or as their :func:`tensors_json`."""
    meta = {str(k): str(v) for k, v in metadata.items()}
    meta[K_HEADER_CRC] = _PLACEHOLDER
    members = tensors if isinstance(tensors, str) else tensors_json(tensors)
    head = json.dumps({METADATA: meta}, separators=(",", ":"), ensure_ascii=True)
    raw = (head[:-1] + ("," + members if members else "") + "}").encode()
    total = -(-(8 + len(raw)) // align) * align
    n = total - 8
    if n > MAX_HEADER:
        raise ConfigError(f"the state's header would be {n} bytes; safetensors readers refuse > {MAX_HEADER}")
    prefix = bytearray(struct.pack("<Q", n) + raw + b" " * (n - len(raw)))
    at = _crc_field(prefix)
    prefix[at : at + 8] = f"{crc(memoryview(prefix)):08x}".encode()
    return prefix


def _crc_field(prefix: bytes | bytearray) -> int:
    """Offset of the header CRC's 8 hex digits; the key/value pattern occurs once in valid JSON
    (inside a JSON string every quote is escaped, so a tree or a name cannot imitate it)."""
    first = prefix.find(_CRC_FIELD)
    if first < 0 or prefix.find(_CRC_FIELD, first + 1) >= 0:
        return -1
    return first + len(_CRC_FIELD)


def header_crc_ok(prefix: bytes) -> bool | None:
    """True/False if the header has an asyncckpt CRC and it matches; None if it has none."""
    at = _crc_field(prefix)
    if at < 0:
        return None
    expected = prefix[at : at + 8].decode("ascii", "replace")
    zeroed = bytearray(prefix)
    zeroed[at : at + 8] = _PLACEHOLDER.encode()
    return f"{crc(memoryview(zeroed)):08x}" == expected


def header_length(first8: bytes, size: int, uri: str) -> int:
    """``N`` from the first 8 bytes, bounded before anything else is read."""
    if size < 8 or len(first8) < 8:
        raise StateFormatError(
            f"{uri!r} is not a safetensors file: {size} bytes, shorter than its 8-byte length"
        )
    (n,) = struct.unpack("<Q", first8[:8])
    if n < 2 or n > MAX_HEADER or 8 + n > size:
        raise StateFormatError(
            f"{uri!r} is not a safetensors file: header length {n} is impossible "
            f"(object of {size} bytes; limit {MAX_HEADER})"
        )
    return int(n)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def parse_header(raw: bytes, size: int, uri: str) -> Header:
    """Validate the JSON header against the object size; StateFormatError naming the defect."""
    where = f"{uri!r} is not a valid safetensors file"
    try:
        text = raw.decode("utf-8")
        if not text.startswith("{"):
            raise ValueError("the header does not start with '{'")
        doc = json.loads(text, object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, ValueError) as exc:
        raise StateFormatError(f"{where}: unreadable header ({exc})") from None
    if not isinstance(doc, dict):
        raise StateFormatError(f"{where}: the header is not a JSON object")
    meta = doc.pop(METADATA, {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise StateFormatError(f"{where}: __metadata__ must map strings to strings")
    entries = []
    for name, info in doc.items():
        if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= info.keys():
            raise StateFormatError(f"{where}: tensor {name!r} lacks dtype, shape or data_offsets")
        try:
            dt = dtypes.lookup(info["dtype"], f"tensor {name!r}")
        except ConfigError as exc:
            raise StateFormatError(f"{where}: {exc}") from None
        shape, offsets = info["shape"], info["data_offsets"]
        if not isinstance(shape, list) or not all(_int(d) for d in shape):
            raise StateFormatError(f"{where}: tensor {name!r} has shape {shape!r}")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(_int(o) for o in offsets)):
            raise StateFormatError(f"{where}: tensor {name!r} has data_offsets {offsets!r}")
        count = 1
        for d in shape:
            count *= d
        if offsets[1] - offsets[0] != count * dt.itemsize:
            raise StateFormatError(
                f"{where}: tensor {name!r} is {dt.code}{shape} = {count * dt.itemsize} bytes, "
                f"but its data_offsets {offsets} span {offsets[1] - offsets[0]}"
            )
        entries.append(TensorEntry(name, dt, tuple(shape), offsets[0], offsets[1]))
    entries.sort(key=lambda t: (t.start, t.end))
    data_start = 8 + len(raw)
    position = 0
    for t in entries:
        if t.start != position:
            raise StateFormatError(
                f"{where}: tensor {t.name!r} begins at data offset {t.start}, not {position} "
                "(tensors must tile the data buffer without holes or overlaps)"
            )
        position = t.end
    if position != size - data_start:
        raise StateFormatError(
            f"{where}: the tensors cover {position} data bytes but the object holds "
            f"{size - data_start} after its header"
        )
    return Header(tuple(entries), dict(meta), data_start, size)

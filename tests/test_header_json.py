"""The header's tensor members, encoded once per save (``tensors_json``), are byte for byte
what ``json.dumps`` of the safetensors header dict gives, for awkward names too."""

from __future__ import annotations

import json

from asyncckpt.engine import dtypes
from asyncckpt.engine.safetensors_format import ALIGN, TensorEntry, build_header, parse_header, tensors_json

NAMES = ["w", 'quote"d', "back\\slash", "tab\there", "nl\n", "ünï/ç😀", "\x00\x1f", "a.b#2", ""]


def entries() -> list[TensorEntry]:
    out, at = [], 0
    shapes = [(3, 4), (), (0,), (1, 2, 3), (7,), (2, 2), (5,), (1,), (4, 4)]
    for name, shape, code in zip(
        NAMES, shapes, ["F32", "I64", "BF16", "U8", "F16", "BOOL", "F64", "I8", "F32"], strict=True
    ):
        dt = dtypes.lookup(code, "test")
        n = dt.itemsize
        for d in shape:
            n *= d
        out.append(TensorEntry(name, dt, shape, at, at + n))
        at += n
    return out


def test_members_match_json_dumps() -> None:
    es = entries()
    doc = {
        e.name: {"dtype": e.dtype.code, "shape": list(e.shape), "data_offsets": [e.start, e.end]} for e in es
    }
    assert "{" + tensors_json(es) + "}" == json.dumps(doc, separators=(",", ":"), ensure_ascii=True)


def test_a_header_from_members_parses_back_and_equals_one_from_entries() -> None:
    es = entries()
    meta = {"k": "v\u00e9"}
    prefix = build_header(tensors_json(es), meta)
    assert prefix == build_header(es, meta) and len(prefix) % ALIGN == 0
    size = len(prefix) + es[-1].end
    header = parse_header(bytes(prefix[8:]), size, "x")
    assert [(t.name, t.shape, t.start, t.end) for t in header.tensors] == [
        (e.name, e.shape, e.start, e.end) for e in es
    ]
    assert build_header([], meta)[8:].rstrip().startswith(b'{"__metadata__":{')

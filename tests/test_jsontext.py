"""``engine.jsontext``: the same text as ``json.dumps`` and the same values as ``json.loads``
for documents large enough to be made in parts (a step index, a state's tree) and small ones."""

from __future__ import annotations

import json
from typing import Any

import pytest

from asyncckpt.engine import jsontext


def index(n: int) -> dict[str, Any]:
    tensors = {
        f"layers.{i}.w\u00e9": {
            "dtype": "F32",
            "global_shape": [2, 3],
            "boxes": [
                {"object": i % 3, "offsets": [0, 0], "shape": [2, 3], "start": 8 * i, "end": 8 * i + 24}
            ],
        }
        for i in range(n)
    }
    return {
        "format": "asyncckpt.step-index",
        "version": 1,
        "tensors": tensors,
        "local": [[{"n": i}] for i in range(n)],
    }


def tree(n: int) -> dict[str, Any]:
    leaves = [[f"w{i}", {"tensor": f"model.w{i}"}] for i in range(n)]
    return {
        "dict": [
            ["model", {"dict": leaves}],
            ["step", {"value": 7}],
            ["t", {"tuple": [None, True, 1.5, 'q"\n']}],
        ]
    }


DOCS = [
    index(3),
    index(2000),
    tree(5),
    tree(5000),
    [],
    {},
    [[[]]],
    {"a": {"b": {}}},
    "s",
    1,
    None,
    [1, [2, [3]]] * 600,
]


@pytest.mark.parametrize("doc", DOCS, ids=range(len(DOCS)))
@pytest.mark.parametrize("options", [{}, {"sort_keys": True}, {"separators": (",", ":")}])
def test_the_same_text_as_json_dumps(doc: Any, options: dict[str, Any]) -> None:
    assert jsontext.dumps(doc, **options) == json.dumps(doc, **options)


def test_keys_other_than_strings_are_converted_as_json_does() -> None:
    doc = {"big": [{1: "a", 2.5: "b", None: "c", False: "d"}] * 2000}
    assert jsontext.dumps(doc, sort_keys=False) == json.dumps(doc)


@pytest.mark.parametrize("doc", DOCS, ids=range(len(DOCS)))
def test_the_same_values_as_json_loads(doc: Any) -> None:
    text = json.dumps(doc)
    assert jsontext.loads(text) == json.loads(text)
    assert jsontext.loads(text.encode()) == json.loads(text)


def test_a_repeated_key_keeps_the_last_value_as_json_loads_does() -> None:
    assert jsontext.loads('{"a": 1, "a": 2}') == {"a": 2}

"""A nested state ↔ a flat, ordered list of array leaves plus a JSON "tree" of everything else.

The tree keeps the structure (dicts with ``str``/``int`` keys, lists, tuples) and the
non-array leaves (JSON scalars: None, bool, int, float, str), and names the tensor at each
array leaf. Tensor names are the dotted key path (``model.layer.0.weight``), readable by
anyone who opens the file with ``safetensors``; the tree, not the name, is authoritative, so
a name that would collide (``{"a.b": x, "a": {"b": y}}``), is empty or is the reserved
``__metadata__`` simply gets a ``#n`` suffix instead of an escaping scheme.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ConfigError, StateFormatError
from .shard import Shard

Key = str | int
MAX_DEPTH = 100
RESERVED = "__metadata__"


@dataclass(frozen=True)
class Leaf:
    """One array leaf: where it sits, its tensor name and the caller's object."""

    path: tuple[Key, ...]
    name: str
    value: Any


def path_text(path: Sequence[Key]) -> str:
    """``state['model'][0]``: how error messages name a leaf."""
    return "state" + "".join(f"[{k!r}]" for k in path)


def is_torch_tensor(value: object) -> bool:
    torch = sys.modules.get("torch")  # never imported here: a tensor implies torch is loaded
    return torch is not None and isinstance(value, torch.Tensor)


def is_array(value: object) -> bool:
    """NumPy arrays and scalars, torch tensors, ``__array_interface__`` and buffer objects."""
    if isinstance(value, (np.ndarray, np.generic)) or is_torch_tensor(value):
        return True
    if isinstance(value, (str, int, float)) or value is None:
        return False
    if hasattr(value, "__array_interface__"):
        return True
    try:
        memoryview(value)  # type: ignore[arg-type]
    except TypeError:
        return False
    return True


class _Namer:
    def __init__(self) -> None:
        self.used: set[str] = set()

    def name(self, path: tuple[Key, ...]) -> str:
        base = ".".join(str(k) for k in path)
        name, n = base, 0
        while name in self.used or name in ("", RESERVED):
            n += 1
            name = f"{base}#{n}"
        self.used.add(name)
        return name


def flatten(state: object) -> tuple[dict[str, Any], list[Leaf]]:
    """(tree, array leaves in depth-first order); ConfigError naming the first bad leaf."""
    if not isinstance(state, Mapping):
        raise ConfigError(f"state must be a mapping (e.g. a dict of arrays), got {type(state).__name__}")
    leaves: list[Leaf] = []
    namer = _Namer()

    def walk(value: object, path: tuple[Key, ...]) -> dict[str, Any]:
        if len(path) > MAX_DEPTH:
            raise ConfigError(f"{path_text(path[:3])}...: nested deeper than {MAX_DEPTH} levels (a cycle?)")
        if isinstance(value, Shard) or is_array(value):
            leaf = Leaf(path, namer.name(path), value)
            leaves.append(leaf)
            node: dict[str, Any] = {"tensor": leaf.name}
            if isinstance(value, np.generic):
                node["scalar"] = True
            return node
        if value is None or isinstance(value, (bool, int, float, str)):
            return {"value": value}
        if isinstance(value, Mapping):
            items = []
            for key, item in value.items():
                if isinstance(key, bool) or not isinstance(key, (str, int)):
                    raise ConfigError(f"{path_text(path)}: keys must be str or int, got {key!r}")
                items.append([key, walk(item, (*path, key))])
            return {"dict": items}
        if isinstance(value, (list, tuple)):
            kind = "tuple" if isinstance(value, tuple) else "list"
            return {kind: [walk(item, (*path, i)) for i, item in enumerate(value)]}
        raise ConfigError(
            f"{path_text(path)}: {type(value).__name__} is neither an array nor a JSON scalar "
            "(None, bool, int, float, str), list, tuple or mapping"
        )

    return walk(state, ()), leaves


def unflatten(tree: object, tensors: Mapping[str, Any]) -> Any:
    """Rebuild the state from a tree read from a file; StateFormatError if it is malformed."""
    used: set[str] = set()

    def bad(path: tuple[Key, ...], why: str) -> StateFormatError:
        return StateFormatError(f"asyncckpt.tree at {path_text(path)}: {why}")

    def build(node: object, path: tuple[Key, ...]) -> Any:
        if len(path) > MAX_DEPTH:
            raise bad(path, f"nested deeper than {MAX_DEPTH} levels")
        if not isinstance(node, dict) or len(node) not in (1, 2):
            raise bad(path, f"not a tree node: {node!r:.80}")
        if "tensor" in node:
            name = node["tensor"]
            if not isinstance(name, str) or name not in tensors or name in used:
                raise bad(path, f"names tensor {name!r}, which the header lacks or uses twice")
            used.add(name)
            array = tensors[name]
            return array[()] if node.get("scalar") is True and isinstance(array, np.ndarray) else array
        if len(node) != 1:
            raise bad(path, f"unexpected node {node!r:.80}")
        ((kind, body),) = node.items()
        if kind == "value":
            if body is not None and not isinstance(body, (bool, int, float, str)):
                raise bad(path, f"value {body!r:.80} is not a JSON scalar")
            return body
        if kind in ("list", "tuple") and isinstance(body, list):
            items = [build(item, (*path, i)) for i, item in enumerate(body)]
            return tuple(items) if kind == "tuple" else items
        if kind == "dict" and isinstance(body, list):
            out: dict[Key, Any] = {}
            for pair in body:
                if not (isinstance(pair, list) and len(pair) == 2 and type(pair[0]) in (str, int)):
                    raise bad(path, f"dict item {pair!r:.80} is not a [key, node] pair")
                out[pair[0]] = build(pair[1], (*path, pair[0]))
            return out
        raise bad(path, f"unknown node kind {kind!r}")

    state = build(tree, ())
    if not isinstance(state, dict):
        raise bad((), "the root is not a mapping")
    missing = [name for name in tensors if name not in used]
    if missing:
        raise StateFormatError(f"asyncckpt.tree does not place tensor(s) {missing[:5]}")
    return state


def tensor_paths(tree: object) -> dict[tuple[Key, ...], str]:
    """Where each tensor of a saved tree sits: ``{path: tensor name}`` (a malformed node is
    passed over here; :func:`unflatten` names it)."""
    out: dict[tuple[Key, ...], str] = {}

    def walk(node: object, path: tuple[Key, ...]) -> None:
        if not isinstance(node, dict) or len(path) > MAX_DEPTH:
            return
        if "tensor" in node:
            if isinstance(node["tensor"], str):
                out[path] = node["tensor"]
            return
        for kind, body in node.items():
            if kind in ("list", "tuple") and isinstance(body, list):
                for i, item in enumerate(body):
                    walk(item, (*path, i))
            elif kind == "dict" and isinstance(body, list):
                for pair in body:
                    if isinstance(pair, list) and len(pair) == 2 and type(pair[0]) in (str, int):
                        walk(pair[1], (*path, pair[0]))

    walk(tree, ())
    return out


def match_leaves(
    leaves: Sequence[Leaf], paths: Mapping[tuple[Key, ...], str] | None
) -> tuple[dict[str, Leaf], list[Leaf]]:
    """(``{tensor name: into= leaf}``, the leaves no saved tensor sits at). With the saved
    tree's ``paths`` a leaf is matched by where it sits, never by its dotted name alone:
    ``{"a.b": x}`` and ``{"a": {"b": y}}`` are different leaves. Without (another writer's
    flat file) by its dotted name."""
    if paths is None:
        return {leaf.name: leaf for leaf in leaves}, []
    found: dict[str, Leaf] = {}
    unknown: list[Leaf] = []
    for leaf in leaves:
        name = paths.get(leaf.path)
        if name is None:
            unknown.append(leaf)
        else:
            found[name] = leaf
    return found, unknown

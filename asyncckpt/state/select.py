"""Partial loads: which tensors of a state object a caller asked for, and which byte ranges
of the object hold them (rounded out to the checksum blocks that verify them)."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import Any, NoReturn

from ..errors import ConfigError


def _names(value: object, what: str) -> list[str]:
    """``value`` as a list of names: one string, or a collection of them (list, tuple, set,
    ``dict.keys()``); an iterator is refused, naming its type (it would be used up by the
    first of the two reads of it, the check and the selection)."""
    if isinstance(value, str):
        return [value] if value else _refuse(value, what)
    if isinstance(value, (bytes, bytearray)) or not isinstance(value, Collection):
        raise ConfigError(
            f"{what} must be a string or a collection of strings (list, tuple, set, dict keys), "
            f"got a {type(value).__name__}: {value!r:.80}"
        )
    items = list(value)
    if not items or not all(isinstance(k, str) and k for k in items):
        _refuse(value, what)
    return items


def _refuse(value: object, what: str) -> NoReturn:
    raise ConfigError(f"{what} must be a non-empty string or a list of them, got {value!r}")


def matches(name: str, prefix: str) -> bool:
    """Whether tensor ``name`` is under ``prefix``, a prefix of whole path components:
    ``"model"`` and ``"model."`` take ``model.w`` (and a tensor named ``model``), not
    ``model_ema.w``."""
    if prefix.endswith("."):
        return name.startswith(prefix)
    return name == prefix or name.startswith(prefix + ".")


def check(keys: object, prefix: object) -> None:
    """The arguments' types, before anything is read."""
    if keys is not None:
        _names(keys, "keys")
    if prefix is not None:
        _names(prefix, "prefix")


def select(
    available: Sequence[str], keys: object = None, prefix: object = None, values: Collection[str] = ()
) -> set[str] | None:
    """The tensor names to load (None: all). ``keys`` are exact tensor names (the dotted key
    path, ``model.layer.0.weight``), ``prefix`` prefixes of whole path components
    (``"model."`` or ``"model"``); each must match something, or a ConfigError names it
    (before any data is read). ``values``: the dotted paths of the state's other values
    (``step``), which a key naming one is told it is."""
    if keys is None and prefix is None:
        return None
    have = set(available)
    chosen: set[str] = set()
    if keys is not None:
        wanted = _names(keys, "keys")
        missing = [k for k in wanted if k not in have]
        scalars = [k for k in missing if k in values]
        if scalars:
            raise ConfigError(
                f"keys: {', '.join(map(repr, scalars[:5]))} is a value of the state, not a tensor: "
                "keys= and prefix= choose tensors; a full load (no keys=) returns the values"
            )
        if missing:
            raise ConfigError(f"keys: {', '.join(map(repr, missing[:5]))} not in the checkpoint")
        chosen.update(wanted)
    if prefix is not None:
        for p in _names(prefix, "prefix"):
            found = {name for name in available if matches(name, p)}
            if not found:
                raise ConfigError(f"prefix {p!r} matches no tensor of the checkpoint")
            chosen |= found
    return chosen


def spans(ranges: Iterable[tuple[int, int]], block: int, size: int) -> tuple[tuple[int, int], ...]:
    """(offset, length) reads covering the object byte ranges ``[start, end)``, each widened to
    whole ``block``s (ending at most at ``size``), merged where they touch, in object order."""
    out: list[list[int]] = []
    for start, end in sorted(r for r in ranges if r[1] > r[0]):
        lo, hi = start // block * block, min(-(-end // block) * block, size)
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return tuple((lo, hi - lo) for lo, hi in out)


def prune(tree: Any, names: set[str]) -> Any:
    """The tree restricted to the tensors in ``names``: a mapping keeps the items that lead
    to one; a list or tuple on the way keeps its length, with None for items left out; other
    values are dropped (they are not what was asked for)."""

    def keep(node: Any) -> Any:
        if "tensor" in node:
            return node if node["tensor"] in names else None
        ((kind, body),) = node.items()
        if kind == "dict":
            items = [[k, kept] for k, child in body if (kept := keep(child)) is not None]
            return {"dict": items} if items else None
        if kind in ("list", "tuple"):
            kids = [keep(child) for child in body]
            if all(k is None for k in kids):
                return None
            return {kind: [k if k is not None else {"value": None} for k in kids]}
        return None

    return keep(tree) or {"dict": []}


def value_paths(tree: Any) -> set[str]:
    """The dotted paths of a saved tree's values that are not tensors (``step``, ``lr``)."""
    out: set[str] = set()

    def walk(node: Any, path: tuple[Any, ...]) -> None:
        if not isinstance(node, dict) or "tensor" in node or len(node) != 1:
            return
        ((kind, body),) = node.items()
        if kind == "value":
            out.add(".".join(str(k) for k in path))
        elif kind in ("list", "tuple") and isinstance(body, list):
            for i, child in enumerate(body):
                walk(child, (*path, i))
        elif kind == "dict" and isinstance(body, list):
            for pair in body:
                if isinstance(pair, list) and len(pair) == 2:
                    walk(pair[1], (*path, pair[0]))

    walk(tree, ())
    return out

"""Hydra-style overrides of the workload (``++workload.checkpoint.num_checkpoints_write=1``).

MLPerf Storage drives DLIO through Hydra, so its command lines carry overrides such as
``++workload.checkpoint.num_checkpoints_write=1`` or ``+workload.model.parallelism.data=2``.
The bench accepts the same tokens (recognised by their ``+``/``++`` prefix, anywhere in the
command line) and applies them to the loaded workload document *before* it is read, so an
MLPerf command translates 1:1. Hydra's grammar, as far as workload keys go:

- ``+key=value``  adds a key that is not there (an error if it is);
- ``++key=value`` sets a key whether or not it is there.

Values are YAML scalars (``10``, ``5.5``, ``true``, ``fp16``, ``null``), as Hydra reads them.
Keys start with ``workload.`` (DLIO's config group); ``hydra.*`` keys configure Hydra's own
output folders and are reported as having no effect here.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError

PREFIX = "workload."


@dataclass(frozen=True)
class Override:
    text: str  # the token as given
    path: tuple[str, ...]  # key path inside the workload document
    value: Any
    force: bool  # ``++`` (set) rather than ``+`` (add)


def is_override(token: str) -> bool:
    return token.startswith("+") and "=" in token


def parse_override(token: str) -> Override | None:
    """One token → :class:`Override`; ``None`` for a ``hydra.*`` key (no effect here)."""
    import yaml

    force = token.startswith("++")
    body = token[2:] if force else token[1:]
    key, sep, raw = body.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {token!r}: expected +key=value or ++key=value")
    if key.startswith("hydra."):
        return None
    if not key.startswith(PREFIX):
        raise ConfigError(
            f"override {token!r}: keys start with {PREFIX!r} (e.g. ++workload.checkpoint.fsync=true)"
        )
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return Override(token, tuple(key[len(PREFIX) :].split(".")), value, force)


def split_overrides(argv: Sequence[str]) -> tuple[list[str], list[Override], list[str]]:
    """Separate override tokens from the rest of the command line.

    Returns (other arguments, overrides, ignored ``hydra.*`` tokens). Parsing happens here,
    so a malformed override is refused before anything else runs.
    """
    rest: list[str] = []
    found: list[Override] = []
    ignored: list[str] = []
    for token in argv:
        if is_override(token):
            o = parse_override(token)
            if o is None:
                ignored.append(token)
            else:
                found.append(o)
        else:
            rest.append(token)
    return rest, found, ignored


def apply_overrides(document: Mapping[str, Any], overrides: Sequence[Override]) -> dict[str, Any]:
    """A copy of ``document`` with every override applied in order (the input is not changed)."""
    doc: dict[str, Any] = copy.deepcopy(dict(document))
    for o in overrides:
        node: dict[str, Any] = doc
        for i, part in enumerate(o.path[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            elif not isinstance(child, dict):
                where = ".".join(o.path[: i + 1])
                raise ConfigError(f"override {o.text!r}: workload.{where} is {child!r}, not a section")
            node = child
        last = o.path[-1]
        if last in node and not o.force:
            raise ConfigError(
                f"override {o.text!r}: workload.{'.'.join(o.path)} is already set to {node[last]!r}; "
                "use ++ to change it"
            )
        node[last] = o.value
    return doc

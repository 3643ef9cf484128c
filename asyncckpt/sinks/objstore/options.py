"""What every object store's settings share, done one way for all of them: the unknown
options refused, each setting's value and origin (options > environment > ``.env``), and the
transport options checked (``part_size`` too, whose limits each store checks after)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from ... import env as env_vars
from ...errors import ConfigError
from ...units import finite, parse_size, shown

#: a store's variable lookup in asyncckpt.env: setting -> (variable, value) or None
Lookup = Callable[[str, Mapping[str, str] | None], tuple[str, str] | None]

#: the options checked here, not copied raw with the store's own settings
TRANSPORT = ("part_size", "max_in_flight", "max_attempts", "connect_timeout", "request_timeout")


def positive(name: str, value: object, *, integer: bool) -> Any:
    """A positive count (sizes as ``"8MiB"`` too) or a positive number of seconds."""
    if isinstance(value, str):
        with contextlib.suppress(ValueError, ConfigError):
            value = parse_size(value, name=name) if integer else float(value)
    if integer:
        number: Any = value if isinstance(value, int) and not isinstance(value, bool) else None
    else:
        number = finite(value)  # None: not a number, or too large for a float (10**400)
    if number is None or not number > 0:
        kind = "an integer >= 1" if integer else "a number of seconds > 0"
        raise ConfigError(f"backend option {name} must be {kind}, got {shown(value)}")
    return number


def transport_values(options: Mapping[str, Any]) -> dict[str, Any]:
    """The transport options given in ``options``, checked (ConfigError naming a bad one)."""
    values: dict[str, Any] = {}
    for name in TRANSPORT:
        if options.get(name) is not None:
            values[name] = positive(name, options[name], integer=not name.endswith("_timeout"))
    return values


def check_known(options: Mapping[str, Any], known: frozenset[str], store: str) -> None:
    """A ConfigError naming every option ``store``'s settings do not take, and the known ones."""
    unknown = sorted(set(options) - known)
    if unknown:
        raise ConfigError(
            f"unknown {store} backend option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )


def layered(
    options: Mapping[str, Any],
    env: Mapping[str, str] | None,
    cwd: Path | None,
    keys: Iterable[str],
    lookup: Lookup,
    rename: Mapping[str, str] | None = None,
) -> tuple[dict[str, Any], dict[str, str]]:
    """Each setting's value and where it came from, before validation (secrets still raw):
    ``options`` > the environment (``env``, default os.environ) > the ``.env`` file its
    ``dotenv`` option names. ``keys`` are the settings ``lookup`` finds in a mapping of
    variables, stored under ``rename[key]`` where the setting's name differs."""
    dotenv = env_vars.dotenv(options.get("dotenv", True), cwd)
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for key, value in options.items():
        if value is not None and key not in ("dotenv", "part_size", "max_in_flight", "max_attempts"):
            values[key], sources[key] = value, "backend_options"
    for origin, mapping in (("environment", env), (".env", dotenv)):
        for key in keys:
            target = rename.get(key, key) if rename else key
            hit = lookup(key, mapping)
            if hit is not None and target not in values:
                values[target], sources[target] = hit[1], f"{origin} {hit[0]}"
    return values, sources

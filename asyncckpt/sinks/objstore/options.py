"""The transport options every object store's settings take, checked one way for all of them
(``part_size`` too, whose limits each store checks after)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from ...errors import ConfigError
from ...units import parse_size

#: the options checked here, not copied raw with the store's own settings
TRANSPORT = ("part_size", "max_in_flight", "max_attempts", "connect_timeout", "request_timeout")


def positive(name: str, value: object, *, integer: bool) -> Any:
    """A positive count (sizes as ``"8MiB"`` too) or a positive number of seconds."""
    if isinstance(value, str):
        with contextlib.suppress(ValueError, ConfigError):
            value = parse_size(value, name=name) if integer else float(value)
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or not 0 < value < float("inf"):  # type: ignore[operator]
        kind = "an integer >= 1" if integer else "a number of seconds > 0"
        raise ConfigError(f"backend option {name} must be {kind}, got {value!r}")
    return value if integer else float(value)  # type: ignore[arg-type]


def transport_values(options: Mapping[str, Any]) -> dict[str, Any]:
    """The transport options given in ``options``, checked (ConfigError naming a bad one)."""
    values: dict[str, Any] = {}
    for name in TRANSPORT:
        if options.get(name) is not None:
            values[name] = positive(name, options[name], integer=not name.endswith("_timeout"))
    return values

"""Size parsing. Binary units (KiB, MiB, GiB, TiB) are powers of 1024; decimal units
(KB, MB, GB, TB) are powers of 1000, so "1GB" and "1GiB" never mean the same thing."""

from __future__ import annotations

import math
import re

from .errors import ConfigError

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
TiB = 1 << 40

_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": KiB,
    "mib": MiB,
    "gib": GiB,
    "tib": TiB,
}


def finite(value: object) -> float | None:
    """``value`` (an int or a float, never a bool) as a finite float; None when it is not one,
    or is too large for a float (``10**400``: OverflowError in ``float()`` and ``math.isfinite``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def shown(value: object) -> str:
    """``value`` for an error message: its repr, a huge integer's cut to its first digits."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}... ({len(text)} characters)"


_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(value: str | int, *, name: str = "size") -> int:
    """Parse ``"512MiB"``, ``"1GB"``, ``"4096"`` or an int into a byte count.

    Fractions are allowed only when they resolve to whole bytes ("1.5GiB" is fine,
    "0.3B" is not), so a typo never silently rounds.
    """
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be a byte count, got {value!r}")
    if isinstance(value, int):
        return value
    match = _SIZE_RE.match(value)
    if not match or match.group(2).lower() not in _UNITS:
        raise ConfigError(f"{name}: cannot parse {value!r}; use bytes or a unit such as 512MiB, 1GiB, 1GB")
    number, unit = match.groups()
    scale = _UNITS[unit.lower()]
    if "." in number:
        whole, frac = number.split(".")
        numerator = int(whole + frac) * scale
        denominator: int = 10 ** len(frac)
        if numerator % denominator:
            raise ConfigError(f"{name}: {value!r} is not a whole number of bytes")
        return numerator // denominator
    return int(number) * scale


_DURATION_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: str, *, name: str = "duration") -> float:
    """``"90s"``, ``"30m"``, ``"1h"``, ``"2d"`` or plain seconds → seconds (>= 0)."""
    text = value.strip().lower()
    unit = _DURATION_UNITS.get(text[-1:])
    number = text[:-1] if unit is not None else text
    try:
        seconds = float(number) * (unit or 1.0)
    except ValueError:
        raise ConfigError(f"{name} must be a duration like 90s, 30m, 1h or 2d, got {value!r}") from None
    if not 0 <= seconds < float("inf"):
        raise ConfigError(f"{name} must be a duration >= 0, got {value!r}")
    return seconds

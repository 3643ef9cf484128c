"""The one command-line grammar of ``python -m asyncckpt.bench``.

::

    python -m asyncckpt.bench [TARGET] [options] [+key=value | ++key=value ...]
    python -m asyncckpt.bench SUBCOMMAND [arguments]

- A *subcommand* is a reserved word given as the **first** argument (``report``,
  ``compare``, ...). Words are reserved before they are implemented, so a later release
  adding one cannot silently change what an existing command line means.
- A target whose name is a reserved word is written as a path: ``./compare``. A bare
  reserved word anywhere else is an error that says so, never a guess.
- *Overrides* are tokens starting with ``+`` or ``++`` and holding ``=`` (DLIO/Hydra style:
  ``+key=value`` adds a key, ``++key=value`` adds or replaces one). They are taken out of the
  argument list before ``argparse`` sees it; the workload loader (:mod:`.overrides`) applies them.
  ``+name`` without ``=`` is an error naming it, never a target (write ``./+name``); ``+5`` is
  an ordinary value. After ``--`` nothing is an override.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..errors import ConfigError

#: every word that is, or will be, a subcommand (must come first on the command line)
RESERVED = ("report", "compare", "cleanup", "ls", "plan")

_OVERRIDE = re.compile(r"^(\+\+?)([A-Za-z_][\w.\-]*)=(.*)$", re.DOTALL)


@dataclass(frozen=True)
class Override:
    """One ``+key=value`` (``force=False``) or ``++key=value`` (``force=True``) token."""

    token: str
    key: str
    value: str
    force: bool


@dataclass(frozen=True)
class Command:
    """What the first pass over argv found: a subcommand (or ``None``), its arguments, overrides."""

    name: str | None
    argv: list[str]
    overrides: tuple[Override, ...] = field(default=())


def parse_override(token: str) -> Override:
    m = _OVERRIDE.match(token)
    if m is None:
        raise ConfigError(f"override {token!r} must look like +key=value or ++key=value (no '=' given?)")
    return Override(token=token, key=m.group(2), value=m.group(3), force=m.group(1) == "++")


def is_override(token: str) -> bool:
    """``+``/``++`` then a name or an ``=``: an override, checked by :func:`parse_override` (so
    ``+key`` without ``=`` is an error naming it, not a target); ``+5`` stays an ordinary value."""
    name = token.removeprefix("++") if token.startswith("++") else token.removeprefix("+")
    return token.startswith("+") and ("=" in token or name[:1].isalpha() or name[:1] == "_")


def split_command(argv: Sequence[str]) -> Command:
    """First pass: subcommand word, remaining arguments, and the override tokens."""
    args = list(argv)
    name = args[0] if args and args[0] in RESERVED else None
    rest = args[1:] if name else args
    out: list[str] = []
    overrides: list[Override] = []
    literal = False
    for tok in rest:
        if literal:
            out.append(tok)
        elif tok == "--":
            literal = True
            out.append(tok)
        elif is_override(tok):
            overrides.append(parse_override(tok))
        else:
            out.append(tok)
    return Command(name, out, tuple(overrides))


def check_target(target: str | None) -> None:
    """A bare reserved word as TARGET is a misplaced subcommand or a path needing ``./``."""
    if target in RESERVED:
        raise ConfigError(
            f"{target!r} is a subcommand word and must come first "
            f"(python -m asyncckpt.bench {target} ...); for a target named {target}, write ./{target}"
        )


class NotYet:
    """Handler of a reserved word no release implements yet (docs may call only these reserved)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, argv: list[str]) -> int:
        raise ConfigError(
            f"{self.name!r} is reserved for a future subcommand; for a target named {self.name}, "
            f"write ./{self.name}"
        )


def not_yet(name: str) -> Callable[[list[str]], int]:
    """Handler of a reserved word no release implements yet."""
    return NotYet(name)

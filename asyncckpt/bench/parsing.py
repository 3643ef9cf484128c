"""The argparse parser every bench command uses: bad input is one line, exit code 2."""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from typing import Any, NoReturn

_NEGATIVE = re.compile(r"^-\d")  # "-1GiB": argparse takes it for an option, not a value


def join_negative_values(argv: Sequence[str]) -> list[str]:
    """``--size -1GiB`` as ``--size=-1GiB``: the value then reaches its parser, which says the
    size is invalid, instead of argparse's "expected one argument" (argparse only accepts
    plain negative numbers as values)."""
    out: list[str] = []
    for tok in argv:
        if (
            out
            and out[-1].startswith("--")
            and "=" not in out[-1]
            and "--" not in out
            and _NEGATIVE.match(tok)
        ):
            out[-1] = f"{out[-1]}={tok}"
        else:
            out.append(tok)
    return out


class Parser(argparse.ArgumentParser):
    """Bad input is one line on stderr and exit code 2 (no usage dump to scroll past)."""

    @classmethod
    def subcommand(cls, name: str, description: str) -> Parser:
        """The parser of ``python -m asyncckpt.bench NAME``."""
        return cls(prog=f"python -m asyncckpt.bench {name}", description=description)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog.removeprefix('python -m ')}: error: {message}\n")

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: Any = None
    ) -> tuple[Any, list[str]]:
        return super().parse_known_args(None if args is None else join_negative_values(args), namespace)

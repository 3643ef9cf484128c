"""The argparse parser every bench command uses: bad input is one line, exit code 2."""

from __future__ import annotations

import argparse
from typing import NoReturn


class Parser(argparse.ArgumentParser):
    """Bad input is one line on stderr and exit code 2 (no usage dump to scroll past)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog.removeprefix('python -m ')}: error: {message}\n")

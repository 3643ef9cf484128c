"""The docs site's generated and hand-written parts stay in step with the code."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from asyncckpt import errors
from asyncckpt.bench.clidoc import cli_reference
from asyncckpt.node import collectives

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_every_error_class_is_in_troubleshooting() -> None:
    listed = set(re.findall(r"^### `(\w+)`$", (DOCS / "troubleshooting.md").read_text(), re.M))
    classes = {
        name
        for module in (errors, collectives)
        for name, cls in inspect.getmembers(module, inspect.isclass)
        if issubclass(cls, errors.AsyncCkptError) and cls.__module__ == module.__name__
    }
    assert classes - listed == set(), "not in docs/troubleshooting.md"
    assert listed - classes == set(), "documented but not defined"


def test_cli_reference_lists_every_option() -> None:
    text = cli_reference()
    for heading in ("bench`", "bench report`", "bench compare`", "bench cleanup`", "bench ls`"):
        assert f"## `python -m asyncckpt.{heading}" in text
    for option in (
        "--size SIZE",
        "--plots DIR",
        "--alpha ALPHA",
        "--older-than OLDER_THAN",
        "--layout LAYOUT",
    ):
        assert f"`{option}`" in text

"""mkdocs hook: fill the CLI reference page from the bench's argparse parsers."""

from __future__ import annotations

from typing import Any

MARKER = "<!-- cli-reference -->"


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    if MARKER not in markdown:
        return markdown
    from asyncckpt.bench.clidoc import cli_reference

    return markdown.replace(MARKER, cli_reference())

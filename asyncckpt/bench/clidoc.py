"""The CLI reference in Markdown, generated from the argparse parsers (the docs site's cli page)."""

from __future__ import annotations

import argparse

from .cleanup import cleanup_parser
from .cli import build_parser
from .steplist import ls_parser
from .subcommands import compare_parser, report_parser


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _names(action: argparse.Action) -> str:
    names = action.option_strings or [action.dest]
    metavar = "" if action.nargs == 0 else f" {action.metavar or action.dest.upper()}"
    if not action.option_strings:
        metavar = ""
    if action.choices is not None and action.option_strings:
        metavar = " {" + ",".join(map(str, action.choices)) + "}"
    return ", ".join(f"`{n}{metavar if n == names[-1] else ''}`" for n in names)


def _default(action: argparse.Action) -> str:
    if action.nargs == 0 or action.default in (None, argparse.SUPPRESS):
        return ""
    return f"`{action.default}`"


def parser_markdown(p: argparse.ArgumentParser, level: int = 2) -> str:
    """One parser: usage, description, then a table of arguments per argument group."""
    out = [
        f"{'#' * level} `{p.prog}`",
        "",
        p.description or "",
        "",
        "```text",
        p.format_usage().strip(),
        "```",
    ]
    for group in p._action_groups:
        actions = [a for a in group._group_actions if not isinstance(a, argparse._HelpAction)]
        if not actions:
            continue
        out += ["", f"**{group.title}**", "", "| argument | default | meaning |", "| --- | --- | --- |"]
        out += [f"| {_names(a)} | {_cell(_default(a))} | {_cell(a.help or '')} |" for a in actions]
    return "\n".join(out) + "\n"


def cli_reference() -> str:
    """Every bench command: the run itself, then the subcommands."""
    parsers = (build_parser(), report_parser(), compare_parser(), cleanup_parser(), ls_parser())
    return "\n".join(parser_markdown(p, level=3) for p in parsers)

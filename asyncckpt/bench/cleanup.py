"""``python -m asyncckpt.bench cleanup TARGET [--older-than 1h] [--dry-run]``."""

from __future__ import annotations

import asyncio

from ..errors import TargetNotFoundError
from ..results.text import format_table
from ..sinks import local_path
from ..sinks.leftovers import Leftover, find, remove, unlisted_note
from ..units import parse_duration
from .parsing import Parser

CLEANUP = (
    "List and remove what dead saves left: temporary files in a directory, pending multipart uploads "
    "under an s3:// prefix (credentials and endpoint from AWS_* variables). Without --older-than only "
    "temporaries of dead processes on this host are removed. az:// and gs:// prefixes have nothing to list: "
    "the store discards unfinished uploads itself."
)


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"


def cleanup_parser() -> Parser:
    p = Parser.subcommand("cleanup", CLEANUP)
    p.add_argument("target", help="a directory, a checkpoint path, or s3://bucket/prefix")
    p.add_argument("--older-than", default=None, help="also remove leftovers of unknown owner this old (1h)")
    p.add_argument("--dry-run", action="store_true", help="list only")
    return p


def cleanup_main(argv: list[str]) -> int:
    args = cleanup_parser().parse_args(argv)
    older = None if args.older_than is None else parse_duration(args.older_than, name="--older-than")
    return asyncio.run(_run(args.target, older, args.dry_run))


def _action(x: Leftover, gone: set[str], dry_run: bool) -> str:
    """What was (or, in a dry run, would be) done with ``x``."""
    if dry_run:
        return "would remove" if x.removable else "kept"
    return "removed" if x.where in gone else "kept"


async def _run(target: str, older_than: float | None, dry_run: bool) -> int:
    found = await find(target, older_than)
    note = unlisted_note(target)
    if note is not None:
        print(note)
    where = local_path(target)
    if where is not None and not found and not where.exists():  # a mistyped path, not "all clean"
        raise TargetNotFoundError(
            f"no such file or directory {target!r} (nor a temporary of a save to it beside it)"
        )
    removed = [] if dry_run else await remove(found, target)
    gone = {x.where for x in removed}
    rows = [(x.kind, x.where, _age(x.age_s), x.owner, f"{_action(x, gone, dry_run)}: {x.why}") for x in found]
    if rows:
        print(format_table(["what", "where", "age", "owner", "action"], rows))
    print(f"{len(found)} leftover(s), {len(removed)} removed{' (dry run)' if dry_run else ''}")
    return 0

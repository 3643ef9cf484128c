"""Local folders a run writes into: refused before any I/O when it cannot write there, and
the ones a run made removed at its end (only those, only when empty)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path

from ..errors import ConfigError


def nearest_existing(path: Path) -> Path:
    """``path`` or its closest ancestor that exists (what ``mkdir -p`` would write into)."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_can_write(path: Path, what: str) -> None:
    """Folder ``path`` (made with its parents when missing) can be written; else ConfigError
    starting with ``what``. ``access(2)`` reports a read-only mount even to root, who ignores
    mode bits."""
    existing = nearest_existing(path)
    if not existing.is_dir():
        raise ConfigError(f"{what}: {str(existing)!r} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        ro = os.statvfs(existing).f_flag & os.ST_RDONLY
        why = "is on a read-only file system" if ro else "is not writable"
        raise ConfigError(f"{what}: {str(existing)!r} {why}")


def make_folders(path: Path) -> list[str]:
    """``mkdir -p path``; returns the folders it made, outermost first."""
    missing: list[Path] = []
    p = path.absolute()
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    made = []
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):  # made meanwhile by someone else: not ours
            d.mkdir()
            made.append(str(d))
    return made


def remove_empty(made: Iterable[str]) -> None:
    """Remove folders this run made, innermost first, each only if empty."""
    for d in reversed(list(made)):
        with contextlib.suppress(OSError):
            os.rmdir(d)

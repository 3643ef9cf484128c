"""Leftovers of dead saves: temporary files and pending S3 multipart uploads, found and removed
(Azure's uncommitted blocks and GCS's unfinished upload sessions are listed by no call: the
store discards them itself).

A save that is killed leaves its temporary file (or, on S3, its upload) behind, and an
overwrite killed between linking the replaced file aside and unlinking that name leaves the
aside name (the old version, no longer or still published at the target). Only what is
*provably* abandoned is removed without being asked: a temporary named after a process of
this host and boot that no longer exists (:mod:`asyncckpt.owner`). Everything else (another
host's or boot's temporaries, asyncckpt < 0.2 names, every S3 upload, whose owner a listing
cannot show) is removed only when the caller names an age (``older_than``), and a temporary
whose process is alive here is never removed.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..owner import LEGACY_TEMP, parse_temp
from . import backend_class, path_from_uri, resolve_backend, scheme_of
from .base import SinkOptions
from .s3 import sink_class


@dataclass(frozen=True)
class Leftover:
    where: str  # a path, or s3://bucket/key
    kind: str  # "temporary file", "replaced file" (an overwrite's aside link) or "multipart upload"
    age_s: float
    owner: str  # who left it, as far as can be told
    removable: bool
    why: str  # why it is (not) removed
    upload_id: str | None = None


def _judge(state: str, age_s: float, older_than: float | None) -> tuple[bool, str]:
    if state == "dead":
        return True, "its process is gone"
    if state == "alive":
        return False, "its process is running"
    if older_than is not None and age_s >= older_than:
        return True, f"older than {older_than:g} s"
    return False, "owner unknown: give --older-than to remove"


#: a CheckpointManager's step directory under its root, as ``asyncckpt.steps`` names them
#: (that layer sits above this one)
STEP_DIR = re.compile(r"^step-(0|[1-9]\d{0,18})$")


def file_leftovers(target: str | os.PathLike[str], older_than: float | None = None) -> list[Leftover]:
    """Temporaries in a directory and in its step directories (``step-<n>/``: a manager's
    root, whose ranks write inside them), or those of one file, given its path. Blocking: run
    it in a thread from async code."""
    path = path_from_uri(os.fspath(target))
    directory, only = (path, None) if path.is_dir() else (path.parent, path.name)
    if not directory.is_dir():
        raise ConfigError(f"{str(directory)!r} is not a directory")
    searched = [directory]
    if only is None:
        with os.scandir(directory) as entries:
            steps = [
                Path(e.path) for e in entries if STEP_DIR.match(e.name) and e.is_dir(follow_symlinks=False)
            ]
        searched += sorted(steps)
    found: list[Leftover] = []
    for where in searched:
        found += _temporaries(where, only, older_than)
    return sorted(found, key=lambda x: x.where)


def _temporaries(directory: Path, only: str | None, older_than: float | None) -> list[Leftover]:
    found = []
    now = time.time()
    with os.scandir(directory) as entries:
        for entry in entries:
            owner = parse_temp(entry.name)
            if owner is None and not LEGACY_TEMP.match(entry.name):
                continue
            if only is not None and not entry.name.startswith(f".{only}."):
                continue
            age = now - entry.stat(follow_symlinks=False).st_mtime
            if owner is None:
                state, who = "unknown", "unrecorded (asyncckpt < 0.2)"
            else:
                state = owner.state()
                who = f"pid {owner.pid} on {owner.host} ({state})"
            removable, why = _judge(state, age, older_than)
            kind = "replaced file" if owner is not None and owner.replaced else "temporary file"
            found.append(Leftover(entry.path, kind, age, who, removable, why))
    return found


async def s3_leftovers(uri: str, older_than: float | None, options: dict[str, Any]) -> list[Leftover]:
    """Pending multipart uploads under ``s3://bucket/prefix`` (through aiobotocore)."""
    sink = _listing_sink(uri, options)
    try:
        uploads = await sink.pending_uploads()
    finally:
        await sink.aclose()
    now = time.time()
    found = []
    for u in uploads:
        started = u.get("Initiated")
        # the server's clock (and its whole-second stamps) may run ahead of ours: never < 0
        age = max(0.0, now - started.timestamp()) if isinstance(started, datetime) else 0.0
        removable, why = _judge("unknown", age, older_than)
        where = f"s3://{sink.bucket}/{u['Key']}"
        found.append(
            Leftover(where, "multipart upload", age, "not recorded by S3", removable, why, u["UploadId"])
        )
    return found


def _listing_sink(uri: str, options: dict[str, Any]) -> Any:
    if resolve_backend(uri, "aiobotocore") != "aiobotocore":  # pragma: no cover - defensive
        raise ConfigError("cleanup of S3 uploads needs aiobotocore")
    # a prefix may end with "/" (or be empty), which an object URI may not: the sink is made
    # for a placeholder key and its key then set to the prefix it lists
    bucket, _, prefix = uri[len("s3://") :].partition("/")
    no_executor: Any = None  # aiobotocore runs its requests on the event loop
    sink: Any = sink_class("aiobotocore")(
        f"s3://{bucket}/prefix", executor=no_executor, options=SinkOptions(extra=dict(options))
    )
    sink.key = prefix
    return sink


#: stores whose unfinished uploads no call lists or needs to remove (the store discards them)
UNLISTED = ("az", "gs")


def unlisted_note(uri: str) -> str | None:
    """Why ``uri``'s store has nothing for cleanup to list (None: it has a listing)."""
    if scheme_of(uri) not in UNLISTED:
        return None
    hint = getattr(backend_class(resolve_backend(uri)), "leftover_hint", "")
    return f"nothing to list under {uri}: {hint}"


async def find(
    uri: str, older_than: float | None = None, options: dict[str, Any] | None = None
) -> list[Leftover]:
    """The leftovers at ``uri``: a directory or file path, or an ``s3://bucket/prefix``. An
    ``az://`` or ``gs://`` prefix has none a client can see or needs to remove
    (:func:`unlisted_note`). Azure: the blocks of a save that never committed are listed only
    with ``include=uncommittedblobs``, removable only by committing a block list over that name
    (a checkpoint there would go), and Azure discards them by itself after about 7 days. GCS: a
    resumable upload session that was not cancelled is listed by no call and expires after a
    week; its bytes are never visible."""
    if scheme_of(uri) in UNLISTED:
        return []
    if scheme_of(uri) == "s3":
        return await s3_leftovers(uri, older_than, options or {})
    if scheme_of(uri) not in ("", "file", "direct"):
        raise ConfigError(f"cleanup works on files, s3://, az:// and gs:// prefixes, not {uri!r}")
    return await asyncio.to_thread(file_leftovers, uri, older_than)


async def remove(
    leftovers: list[Leftover], uri: str, options: dict[str, Any] | None = None
) -> list[Leftover]:
    """Remove the removable ones; return those removed."""
    done = []
    files = [x for x in leftovers if x.removable and x.upload_id is None]
    for x in files:
        try:
            await asyncio.to_thread(Path(x.where).unlink)
        except FileNotFoundError:
            continue  # gone meanwhile (its owner finished, or another cleanup)
        done.append(x)
    uploads = [x for x in leftovers if x.removable and x.upload_id is not None]
    if uploads:
        sink = _listing_sink(uri, options or {})
        try:
            for x in uploads:
                assert x.upload_id is not None
                await sink.abort_upload(x.where.split("/", 3)[3], x.upload_id)
                done.append(x)
        finally:
            await sink.aclose()
    return done

"""Step directories with a commit: ``<root>/step-<n>/`` is loadable only once committed.

Each rank writes ``rank-<r>-of-<w>.safetensors`` (``save_state``); every rank then reports
its durable result to all (all-gather), and only after that does rank 0 write
``COMMITTED.json`` (step, world size, each rank's object, size and identity), last, as one
atomic object. Just before it, rank 0 writes the step's Hugging Face index
(``model.safetensors.index.json``, :mod:`asyncckpt.state.hf_index`) when every tensor name is
in exactly one rank's object, so a committed step opens with Hugging Face tools. A step
without the commit record was never complete (a rank died, a save failed): loads refuse it
and :func:`latest_step` passes over it. ``OWNER.json``, written by rank 0 when the step
starts, names the process that owns the unfinished step (host, boot, pid), so a later run
can remove it once that owner provably died (:mod:`asyncckpt.owner`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import numbers
import os
import re
import time
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Protocol

from .blocking import run_blocking
from .checksum import crc
from .engine import jsontext
from .engine.runtime import Runtime
from .errors import ConfigError, IntegrityError, StepNotCommittedError, TargetNotFoundError
from .modes import StagingMode
from .node.collectives import Collectives, get_collectives
from .owner import Owner, boot_id, host
from .sinks import local_path
from .sinks.router import StorageRouter
from .sinks.small import get_bytes, put_bytes
from .state import index as step_index
from .state import reshard
from .state.api import check_load_options, save_state
from .state.flatten import flatten
from .state.hf_index import HF_METADATA, ObjectTensors, hf_index
from .state.hf_index import INDEX as HF_INDEX
from .state.reshard import Reads
from .state.results import StagedSave, StateLoadResult, StateSaveResult
from .state.shard import Shard, is_dtensor
from .state.staging import StagingArea


class StepHost(Protocol):
    """What steps need of a checkpointer: its storage router and its state saves and loads
    (:class:`asyncckpt.AsyncCheckpointer` is one; steps sit below it, so they name this)."""

    storage: StorageRouter
    runtime: Runtime
    staging_area: StagingArea

    async def save_state(
        self,
        uri: str,
        state: Mapping[Any, Any],
        *,
        staging: StagingMode | str,
        metadata: Mapping[str, str] | None = None,
    ) -> StateSaveResult | StagedSave: ...

    async def load_state(
        self,
        uri: str,
        into: Mapping[Any, Any] | None = None,
        *,
        as_torch: bool = False,
        keys: str | Collection[str] | None = None,
        prefix: str | Collection[str] | None = None,
    ) -> StateLoadResult: ...


COMMIT = "COMMITTED.json"
OWNER = "OWNER.json"
#: step numbers are below 2**63 (19 digits: a nanosecond clock fits), as torch's and
#: NumPy's int64 step counters are
STEP_LIMIT = 1 << 63
#: a step's directory: its number as ``step_uri`` writes it, without leading zeros (``step-007``
#: beside ``step-7`` is someone else's directory, not step 7 again)
_STEP = re.compile(r"^step-(0|[1-9]\d{0,18})$")


@dataclass(frozen=True)
class StepCommit:
    """The commit record of one step (``COMMITTED.json``)."""

    step: int
    world_size: int
    objects: list[str]  # per rank, in rank order
    sizes: list[int]
    identities: list[Any]  # ETag or file identity of each published object
    committed_at: float  # seconds since the epoch
    #: the saver's per-step facts (``metrics``, ``asyncckpt_version``); None in records
    #: written before it existed, which stay readable
    metadata: dict[str, Any] | None = None
    #: the step index (``asyncckpt-index.json``: where each tensor lies), which lets any
    #: number of ranks load the step; None in records written before it existed
    index: str | None = None
    #: CRC32C (8 hex digits) of each index file of the step, by name (the step index, the
    #: Hugging Face index): an index is read through its byte ranges without a checksum of its
    #: own, so a changed digit would load the wrong bytes, verified; None in older records
    checksums: dict[str, str] | None = None


_RECORD_FIELDS = frozenset(f.name for f in fields(StepCommit))


@dataclass(frozen=True)
class StepLoad:
    """This rank's state of a committed step."""

    step: int
    state: dict[Any, Any]
    result: StateLoadResult | None  # None for a resharded load (see ``reads``)
    #: a resharded load (another world size, or DTensor/Shard destinations): bytes read and
    #: bytes its destinations needed
    reads: Reads | None = None


def check_root(root: object, storage: StorageRouter) -> str:
    """``root`` as a URI without a trailing slash; ConfigError before any I/O."""
    if not isinstance(root, (str, os.PathLike)):
        raise ConfigError(f"root must be a directory path or s3://bucket/prefix, got {root!r}")
    text = os.fspath(root).rstrip("/")
    if not text:
        raise ConfigError(f"root {os.fspath(root)!r} must name a directory or an s3://bucket/prefix")
    storage.backend_of(text).check_root(text)
    return text


def check_step(step: object) -> int:
    """``step`` as a Python int: an int or what a training loop may count with, a NumPy
    integer (``numbers.Integral``); never a bool."""
    if isinstance(step, numbers.Integral) and not isinstance(step, bool):
        step = int(step)
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ConfigError(f"step must be a non-negative integer, got {step!r}")
    if step >= STEP_LIMIT:
        raise ConfigError(f"step must be below 2**63 ({STEP_LIMIT}), got {step}")
    return step


def step_uri(root: str, step: int) -> str:
    return f"{root}/step-{step}"


def rank_object(rank: int, world: int) -> str:
    return f"rank-{rank}-of-{world}.safetensors"


# -- small operations through the checkpointer's handles -----------------------------------
async def _list(ckpt: StepHost, uri: str) -> list[str]:
    sink = await ckpt.storage.handle(uri)
    try:
        return await sink.list_names()
    finally:
        await sink.aclose()


#: the most a record read whole may hold: commit records and markers are a few KiB
RECORD_LIMIT = 1 << 20
#: the most an index may hold: it grows with tensors x boxes (about 85 bytes per box; a 70B
#: model with its Adam state under FSDP on 8 ranks has about 17 000 boxes, 1.4 MiB), so a
#: record's limit would refuse real models; 256 MiB is about 3 million boxes
INDEX_LIMIT = 256 << 20


def _encode(record: Mapping[str, Any]) -> bytes:
    return jsontext.dumps(record, sort_keys=True).encode()


def digest(raw: bytes) -> str:
    """The CRC32C of an index file as a commit record gives it (8 hex digits)."""
    return f"{crc(raw):08x}"


def _encode_summed(record: Mapping[str, Any]) -> tuple[bytes, str]:
    raw = _encode(record)
    return raw, digest(raw)


async def put_raw(ckpt: StepHost, uri: str, raw: bytes) -> None:
    """Publish ``raw`` at ``uri`` atomically (the backend's one commit)."""
    sink = await ckpt.storage.handle(uri)
    try:
        await put_bytes(sink, raw)
    finally:
        await sink.aclose()


async def put_record(ckpt: StepHost, uri: str, record: Mapping[str, Any], *, large: bool = False) -> None:
    """Publish a JSON record at ``uri`` atomically (the backend's one commit); ``large`` (an
    index): encoded in a thread, since megabytes of JSON are the loop's time else."""
    raw = await run_blocking(ckpt.runtime.executor(), _encode, record) if large else _encode(record)
    await put_raw(ckpt, uri, raw)


async def put_index(ckpt: StepHost, uri: str, record: Mapping[str, Any]) -> str:
    """Publish an index file (encoded and summed in a thread); returns its CRC32C for the
    commit record."""
    raw, summed = await run_blocking(ckpt.runtime.executor(), _encode_summed, record)
    await put_raw(ckpt, uri, raw)
    return summed


async def _read_bytes(ckpt: StepHost, uri: str, limit: int) -> bytes | None:
    """The whole small object at ``uri`` (at most ``limit`` bytes); None if absent."""
    sink = await ckpt.storage.handle(uri)
    try:
        return await get_bytes(sink, limit)
    except TargetNotFoundError:
        return None
    finally:
        await sink.aclose()


async def _size(ckpt: StepHost, uri: str) -> int | None:
    """The size of the published object at ``uri``; None if absent."""
    sink = await ckpt.storage.handle(uri)
    try:
        return await sink.size()
    except TargetNotFoundError:
        return None
    finally:
        await sink.aclose()


async def get_index_bytes(ckpt: StepHost, uri: str, expected: str | None) -> bytes | None:
    """The bytes of an index file, None if absent; IntegrityError naming both values when
    they do not match ``expected``, the CRC32C its commit record gives (None: not known)."""
    raw = await _read_bytes(ckpt, uri, INDEX_LIMIT)
    if raw is not None and expected is not None:
        got = await run_blocking(ckpt.runtime.executor(), digest, raw)
        if got != expected:
            raise IntegrityError(
                f"{uri!r} has CRC32C {got}, its commit record says {expected}: the index file "
                "changed after it was written; load this step on the number of ranks that saved it, "
                "or an earlier step"
            )
    return raw


async def get_record(ckpt: StepHost, uri: str, *, limit: int = RECORD_LIMIT) -> dict[str, Any] | None:
    """The JSON record at ``uri``; None if absent. One larger than ``RECORD_LIMIT`` (an index,
    read with ``limit=INDEX_LIMIT``) is parsed in a thread."""
    raw = await _read_bytes(ckpt, uri, limit)
    return None if raw is None else await parse_record(ckpt, uri, raw)


async def parse_record(ckpt: StepHost, uri: str, raw: bytes) -> dict[str, Any]:
    """The JSON object in ``raw`` (read from ``uri``), parsed in a thread when large."""
    try:
        if len(raw) > RECORD_LIMIT:
            record = await run_blocking(ckpt.runtime.executor(), jsontext.loads, raw)
        else:
            record = json.loads(raw)
    except ValueError as exc:
        raise IntegrityError(f"{uri!r} is not a JSON record: {exc}") from None
    if not isinstance(record, dict):
        raise IntegrityError(f"{uri!r} is not a JSON object")
    return record


async def _delete(ckpt: StepHost, uri: str) -> None:
    sink = await ckpt.storage.handle(uri)
    try:
        await sink.delete()
    finally:
        await sink.aclose()


async def withdraw_commit(ckpt: StepHost, base: str) -> None:
    """The commit record an earlier save of this step number left, removed before this rank's
    object replaces the one it names (each rank, in the directory it sees): a crash before the
    new commit then leaves the step uncommitted, never the old record over new objects."""
    with contextlib.suppress(TargetNotFoundError):  # none: the usual case
        await _delete(ckpt, f"{base}/{COMMIT}")


async def make_directory(ckpt: StepHost, uri: str) -> None:
    """The directory ``uri`` (files); object stores have no directories: a no-op there."""
    sink = await ckpt.storage.handle(uri)
    try:
        await sink.make_directory()
    finally:
        await sink.aclose()


async def exists(ckpt: StepHost, uri: str) -> bool:
    """Whether a published object is at ``uri``."""
    return await _size(ckpt, uri) is not None


# -- the public operations -----------------------------------------------------------------
async def steps_under(ckpt: StepHost, root: str | os.PathLike[str]) -> list[int]:
    """Every step number with a directory under ``root`` (committed or not), ascending. On
    files a name like a step's that is not a directory (a stray file ``step-9``) is no step."""
    base = check_root(root, ckpt.storage)
    names = await _list(ckpt, base)
    matched = {name: m for name in names if (m := _STEP.match(name))}
    found = {name: n for name, m in matched.items() if (n := int(m[1])) < STEP_LIMIT}
    where = local_path(base)
    if where is not None and found:
        directories = await run_blocking(ckpt.runtime.executor(), _directories, where, list(found))
        found = {name: n for name, n in found.items() if name in directories}
    return sorted(found.values())


def _directories(where: Path, names: list[str]) -> set[str]:
    return {name for name in names if (where / name).is_dir()}


async def read_commit(ckpt: StepHost, root: str | os.PathLike[str], step: int) -> StepCommit | None:
    """The commit record of ``step``; None if it has none."""
    uri = f"{step_uri(check_root(root, ckpt.storage), check_step(step))}/{COMMIT}"
    record = await get_record(ckpt, uri)
    if record is None:
        return None
    try:  # fields a later version added are passed over: a newer record stays readable
        commit = StepCommit(**{k: v for k, v in record.items() if k in _RECORD_FIELDS})
    except TypeError as exc:
        raise IntegrityError(f"{uri!r} is not a commit record: {exc}") from None
    _check_fields(uri, commit)
    return commit


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_fields(uri: str, commit: StepCommit) -> None:
    """Each field of a commit record read back has its type (a record edited by hand, or
    written by something else): IntegrityError naming the field, not a TypeError later."""
    world = commit.world_size
    per_rank = f"a list of {world} " if _is_int(world) else "a list of "
    wrong = [
        (name, what)
        for name, what, ok in (
            ("step", "a non-negative integer", _is_int(commit.step) and commit.step >= 0),
            ("world_size", "a positive integer", _is_int(world) and world >= 1),
            (
                "objects",
                per_rank + "object names",
                isinstance(commit.objects, list)
                and len(commit.objects) == world
                and all(isinstance(o, str) and o for o in commit.objects),
            ),
            (
                "sizes",
                per_rank + "byte counts",
                isinstance(commit.sizes, list)
                and len(commit.sizes) == world
                and all(_is_int(n) and n >= 0 for n in commit.sizes),
            ),
            (
                "identities",
                per_rank + "identities",
                isinstance(commit.identities, list) and len(commit.identities) == world,
            ),
            (
                "committed_at",
                "seconds since the epoch",
                isinstance(commit.committed_at, (int, float)) and not isinstance(commit.committed_at, bool),
            ),
            ("metadata", "an object or null", commit.metadata is None or isinstance(commit.metadata, dict)),
            ("index", "a file name or null", commit.index is None or isinstance(commit.index, str)),
            (
                "checksums",
                "an object of names to CRC32C strings, or null",
                commit.checksums is None
                or (
                    isinstance(commit.checksums, dict)
                    and all(isinstance(v, str) for v in commit.checksums.values())
                ),
            ),
        )
        if not ok
    ]
    if wrong:
        name, what = wrong[0]
        raise IntegrityError(
            f"{uri!r} is not a commit record: field {name!r} must be {what}, got {getattr(commit, name)!r}"
        )


async def step_records(
    ckpt: StepHost, root: str | os.PathLike[str]
) -> list[tuple[int, StepCommit | IntegrityError | None]]:
    """Every step under ``root``, ascending, with its commit record: None when it has none
    (uncommitted), the IntegrityError when it cannot be read (damaged, edited by hand), so a
    caller can pass over such a step, keep it and say so, rather than fail for all of them."""
    out: list[tuple[int, StepCommit | IntegrityError | None]] = []
    for step in await steps_under(ckpt, root):
        try:
            out.append((step, await read_commit(ckpt, root, step)))
        except IntegrityError as exc:
            out.append((step, exc))
    return out


async def committed_steps(ckpt: StepHost, root: str | os.PathLike[str]) -> list[StepCommit]:
    """The commit record of every committed step under ``root``, ascending by step."""
    found = [await read_commit(ckpt, root, step) for step in await steps_under(ckpt, root)]
    return [record for record in found if record is not None]


async def latest_step(ckpt: StepHost, root: str | os.PathLike[str]) -> int | None:
    """The newest committed step under ``root`` (uncommitted ones are passed over), or None."""
    found = await latest_commit(ckpt, root)
    return None if found is None else found[0]


async def latest_commit(ckpt: StepHost, root: str | os.PathLike[str]) -> tuple[int, StepCommit] | None:
    """(step, commit record) of the newest committed step under ``root``, or None."""
    for step in reversed(await steps_under(ckpt, root)):
        record = await read_commit(ckpt, root, step)
        if record is not None:
            return step, record
    return None


async def start_step(
    ckpt: StepHost,
    root: str | os.PathLike[str],
    step: int,
    state: Mapping[Any, Any],
    *,
    coll: Collectives,
    staging: StagingMode = "none",
    after: asyncio.Future[Any] | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> asyncio.Task[StepCommit]:
    """Write this rank's object of ``step``; return the task that commits the step.

    Returns once the caller's arrays may change again (``staging="host"``: after the copy;
    ``"none"``: after this rank's object is durable). Every rank must call it, in step order;
    ``after`` (the previous step's task) keeps the ranks' collectives in that order.
    ``metadata`` (JSON-safe) goes into the commit record as it is.
    """
    step = check_step(step)
    base = step_uri(check_root(root, ckpt.storage), step)
    asked = False  # several ranks: the agreement was tried (a failed gather is not asked again)
    laid_out: list[bool] = []  # its answer: each rank's state laid out, before any I/O

    async def agree(ok: bool) -> None:
        """The one all-gather before any rank touches the step: a state one rank refuses then
        leaves the step, and an earlier save of its number, as they were on every rank.
        After the previous step's collectives, so that every rank pairs the same ones."""
        nonlocal asked, laid_out
        if after is not None:
            await asyncio.wait([after])
        asked = True
        laid_out = await coll.all_gather_object(ok)

    async def ready() -> None:  # the state is laid out: a bad one was refused before any I/O
        if coll.world_size > 1:
            await agree(True)
            refused = [rank for rank, ok in enumerate(laid_out) if not ok]
            if refused:
                raise StepNotCommittedError(
                    f"step {step} under {base!r} not committed: rank(s) {refused} failed to save "
                    "(their state was refused before any I/O); nothing was written, and an earlier "
                    f"save of step {step} is untouched"
                )
        await make_directory(ckpt, base)
        await withdraw_commit(ckpt, base)
        if coll.is_coordinator:
            owner = {"host": host(), "boot": boot_id(), "pid": os.getpid(), "started_at": time.time()}
            await put_record(ckpt, f"{base}/{OWNER}", owner)

    name = rank_object(coll.rank, coll.world_size)
    saving: StateSaveResult | StagedSave | Exception
    try:
        saving = await save_state(
            ckpt.runtime, ckpt.storage, ckpt.staging_area, f"{base}/{name}", state,
            staging=staging, metadata=HF_METADATA, ready=ready,
        )  # fmt: skip
    except Exception as exc:
        if coll.world_size == 1:
            raise
        if not asked:  # refused before the agreement: the peers wait for this rank in it
            await agree(False)
            raise
        if not all(laid_out):  # the step was refused before any I/O: no commit to agree on
            raise
        saving = exc  # the peers still learn it in the all-gather, instead of waiting forever
    facts = None if metadata is None else dict(metadata)
    task = _commit(ckpt, base, step, name, saving, coll, after, facts)
    return asyncio.create_task(task, name=f"asyncckpt-commit {base}")


async def _commit(
    ckpt: StepHost,
    base: str,
    step: int,
    name: str,
    saving: StateSaveResult | StagedSave | Exception,
    coll: Collectives,
    after: asyncio.Future[Any] | None,
    metadata: dict[str, Any] | None,
) -> StepCommit:
    mine: tuple[str, int, Any, Any, ObjectTensors] | None = None
    failure: Exception | None = saving if isinstance(saving, Exception) else None
    try:
        saved = await saving if isinstance(saving, StagedSave) else saving
        if isinstance(saved, StateSaveResult):
            facts = saved.save.metadata.extra
            tensors = ObjectTensors(name, saved.tensor_names, saved.tensor_bytes)
            identity = facts.get("etag") or facts.get("identity")
            mine = (name, saved.save.size_bytes, identity, saved.layout, tensors)
    except Exception as exc:
        failure = exc
    if after is not None:  # the previous step's collectives first, on every rank
        await asyncio.wait([after])
    every = await coll.all_gather_object(mine)  # returns only once every rank's object is durable
    if failure is not None:
        raise failure
    failed = [rank for rank, entry in enumerate(every) if entry is None]
    if failed:  # every rank raises: none waits for a commit that will not come
        raise StepNotCommittedError(
            f"step {step} under {base!r} not committed: rank(s) {failed} failed to save"
        )
    objects = [e[0] for e in every if e]
    # every rank: the same error; in a thread, as the index grows with the tensors
    built = await run_blocking(ckpt.runtime.executor(), step_index.build, objects, [e[3] for e in every if e])
    record = StepCommit(
        step=step,
        world_size=coll.world_size,
        objects=objects,
        sizes=[e[1] for e in every if e],
        identities=[e[2] for e in every if e],
        committed_at=time.time(),
        metadata=metadata,
        index=step_index.INDEX,
    )
    outcome: tuple[bool, Any] = (True, None)
    if coll.is_coordinator:
        try:
            sums = {step_index.INDEX: await put_index(ckpt, f"{base}/{step_index.INDEX}", built)}
            hf = await _put_hf_index(ckpt, base, [e[4] for e in every if e])
            if hf is not None:
                sums[HF_INDEX] = hf
            record = replace(record, checksums=sums)
            await put_record(ckpt, f"{base}/{COMMIT}", asdict(record))  # last
            outcome = (True, sums)
        except Exception as exc:  # the other ranks learn it rather than wait for a commit
            outcome = (False, f"{type(exc).__name__}: {exc}")
            await coll.broadcast_object(outcome)
            raise
    # no rank reports the step committed before the record is there
    ok, told = await coll.broadcast_object(outcome)
    if not ok:
        raise StepNotCommittedError(
            f"step {step} under {base!r} not committed: rank 0 failed to commit it: {told}"
        )
    return replace(record, checksums=told)


async def _put_hf_index(ckpt: StepHost, base: str, objects: list[ObjectTensors]) -> str | None:
    """The step's Hugging Face index (atomic, as any record) and its CRC32C, or none: a stale
    one is removed."""
    index = await run_blocking(ckpt.runtime.executor(), hf_index, objects)
    if index is not None:
        return await put_index(ckpt, f"{base}/{HF_INDEX}", index)
    if HF_INDEX in await _list(ckpt, base):  # left by an earlier save of this step number
        await _delete(ckpt, f"{base}/{HF_INDEX}")
    return None


async def save_step(
    ckpt: StepHost,
    root: str | os.PathLike[str],
    step: int,
    state: Mapping[Any, Any],
    *,
    coll: Collectives | None = None,
) -> StepCommit:
    """Save this rank's ``state`` as part of ``step`` and return once the step is committed."""
    if coll is not None:
        return await (await start_step(ckpt, root, step, state, coll=coll))
    async with get_collectives() as own:
        return await (await start_step(ckpt, root, step, state, coll=own))


async def load_step(
    ckpt: StepHost,
    root: str | os.PathLike[str],
    step: int | None = None,
    *,
    into: Mapping[Any, Any] | None = None,
    as_torch: bool = False,
    coll: Collectives | None = None,
    keys: str | Collection[str] | None = None,
    prefix: str | Collection[str] | None = None,
) -> StepLoad:
    """This rank's state of ``step`` (default: the latest committed one); ``keys`` /
    ``prefix``: only those tensors (a partial load, see ``load_state``).

    Raises :class:`StepNotCommittedError` naming the step when it has no commit record.
    """
    base_root = check_root(root, ckpt.storage)
    if step is not None:
        step = check_step(step)
    check_load_options(as_torch, keys, prefix)  # before any I/O, on every path (resharded too)
    if coll is None:
        async with get_collectives() as own:
            return await load_step(
                ckpt, base_root, step, into=into, as_torch=as_torch, coll=own, keys=keys, prefix=prefix
            )
    record: StepCommit | None
    if step is None:  # the newest commit record, read once
        found = await latest_commit(ckpt, base_root)
        if found is None:
            raise StepNotCommittedError(f"no committed step under {base_root!r}")
        step, record = found
    else:
        record = await read_commit(ckpt, base_root, step)
    if record is None:
        raise StepNotCommittedError(
            f"step {step} under {base_root!r} is not committed: {step_uri(base_root, step)}/{COMMIT} is "
            "missing (the save did not finish on every rank); load an earlier step"
        )
    base = step_uri(base_root, step)
    same = record.world_size == coll.world_size
    # in a thread: walking a state of 10 000 leaves is the loop's time else
    wanted = into is not None and await run_blocking(ckpt.runtime.executor(), _boxes_wanted, into)
    if not same and record.index is None:
        raise ConfigError(
            f"step {step} was saved by {record.world_size} ranks without a step index (asyncckpt "
            f"before 0.x); this job has {coll.world_size}: load it on {record.world_size} ranks"
        )
    uri = f"{base}/{record.objects[coll.rank]}" if same else ""
    if same:  # this rank's object is the one committed, before the index or a byte is used
        await _check_named(ckpt, uri, record.sizes[coll.rank])
    index: step_index.StepIndex | None = None
    if record.index is not None and (not same or into is not None):
        where = f"{base}/{record.index}"
        # on the ranks that saved it, into= of whole arrays reads the index only to learn of
        # sharded tensors: a node's local tier holds its ranks' objects and the commit record,
        # not rank 0's index, and its own objects then load as saved
        raw = await _index_record(ckpt, where, (record.checksums or {}).get(record.index), not same or wanted)
        if raw is not None:
            index = await run_blocking(ckpt.runtime.executor(), step_index.parse, raw, where)
    # by boxes: on another world size; for DTensor/Shard destinations; and for whole arrays of
    # a sharded tensor (this rank's object holds only its box of it)
    if index is not None and (not same or wanted or index.tensors):
        state, reads = await reshard.load(
            ckpt.runtime, ckpt.storage, base, index, into=into, as_torch=as_torch, keys=keys,
            prefix=prefix, own=coll.rank if same else 0,
        )  # fmt: skip
        return StepLoad(step=step, state=state, result=None, reads=reads)
    if wanted:
        raise ConfigError(
            f"step {step} was saved without a step index (asyncckpt before 0.x): into= cannot hold "
            "DTensors or Shards for it; load it without into="
        )
    loaded = await ckpt.load_state(uri, into=into, as_torch=as_torch, keys=keys, prefix=prefix)
    return StepLoad(step=step, state=loaded.state, result=loaded)


async def _check_named(ckpt: StepHost, uri: str, size: int) -> None:
    """The object is the one its commit record names, as far as its size tells, before any
    byte of it reaches the caller's arrays (a record copied or restored by hand over other
    objects; records of this version are withdrawn before a step is saved again)."""
    found = await _size(ckpt, uri)
    if found is None:
        raise TargetNotFoundError(2, f"{uri!r}: the object its step's commit record names is missing")
    if found != size:
        raise IntegrityError(
            f"{uri!r} is {found} bytes, its step's commit record names an object of {size}: "
            "it is not the object that was committed; load an earlier step"
        )


def _boxes_wanted(into: Mapping[Any, Any] | None) -> bool:
    """Whether ``into`` names boxes of global tensors (DTensors, Shards): then each rank reads
    what its boxes need, whatever the layout the step was saved with."""
    if into is None:
        return False
    return any(isinstance(leaf.value, Shard) or is_dtensor(leaf.value) for leaf in flatten(into)[1])


async def _index_record(
    ckpt: StepHost, uri: str, expected: str | None, required: bool
) -> dict[str, Any] | None:
    """The step index's record; None when it is missing and not ``required``."""
    raw = await get_index_bytes(ckpt, uri, expected)
    if raw is None:
        if not required:
            return None
        raise IntegrityError(f"{uri!r}: the step index its commit record names is missing")
    return await parse_record(ckpt, uri, raw)


async def delete_step(ckpt: StepHost, root: str | os.PathLike[str], step: int) -> list[str]:
    """Remove a step: its commit record first (never a committed step with objects missing),
    then its objects, then (files) the directory. Returns the names removed."""
    base = step_uri(check_root(root, ckpt.storage), check_step(step))
    names = await _list(ckpt, base)
    ordered = [n for n in names if n == COMMIT] + [n for n in names if n not in (COMMIT, OWNER)]
    ordered += [n for n in names if n == OWNER]  # the owner last: an interrupted delete stays cleanable
    for name in ordered:
        await _delete(ckpt, f"{base}/{name}")
    if ckpt.storage.backend_of(base).has_directories:
        await _delete(ckpt, base)
    return ordered


async def owner_of(ckpt: StepHost, root: str, step: int) -> Owner | None:
    """Who started an uncommitted step (its ``OWNER.json``), or None if unrecorded."""
    record = await get_record(ckpt, f"{step_uri(root, step)}/{OWNER}")
    if record is None:
        return None
    try:
        return Owner(f"step-{step}", str(record["host"]), str(record["boot"]), int(record["pid"]))
    except (KeyError, TypeError, ValueError):
        return None

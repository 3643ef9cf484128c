"""The benchmark under ``mpirun`` or ``torchrun``: one shard per rank, synchronised phases,
rank-0 report. The :class:`Comm` is MPI's or torch.distributed's (gloo), chosen by
:func:`asyncckpt.node.collectives.job_comm`; the protocol below is the same for both engines.

Per checkpoint every rank does: barrier, start, save, barrier, stop, then all outcomes (ok +
result, or the error) are gathered on rank 0, which decides for everyone (broadcast) whether
the run goes on. A rank that fails therefore still reaches every collective, so no rank is
left waiting at a barrier, and rank 0 names the failing rank and its error; every rank then
exits non-zero. Anything unexpected outside that protocol aborts the communicator.

Collectives block, so they run on the communicator's thread (``Comm.a*``), between saves.
New phases (e.g. loading) plug in as :class:`Phase` entries in :func:`phases_for`.
"""

from __future__ import annotations

import argparse
import socket
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..checkpointer import AsyncCheckpointer
from ..engine.monitor import now
from ..errors import AsyncCkptError, ConfigError, MissingDependencyError, TargetNotFoundError
from ..node.distributed import Comm
from ..results.records import LoadResult, Result, SaveResult
from ..results.schema import SCHEMA_VERSION
from ..sinks import capabilities, join_uri, local_path, path_from_uri
from ..sinks.s3.endpoints import rank_endpoint
from .aggregate import aggregate_checkpoint, summarize
from .folders import make_folders, remove_empty
from .guard import Writes
from .outputs import write_outputs
from .plan_args import plan_from_args, run_with_loop
from .progress import Bar, progress_bar
from .report import format_distributed
from .resultfiles import stamp
from .runner import BenchPlan
from .scaleout import ScaleoutInfo
from .signals import end_job_if_distributed, make_temporary, remove_temporary


@dataclass(frozen=True)
class Phase:
    """One kind of operation repeated ``count`` times, e.g. ``save``/``streaming`` × 10."""

    name: str
    method: str
    count: int
    run: Callable[[AsyncCheckpointer, str, int, Bar | None], Awaitable[Result]]


def plan_mode(plan: BenchPlan) -> str:
    """``save``, ``load`` or ``both`` (builds without a load path only save)."""
    return str(getattr(plan, "mode", "save"))


def phases_for(plan: BenchPlan, writes: Writes) -> list[Phase]:
    """Saves per method (``repeat`` each), then loads (``reads``) when the plan asks for them."""

    def saver(method: str) -> Callable[[AsyncCheckpointer, str, int, Bar | None], Awaitable[SaveResult]]:
        async def run(ck: AsyncCheckpointer, uri: str, size: int, progress: Bar | None) -> SaveResult:
            return await writes.save(uri, size, method=method, progress=progress)

        return run

    async def loader(ck: AsyncCheckpointer, uri: str, size: int, progress: Bar | None) -> LoadResult:
        options = {k: getattr(plan, k) for k in ("verify", "num_readers", "read_chunk_size", "defeat_cache")}
        result: LoadResult = await getattr(ck, "load")(uri, progress=progress, **options)  # noqa: B009
        return result

    mode = plan_mode(plan)
    phases = [Phase("save", m, plan.repeat, saver(m)) for m in plan.methods] if mode != "load" else []
    if mode in ("load", "both"):
        phases.append(Phase("load", "streaming", int(getattr(plan, "reads", 1)), loader))
    return phases


class RankFailure(AsyncCkptError):
    """One or more ranks failed a phase; the message names them and their errors."""


async def outcome_of(step: Awaitable[Any]) -> dict[str, Any]:
    """``{"ok": True, "result": …}`` or ``{"ok": False, "error": …}`` for :func:`settle`."""
    try:
        return {"ok": True, "result": await step}
    except Exception as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}


async def settle(comm: Comm, outcome: dict[str, Any], t0: float, what: str) -> tuple[list[Any] | None, float]:
    """End of one checkpoint on every rank: barrier, wall time since ``t0`` (the slowest rank),
    then rank 0 gathers each rank's ``{"ok", "result" | "error"}``. If any rank failed, every
    rank raises :class:`RankFailure` naming them. Returns (gathered on rank 0 else None, wall)."""
    await comm.abarrier()
    wall = now() - t0
    gathered = await comm.agather(outcome)
    failures = None
    if gathered is not None:
        failures = [f"rank {r}: {o['error']}" for r, o in enumerate(gathered) if not o["ok"]]
    failures = await comm.abcast(failures)
    if failures:
        raise RankFailure(f"{what} failed on " + "; ".join(failures))
    return gathered, wall


def shard_uri(base: str, layout: str, rank: int, size: int, local_rank: int) -> str:
    try:
        name = layout.format(rank=rank, size=size, local_rank=local_rank)
    except (KeyError, IndexError, ValueError) as exc:
        raise ConfigError(
            f"--layout {layout!r}: bad field {exc}; use {{rank}}, {{size}}, {{local_rank}}"
        ) from None
    if not name or name.startswith("/") or ".." in name.split("/"):
        raise ConfigError(f"--layout {layout!r} must give a relative name under the target, got {name!r}")
    return join_uri(base, name)


def check_layout(base: str, layout: str, local_ranks: list[int]) -> list[str]:
    """Each rank's object under ``base`` (rank r at ``local_ranks[r]``); ConfigError before any
    I/O when the layout gives two ranks the same name: they would overwrite each other's shard
    and the run would report bytes that storage never held."""
    size = len(local_ranks)
    uris = [shard_uri(base, layout, r, size, lr) for r, lr in enumerate(local_ranks)]
    seen: dict[str, int] = {}
    for r, uri in enumerate(uris):
        if (first := seen.setdefault(uri, r)) != r:
            raise ConfigError(
                f"--layout {layout!r} gives ranks {first} and {r} the same object {uri!r}; put {{rank}} in it"
            )
    return uris


def _setup(plan: BenchPlan, layout: str, mkdirs: bool, local_ranks: list[int]) -> dict[str, Any]:
    """Rank 0 only: create the shared target (or a temporary one) and check the layout."""
    check_layout(plan.target or "/", layout, local_ranks)  # a bad layout fails here, before any I/O
    base, created, made = plan.target, None, []
    if base is None and plan_mode(plan) == "load":
        raise ConfigError("--mode load needs a TARGET saved earlier (e.g. by --mode save --keep)")
    if base is None:
        base = created = make_temporary("asyncckpt-bench-")
    elif (path := local_path(base)) is not None:
        if path.exists() and not path.is_dir():
            raise ConfigError(
                f"with several ranks the target is a directory of shards; {str(path)!r} is a file"
            )
        if not path.parent.is_dir():
            raise TargetNotFoundError(
                2, f"parent directory {str(path.parent)!r} of the target does not exist"
            )
        made += make_folders(path)  # a TARGET the run made goes at its end too, if empty
    if mkdirs and local_path(base) is not None:  # each rank's folder, with its own local_rank
        for uri in check_layout(base, layout, local_ranks):  # removed at the end if empty
            made += make_folders(Path(path_from_uri(uri)).parent)
    return {"base": base, "created": created, "made": made}


def _remove_setup(setup: dict[str, Any]) -> None:
    """Rank 0, after every rank removed its objects: the folders :func:`_setup` made, if empty."""
    remove_empty(setup.get("made", ()))
    if setup.get("created"):
        remove_temporary(setup["created"])


async def _rank_main(plan: BenchPlan, comm: Comm, uri: str) -> list[dict[str, Any]]:
    """This rank's part of every phase; rank 0 returns the aggregated phases."""
    out: list[dict[str, Any]] = []
    async with AsyncCheckpointer(plan.config) as ck:
        writes = Writes(ck, overwrite=plan.overwrite)
        try:
            if plan_mode(plan) != "load":  # every rank's object checked before any rank writes
                await settle(comm, await outcome_of(writes.check(uri)), now(), "checking the targets")
            for phase in phases_for(plan, writes):
                checkpoints = []
                for i in range(phase.count):
                    show = plan.progress and comm.is_root
                    await comm.abarrier()
                    t0 = now()
                    with progress_bar(plan.size, f"{phase.method} {i + 1}/{phase.count}", show) as bar:
                        outcome = await outcome_of(phase.run(ck, uri, plan.size, bar))
                    if outcome["ok"]:
                        outcome["result"] = outcome["result"].to_dict()
                    gathered, wall = await settle(comm, outcome, t0, f"{phase.name} {i + 1}/{phase.count}")
                    if gathered is not None:
                        checkpoints.append(aggregate_checkpoint([o["result"] for o in gathered], wall))
                if comm.is_root:
                    out.append(
                        {
                            "phase": phase.name,
                            "method": phase.method,
                            "checkpoints": checkpoints,
                            "summary": summarize(checkpoints),
                        }
                    )
        finally:
            if not plan.keep:  # only what this run's saves published
                await writes.remove_created()
    return out


def run_distributed(
    args: argparse.Namespace,
    comm: Comm,
    info: ScaleoutInfo,
) -> int:
    """Entry point of ``python -m asyncckpt.bench`` with several ranks; returns the exit code."""
    root = comm.is_root

    def fail(code: int, message: str) -> int:
        if root:
            print(f"asyncckpt.bench: {message}", file=sys.stderr)
        return code

    # 1. validate everywhere, set up on rank 0 and broadcast (no rank creates or lists alone)
    me = comm.info
    setup: dict[str, Any] = {}
    error: str | None = None
    endpoint: str | None = None
    local_ranks = comm.allgather(me.local_rank)  # the layout may name it: rank 0 renders every rank's
    try:
        plan = plan_from_args(args)
        # S3_LOAD_BALANCE_STRATEGY=rank: each rank its own front end
        if plan.target is not None and capabilities(plan.target, plan.config.backend).multi_endpoint:
            endpoint = rank_endpoint(me.rank)
        if root:
            setup = _setup(plan, args.layout, args.mkdirs, local_ranks)
    except (ConfigError, MissingDependencyError, TargetNotFoundError) as exc:
        error = str(exc)
    errors = comm.allgather(error)  # every rank learns if any rank cannot start
    shared: dict[str, Any] | None = comm.bcast(setup if root else None)
    bad = next(((r, e) for r, e in enumerate(errors) if e), None)
    if bad is not None or not shared:
        r, e = bad or (0, "no setup from rank 0")
        if root and shared:
            _remove_setup(shared)
        return fail(2, f"error: {e}" if r == 0 else f"error on rank {r}: {e}")
    setup = shared
    if root:
        for note in info.notes:
            print(f"[asyncckpt] {note}", file=sys.stderr)
    uri = shard_uri(setup["base"], args.layout, me.rank, me.size, me.local_rank)
    # distinct data per rank (seed + rank), as real shards differ: storage cannot dedupe them
    config = replace(plan.config, seed=plan.config.seed + me.rank)
    if endpoint is not None:
        config = replace(config, backend_options={**config.backend_options, "endpoint_url": endpoint})
    plan = replace(plan, target=uri, config=config)
    if not root:
        plan = replace(plan, progress=False, verbose=False)
    hosts = comm.gather((socket.gethostname(), me.local_size, uri, endpoint))
    # 2. the phases
    code = 0
    phases: list[dict[str, Any]] = []
    try:
        phases = run_with_loop(args.loop, lambda: _rank_main(plan, comm, uri))
    except RankFailure as exc:
        code = fail(1, f"failed: {exc}")
    except KeyboardInterrupt:  # SIGINT/SIGTERM: this rank's saves removed what they published
        if root and not plan.keep:
            _remove_setup(setup)
        end_job_if_distributed(comm)
        raise
    except BaseException as exc:  # outside the protocol: the other ranks may be waiting
        print(
            f"asyncckpt.bench: rank {me.rank}: {type(exc).__name__}: {exc}; aborting the job", file=sys.stderr
        )
        comm.abort(1)
    finally:
        comm.close()
    comm.barrier()
    if root and not plan.keep:
        _remove_setup(setup)
    if not root or code:
        return code
    # 3. report (rank 0 only)
    assert hosts is not None
    nodes: dict[str, int] = {}
    for host, local_size, _, _ in hosts:
        nodes[host] = local_size
    report = {
        "schema_version": SCHEMA_VERSION,
        "mode": "mpi",
        "world_size": comm.size,
        "nodes": nodes,
        "launcher": me.launcher,
        "engine": comm.engine,  # the collectives' transport: mpi (mpi4py) or torch (torch.distributed)
        "rank_info_source": me.source,
        "target": setup["base"],
        "layout": args.layout,
        "shards": [u for _, _, u, _ in hosts],
        "rank_endpoints": [ep for _, _, _, ep in hosts],  # set with S3_LOAD_BALANCE_STRATEGY=rank
        "size_bytes_per_rank": plan.size,
        "seed_base": plan.config.seed,  # rank r writes the stream of seed_base + r
        "preset": info.preset,
        "config_file": info.config_file,
        "config_unused_keys": info.config_unused,
        "phases": phases,
    }
    text = format_distributed(report)
    print(text)
    try:
        for line in write_outputs(stamp(report), text, args):
            print(f"[asyncckpt] {line}", file=sys.stderr)
    except OSError as exc:
        return fail(1, f"failed writing results: {exc}")
    return 0

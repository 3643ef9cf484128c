"""A DLIO workload run: every rank writes ITS planned objects, DLIO's run rules, one score.

Per checkpoint (DLIO's ``_checkpoint_write``): emulated compute (``time_between_checkpoints``,
an ``asyncio.sleep`` on every rank: emulation, never synchronisation), barrier, start, each
of this rank's objects saved through :meth:`AsyncCheckpointer.save` into
``TARGET/global_epoch1_step{i}/`` in DLIO's order, barrier, stop. Then the caches are defeated
(O_DIRECT/eviction on reads, ``--drop-caches`` on every node) and ``num_checkpoints_read``
checkpoints are read back the same way. Score per checkpoint, as MLPerf Storage's: total
bytes ÷ the slowest rank's time; beside it the straggler, the imbalance (largest ÷ mean rank
bytes) and each rank's time per object type. Failures follow the protocol of
:mod:`.mpi_runner`: outcomes are gathered on rank 0, which decides for everyone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import time
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

from ..checkpointer import AsyncCheckpointer
from ..engine.monitor import now
from ..errors import (
    ConfigError,
    MissingDependencyError,
    StepNotCommittedError,
    StorageError,
    map_os_error,
)
from ..node.distributed import Comm
from ..results.records import Result
from ..results.text import RULE, format_table, gbps
from ..sinks import capabilities, join_uri, local_path, path_from_uri
from ..steps import COMMIT, get_record
from .aggregate import aggregate_checkpoint, summarize
from .dlio_layout import DLIO_GB, CheckpointPlan, PlannedObject, RankPlan, scaled, step_directory
from .dlio_plan import format_plan, make_plan, plan_ranks, subset_note, world_note
from .folders import check_can_write, make_folders, remove_empty
from .guard import Writes
from .load_args import drop_caches
from .mlperf_results import host_facts, write_results_dir
from .mpi_runner import RankFailure, outcome_of, settle
from .plan_args import plan_from_args, run_with_loop
from .runner import BenchPlan
from .scaleout import ScaleoutInfo
from .signals import end_job_if_distributed, make_temporary, remove_temporary


def object_uri(base: str, step: int, obj: PlannedObject) -> str:
    return in_step(base, step, obj.name)


def in_step(base: str, step: int, name: str) -> str:
    """``name`` in the step's directory (or S3 prefix) under ``base``."""
    return join_uri(base, f"{step_directory(1, step)}/{name}")


def _is_local(base: str) -> bool:
    return local_path(base) is not None


def _setup(base: str | None, steps: int, mode: str) -> dict[str, Any]:
    """Rank 0: the base folder (created with its parents, as DLIO's namespace) and step dirs."""
    created = None
    if base is None:
        if mode == "load":
            raise ConfigError("--mode load needs a TARGET saved earlier (e.g. by --mode save --keep)")
        base = created = make_temporary("asyncckpt-dlio-")
    made: list[str] = []
    if _is_local(base):
        root = path_from_uri(base)
        if root.exists() and not root.is_dir():
            raise ConfigError(f"the checkpoint folder {str(root)!r} is a file, not a folder")
        if mode != "load":
            check_can_write(root, f"cannot write checkpoints to {str(root)!r}")
            try:
                made += make_folders(root)
            except OSError as exc:
                raise map_os_error(exc, f"create the checkpoint folder {str(root)!r}") from None
            for step in range(1, steps + 1):
                d = root / step_directory(1, step)
                if not d.exists():
                    d.mkdir()
                    made.append(str(d))
    return {"base": base, "created": created, "made_dirs": made}


def _undo_setup(shared: dict[str, Any]) -> None:
    """Remove the folders the setup made (base, its parents, step folders), each only if
    empty, and the temporary base it created."""
    remove_empty(shared["made_dirs"])
    if shared["created"]:
        remove_temporary(shared["created"])


async def _phase(
    writes: Writes,
    comm: Comm,
    bench: BenchPlan,
    mine: RankPlan,
    base: str,
    phase: str,
    count: int,
    pause_s: float,
) -> list[dict[str, Any]]:
    """``count`` checkpoints of this rank's objects; rank 0 returns the aggregated ones."""
    ck = writes.ckpt
    out: list[dict[str, Any]] = []
    for i in range(1, count + 1):
        if pause_s > 0:
            await asyncio.sleep(pause_s)  # emulated compute before the checkpoint (DLIO's compute())
        await comm.abarrier()
        t0 = now()
        outcome: dict[str, Any]
        try:
            kinds: dict[str, dict[str, float]] = {}
            counts: dict[str, int] = {}
            if phase == "load" and keeps_records(base):
                await _require_commit(ck, base, i)
            for obj in mine.objects:
                uri = object_uri(base, i, obj)
                r: Result
                if phase == "save":
                    r = await writes.save(uri, obj.size)
                else:
                    opts = {
                        k: getattr(bench, k)
                        for k in ("verify", "num_readers", "read_chunk_size", "defeat_cache")
                    }
                    r = await ck.load(uri, **opts)
                k = kinds.setdefault(obj.kind, {"objects": 0, "bytes": 0, "seconds": 0.0})
                k["objects"] += 1
                k["bytes"] += r.size_bytes
                k["seconds"] += r.wall_s
                for label, n in r.bottleneck_counts.items():
                    counts[label] = counts.get(label, 0) + n
            wall = now() - t0
            nbytes = sum(int(k["bytes"]) for k in kinds.values())
            bottleneck = max(counts, key=counts.__getitem__) if counts else "none"
            outcome = {
                "ok": True,
                "result": {
                    "names": [obj.name for obj in mine.objects],
                    "object_bytes": [obj.size for obj in mine.objects],
                    "size_bytes": nbytes,
                    "wall_s": wall,
                    "objects": len(mine.objects),
                    "by_kind": kinds,
                    "bottleneck": bottleneck,
                    "bottleneck_counts": counts,
                    "metadata": {"hostname": socket.gethostname()},
                },
            }
        except Exception as exc:
            outcome = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        gathered, phase_wall = await settle(comm, outcome, t0, f"{phase} {i}/{count}")
        if gathered is not None and phase == "save" and keeps_records(base):  # all ranks durable now
            await _commit_step(writes, base, i, [o["result"] for o in gathered])
        if gathered is not None:
            results = [o["result"] for o in gathered]
            agg = aggregate_checkpoint(results, phase_wall)
            agg["step"] = step_directory(1, i)
            agg["objects"] = sum(r["objects"] for r in results)
            agg["rank_kind_seconds"] = [{k: v["seconds"] for k, v in r["by_kind"].items()} for r in results]
            agg["kind_seconds_max"] = _kind_max(results)
            agg["throughput_dlio_gb_per_s"] = agg["throughput_bps"] / DLIO_GB
            out.append(agg)
    return out


async def _commit_step(writes: Writes, base: str, step: int, results: list[dict[str, Any]]) -> None:
    """The step's commit record, written by rank 0 after every rank's objects are durable (the
    same record and rule as ``asyncckpt.steps``): a reader tells a complete DLIO step from the
    leftovers of a run that died mid-step. Written after the timed phase: DLIO has no such
    object, so it is not part of the score."""
    record = {
        "step": step,
        "world_size": len(results),
        "objects": [r["names"] for r in results],  # per rank, relative to the step directory
        "sizes": [r["object_bytes"] for r in results],
        "committed_at": time.time(),
    }
    await writes.put_record(in_step(base, step, COMMIT), record)


def keeps_records(base: str) -> bool:
    """null:// stores nothing: it has no step to commit or to read back."""
    return capabilities(base).keeps_data


async def _require_commit(ck: AsyncCheckpointer, base: str, step: int) -> None:
    """Read only a step every rank finished: its commit record is there."""
    uri = in_step(base, step, COMMIT)
    if await get_record(ck, uri) is None:
        raise StepNotCommittedError(
            f"{step_directory(1, step)} under {base!r} has no commit record ({uri}): "
            "a run that wrote it did not finish every rank's objects; save it again first"
        )


def _kind_max(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per object type: the longest any rank spent on it, and which rank."""
    out: dict[str, dict[str, Any]] = {}
    for rank, r in enumerate(results):
        for kind, v in r["by_kind"].items():
            if kind not in out or v["seconds"] > out[kind]["seconds"]:
                out[kind] = {"rank": rank, "seconds": v["seconds"], "bytes": v["bytes"]}
    return out


async def _check_all(writes: Writes, uris: list[str]) -> None:
    for uri in uris:
        await writes.check(uri)


async def _rank_main(
    bench: BenchPlan, comm: Comm, mine: RankPlan, base: str, pause_s: float
) -> dict[str, Any]:
    """This rank's run; rank 0 returns ``{"setup_s": [per rank], "phases": {...}}``."""
    phases: dict[str, list[dict[str, Any]]] = {}
    async with AsyncCheckpointer(bench.config) as ck:
        writes = Writes(ck, overwrite=bench.overwrite)
        try:
            # DLIO allocates before its timed region: the pool, threads and client, not in checkpoint 1
            setup, _ = await settle(comm, await outcome_of(ck.prepare(base)), now(), "setting up")
            if bench.mode in ("save", "both"):
                # every rank's objects checked before any rank writes
                uris = [
                    object_uri(base, step, obj) for step in range(1, bench.repeat + 1) for obj in mine.objects
                ]
                await settle(comm, await outcome_of(_check_all(writes, uris)), now(), "checking the targets")
                phases["save"] = await _phase(writes, comm, bench, mine, base, "save", bench.repeat, pause_s)
            if bench.mode in ("load", "both"):
                if bench.drop_caches:  # every node: one rank per node suffices, all is simpler
                    await asyncio.to_thread(drop_caches)
                phases["load"] = await _phase(writes, comm, bench, mine, base, "load", bench.reads, pause_s)
        finally:
            if not bench.keep:  # only what this run's saves published
                await writes.remove_created()
    return {"setup_s": [o["result"] for o in setup] if setup is not None else [], "phases": phases}


def main_workload(
    args: argparse.Namespace,
    info: ScaleoutInfo,
    comm: Comm,
) -> int:
    """``--plan`` (no I/O) or a workload run; returns the exit code."""
    wl = info.workload
    assert wl is not None and wl.model is not None
    root = comm.is_root
    model = wl.model

    def world(layout: CheckpointPlan) -> str:
        return world_note(layout, model, info.reference_ranks, info.reference_source)

    def say(code: int, message: str) -> int:
        if root:
            print(f"asyncckpt.bench: {message}", file=sys.stderr)
        return code

    if args.plan:
        try:
            ranks = plan_ranks(wl.model, args.ranks, info.reference_ranks, comm.size)
            layout = make_plan(wl.model, ranks, info.reference_ranks)
        except ConfigError as exc:
            return say(2, f"error: {exc}")
        if root:
            for note in [*info.notes, world(layout)]:
                print(f"[asyncckpt] {note}", file=sys.stderr)
            print(format_plan(layout, args.scale))
            if args.json is not None:
                args.json.write_text(json.dumps(layout.to_dict(), indent=2) + "\n")
        return 0
    # 1. validate everywhere, set up on rank 0, broadcast
    error: str | None = None
    setup: dict[str, Any] = {}
    try:
        if args.ranks is not None and args.ranks != comm.size:
            raise ConfigError(f"--ranks {args.ranks} is for --plan; this run has {comm.size} rank(s)")
        bench = plan_from_args(args)
        if bench.mode == "both" and bench.reads > bench.repeat:
            raise ConfigError(
                f"num_checkpoints_read {bench.reads} is more than num_checkpoints_write {bench.repeat} "
                "(DLIO refuses it)"
            )
        if args.results_dir and (Path(args.results_dir) / "summary.json").exists():
            raise ConfigError(
                f"--results-dir {args.results_dir!r} already has a summary.json; give an empty folder"
            )
        if args.results_dir and root:  # only rank 0 writes it, at the end: checked now
            check_can_write(Path(args.results_dir), f"--results-dir {args.results_dir!r}")
        layout = make_plan(wl.model, comm.size, info.reference_ranks)
        mine = scaled(layout.rank_plans[comm.rank], args.scale)
        empty = [o.name for o in mine.objects if o.size <= 0]
        if empty:
            raise ConfigError(
                f"rank {comm.rank}: {empty[0]} has 0 bytes; the shape is too small for its sharding"
            )
        if root:
            setup = _setup(bench.target, bench.repeat if bench.mode != "load" else 0, bench.mode)
    except (ConfigError, MissingDependencyError, StorageError) as exc:
        error = str(exc)
    errors = comm.allgather(error)
    shared: dict[str, Any] | None = comm.bcast(setup if root else None)
    bad = next(((r, e) for r, e in enumerate(errors) if e), None)
    if bad is not None or not shared:
        r, e = bad or (0, "no setup from rank 0")
        if root and shared:
            _undo_setup(shared)
        return say(2, f"error: {e}" if r == 0 else f"error on rank {r}: {e}")
    base = str(shared["base"])
    config = replace(bench.config, seed=bench.config.seed + comm.rank)  # distinct data per rank
    bench = replace(bench, target=base, config=config)
    hosts = comm.gather(host_facts())
    if root:
        for note in [*info.notes, world(layout)]:
            print(f"[asyncckpt] {note}", file=sys.stderr)
        if layout.subset:
            full = make_plan(replace(layout.model, data=layout.data_parallelism), layout.full_ranks)
            print(f"[asyncckpt] {subset_note(layout, full.total_bytes)}", file=sys.stderr)
    # 2. the phases
    start = datetime.now()
    code = 0
    ran: dict[str, Any] = {}
    try:
        ran = run_with_loop(
            args.loop, lambda: _rank_main(bench, comm, mine, base, wl.time_between_checkpoints)
        )
    except RankFailure as exc:
        code = say(1, f"failed: {exc}")
    except KeyboardInterrupt:  # SIGINT/SIGTERM: this rank's saves removed what they published
        if root:
            _remove_setup(shared, bench)
        end_job_if_distributed(comm)
        raise
    except BaseException as exc:  # outside the protocol: the other ranks may be waiting
        print(
            f"asyncckpt.bench: rank {comm.rank}: {type(exc).__name__}: {exc}; aborting the job",
            file=sys.stderr,
        )
        comm.abort(1)
    finally:
        comm.close()
    end = datetime.now()
    comm.barrier()
    if root:
        _remove_setup(shared, bench)
    if not root or code:
        return code
    assert hosts is not None
    report = build_report(info, layout, bench, base, ran, hosts, wl.time_between_checkpoints, args.scale)
    print(format_report(report))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    if args.results_dir:
        written = write_results_dir(Path(args.results_dir), report, info, start, end)
        print(f"[asyncckpt] MLPerf-style results: {', '.join(str(p) for p in written)}", file=sys.stderr)
    return 0


def _remove_setup(shared: dict[str, Any], bench: BenchPlan) -> None:
    """Rank 0, at the end: what the setup made (folders only if empty, the temporary base),
    unless ``--keep`` (a load-only run made neither)."""
    if not bench.keep and bench.mode != "load":
        _undo_setup(shared)


def build_report(
    info: ScaleoutInfo,
    layout: CheckpointPlan,
    bench: BenchPlan,
    base: str,
    ran: dict[str, Any],
    hosts: list[dict[str, Any]],
    pause_s: float,
    scale: float,
) -> dict[str, Any]:
    """``ran``: rank 0's return of :func:`_rank_main` (setup times, phases)."""
    wl = info.workload
    assert wl is not None and wl.model is not None
    phases: dict[str, list[dict[str, Any]]] = ran["phases"]
    return {
        "mode": "dlio",
        "units": "bytes and bytes/s; *_dlio_gb* fields are 1024**3 (DLIO's 'GB'), GB elsewhere is 10**9",
        "workload": workload_name(info),
        "config_file": info.config_file,
        "config_unused_keys": info.config_unused,
        "overrides": info.overrides,
        "target": base,
        "world_size": layout.ranks,
        "hosts": hosts,
        "time_between_checkpoints_s": pause_s,
        "fsync": bench.config.fsync,
        "scale": scale,
        # what one checkpoint writes (every object x scale); "plan" is the unscaled layout
        "checkpoint_bytes": sum(scaled(rp, scale).nbytes for rp in layout.rank_plans),
        "plan": layout.to_dict(objects=False),
        "subset": layout.subset,
        "world_source": world_note(layout, wl.model, info.reference_ranks, info.reference_source),
        "setup_s": max(ran["setup_s"]),  # before the first timed checkpoint, slowest rank
        "rank_setup_s": ran["setup_s"],
        "phases": {
            name: {"checkpoints": cps, "summary": summarize(cps)} for name, cps in phases.items() if cps
        },
    }


def workload_name(info: ScaleoutInfo) -> str:
    if info.config_file and not info.config_file.startswith("preset "):
        return Path(info.config_file).stem
    if info.preset:
        return str(info.preset["model"]).replace("-", "_")
    wl = info.workload
    return wl.model.name if wl is not None and wl.model is not None else "workload"


def format_report(report: dict[str, Any]) -> str:
    plan = report["plan"]
    head = [
        RULE,
        f"DLIO workload {report['workload']}: {report['world_size']} rank(s) on "
        f"{len({h['hostname'] for h in report['hosts']})} host(s); target {report['target']}",
        f"layout: {plan['num_objects']:,} objects, {plan['total_bytes']:,} B per checkpoint "
        f"({plan['total_dlio_gb']:.3f} GiB); largest rank {plan['largest_rank']['rank']}, "
        f"imbalance {plan['imbalance']:.3f}" + ("; SUBSET run" if report["subset"] else ""),
        *(
            [
                f"--scale {report['scale']:g}: every object is written at that fraction of its size: "
                f"{report['checkpoint_bytes']:,} B per checkpoint"
            ]
            if report.get("scale") not in (None, 1.0)
            else []
        ),
        f"emulated compute between checkpoints: {report['time_between_checkpoints_s']:g} s; "
        f"fsync {report['fsync']}",
        f"setup before the timed checkpoints: {report['setup_s']:.3f} s (slowest rank: backend, "
        "threads, buffer pool; in no checkpoint's time)",
        RULE,
    ]
    blocks = ["\n".join(head)]
    for name, ph in report["phases"].items():
        rows = []
        for i, c in enumerate(ph["checkpoints"]):
            kinds = " / ".join(
                f"{k} {v['seconds']:.3f} s (rank {v['rank']})" for k, v in c["kind_seconds_max"].items()
            )
            rows.append(
                (
                    i + 1,
                    c["step"],
                    f"{c['total_bytes']:,}",
                    f"{c['duration_s']:.3f} s",
                    gbps(c["throughput_bps"]),
                    f"{c['throughput_dlio_gb_per_s']:.3f}",
                    f"{c['slowest_rank']['rank']} ({c['slowest_rank']['wall_s']:.3f} s)",
                    f"{c['straggler_ratio']:.2f}x",
                    kinds,
                )
            )
        headers = (
            "#",
            "step",
            "bytes",
            "slowest time",
            "throughput",
            "GiB/s (DLIO)",
            "straggler",
            "spread",
            "longest per object type",
        )
        s = ph["summary"]
        blocks.append(
            f"{name.upper()}: throughput = total bytes ÷ the slowest rank's time (MLPerf)\n"
            + format_table(headers, rows)
            + f"\nmean throughput {gbps(s['throughput_bps_mean'])} "
            f"({s['throughput_bps_mean'] / DLIO_GB:.3f} GiB/s) over {s['checkpoints']} checkpoint(s)"
        )
    return "\n\n".join(blocks)

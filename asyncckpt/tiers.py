"""Tiered checkpoints: steps commit on a fast local tier, then drain to the remote root.

A tiered :class:`~asyncckpt.CheckpointManager` saves each step under its local root with the
usual protocol (every rank's object durable, then ``COMMITTED.json``), then each rank copies
its own object to the remote root in the background (:mod:`asyncckpt.drain`), one drain at a
time per rank. The remote ``COMMITTED.json`` is written by rank 0 only once every rank's remote
object is complete: each rank publishes ``rank-<r>-of-<w>.drained.json`` after its object, and
rank 0 waits for all of them by reading the remote step (no collective: the save commits use
the collectives in step order on every rank, and a drain, which finishes at its own time on
each rank, would have to join that order and hold later saves' commits behind it). A step is
"remote-committed" only then.

Restore picks the newest step committed on either tier (a local-only step counts only when
every rank has its object locally), loads the local copy when this rank has it, and falls
back to the remote one, with a warning naming the offset, when the local copy fails
verification. Retention: ``keep_local`` newest local steps, but a step that is not
remote-committed is never deleted locally (:attr:`TierStats.kept_local` says why); the
manager's policies (``keep_last``, ...) apply to the remote root after each remote commit.
With ``replicate_to_peer=True`` each locally committed object is also copied to the next
node's local tier, and a restore fetches a lost node's objects back from there
(:mod:`asyncckpt.replicas`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from . import steps
from .blocking import LoopLocks
from .checkpointer import AsyncCheckpointer
from .drain import Drained, DrainHost, check_bandwidth, drain_object, drainer_config
from .engine.monitor import now
from .errors import AsyncCkptError, ConfigError, IntegrityError, TargetNotFoundError
from .modes import DrainPriority, DrainWhenBusy
from .node.collectives import Collectives
from .node.launcher import local_rank
from .owner import Owner, boot_id, host
from .replicas import Moved, Replicator
from .retention import RetentionPolicy, to_delete
from .sinks import leftovers, path_from_uri
from .state.hf_index import INDEX as HF_INDEX
from .steps import StepCommit, StepHost, StepLoad

log = logging.getLogger("asyncckpt")

#: how long rank 0 waits for every rank's remote object of a step before it gives up (the step
#: stays local-only and its drain is tried again at the next start)
REMOTE_COMMIT_TIMEOUT = 600.0
_POLL_FIRST, _POLL_MAX = 0.02, 1.0


class TierHost(StepHost, DrainHost, Protocol):
    """What tiers need of a checkpointer: steps' and drains' needs."""


@dataclass
class StepTiers:
    """One step's way through the tiers (JSON-safe: it goes into the remote commit record)."""

    step: int
    local_commit_s: float | None = None  # from the start of its save to its local commit
    remote_commit_s: float | None = None  # from the start of its save to its remote commit (rank 0)
    bytes_drained: int = 0  # this rank's object
    drain_s: float = 0.0
    drain_gb_per_s: float = 0.0
    started_at: float | None = None  # wall clock at the start of its save (this run's saves only)
    state: str = "saving"  # saving, local, draining, drained, remote-committed, skipped, failed
    error: str | None = None
    replicated_to: int | None = None  # the peer rank that holds this rank's replica
    bytes_replicated: int = 0  # this rank's object, on its peer's node
    replica_s: float = 0.0  # from the local commit to the replica written (rank's own view)


@dataclass
class TierStats:
    """What the tiers did per step, and what they did not do and why."""

    steps: dict[int, StepTiers] = field(default_factory=dict)
    drains_skipped: list[int] = field(default_factory=list)  # when_busy="skip"
    drains_waited: list[tuple[int, float]] = field(default_factory=list)  # (step, seconds)
    drains_queued: list[int] = field(default_factory=list)  # drained after an earlier one
    drain_failures: list[tuple[int, str]] = field(default_factory=list)  # each step once, first cause
    resumed: list[int] = field(default_factory=list)  # committed local steps drained after a restart
    collected: list[str] = field(default_factory=list)  # dead drains' pending uploads removed
    remote_committed: list[int] = field(default_factory=list)
    local_deleted: list[int] = field(default_factory=list)
    remote_deleted: list[int] = field(default_factory=list)
    kept_local: list[tuple[int, str]] = field(default_factory=list)  # beyond keep_local, and why
    #: local steps deleted before their remote commit because the local disk was full
    dropped_local: list[tuple[int, str]] = field(default_factory=list)
    restored_from: tuple[str, str] | None = None  # (tier, why): "local", "peer" or "remote"
    #: replicas of a step this rank sends or receives that failed: (step, first cause)
    replica_failures: list[tuple[int, str]] = field(default_factory=list)
    #: steps whose replicas a previous run left unmade, made again at this start
    replicas_resumed: list[int] = field(default_factory=list)
    #: drains (and remote commits) stopped by a preempted run's close: they resume at the next start
    drains_left: list[int] = field(default_factory=list)
    #: remote retention that could not list the remote root or delete a step: (step, why);
    #: nothing is deleted blind, the next commit's retention tries again
    retention_failures: list[tuple[int, str]] = field(default_factory=list)

    def of(self, step: int) -> StepTiers:
        return self.steps.setdefault(step, StepTiers(step))

    def as_dict(self) -> dict[str, Any]:
        """JSON-safe, for result files."""
        out = asdict(self)
        out["steps"] = [asdict(s) for _, s in sorted(self.steps.items())]
        return out


def check_tiers(remote: str, local: object, keep_local: object, host: StepHost) -> str:
    """The local root as a URI; ConfigError naming the bad value, before any I/O."""
    if isinstance(keep_local, bool) or not isinstance(keep_local, int) or keep_local < 1:
        raise ConfigError(f"keep_local must be a positive integer, got {keep_local!r}")
    try:
        root = steps.check_root(local, host.storage)
    except ConfigError as exc:  # the message says "root": name the argument it came from
        shown = os.fspath(local) if isinstance(local, (str, os.PathLike)) else local
        raise ConfigError(f"local={shown!r}: {exc}") from None
    if not host.storage.backend_of(root).has_directories:
        raise ConfigError(
            f"local={root!r} must be a local directory path (the fast tier), not a remote store"
        )
    if host.storage.backend_of(remote).has_directories and _same_dir(root, remote):
        raise ConfigError(
            f"local={root!r} and the remote root {remote!r} overlap "
            "(the same directory, or one inside the other)"
        )
    return root


def _as_json(value: Any) -> Any:
    """``value`` as a JSON record holds it (tuples as lists), to compare with one read back."""
    return json.loads(json.dumps(value))


def _same_dir(a: str, b: str) -> bool:
    """Whether two local roots overlap, however each is written (a path, ``file://``,
    ``direct://``, through a symlink)."""
    pa, pb = (os.path.realpath(path_from_uri(x)) for x in (a, b))
    return pa == pb or pa.startswith(pb + os.sep) or pb.startswith(pa + os.sep)


def _marker(name: str) -> str:
    return name.removesuffix(".safetensors") + ".drained.json"


def _draining(name: str) -> str:
    """Who is draining the object (host, boot, pid): the owner rule's record for its upload."""
    return name.removesuffix(".safetensors") + ".draining.json"


class Tiers:
    """The drains of one manager, and restore and retention across the two tiers."""

    def __init__(
        self,
        host: TierHost,
        *,
        local: str,
        remote: str,
        keep_local: int,
        retention: RetentionPolicy,
        when_busy: DrainWhenBusy,
        max_queued: int,
        bandwidth: object,
        priority: DrainPriority = "idle",
        remote_commit_timeout: float = REMOTE_COMMIT_TIMEOUT,
        replicate: bool = False,
    ) -> None:
        self.host, self.local, self.remote = host, local, remote
        self.keep_local, self.retention = keep_local, retention
        self.when_busy, self.max_queued = when_busy, max_queued
        self.bandwidth = check_bandwidth(bandwidth)
        self.priority = priority
        self.remote_commit_timeout = remote_commit_timeout
        self.stats = TierStats()
        self._coll: Collectives | None = None
        self._last: asyncio.Task[None] | None = None  # the newest drain: each waits for the one before
        self._running: set[asyncio.Task[None]] = set()
        self._committing: set[asyncio.Task[None]] = set()  # rank 0's remote commits
        self._pruning = LoopLocks()  # one local prune at a time
        #: the newest remote commit: each waits for the one before, so commits land in step
        #: order (a retried step's commit may take longer than the next step's drain, and
        #: retention judges the steps committed so far)
        self._last_commit: asyncio.Task[None] | None = None
        self._started: dict[int, tuple[float, float]] = {}  # step -> (monotonic, wall) at its save's start
        self._skip_next = False
        self._logged: set[int] = set()
        self._began: dict[int, asyncio.Event] = {}
        self._local_done: dict[int, asyncio.Event] = {}
        #: set once this rank knows where its drain of the step ended: drained or failed (rank 0:
        #: once the remote commit is written or has failed), or skipped
        self._settled: dict[int, asyncio.Event] = {}
        #: the drains' own checkpointer (same config): a save holds its runtime's lock for the whole
        #: write, so a drain through the manager's would hold the next local save behind it
        self._drainer: AsyncCheckpointer | None = None
        #: replicate_to_peer: each local object also on the next node's local tier
        self.replicas = Replicator(host, local) if replicate else None

    # -- the manager's hooks ----------------------------------------------------------------
    async def start(self, coll: Collectives) -> None:
        """Drains of committed local steps that a previous run left unfinished start again."""
        self._coll = coll
        if coll.world_size > 1 and self.when_busy == "skip":
            raise ConfigError(
                f"drain_when_busy='skip' needs one rank; this job has {coll.world_size}: "
                "use 'wait' or 'queue'"
            )
        local: list[int] | None = None
        if self.replicas is not None:
            await self.replicas.start(coll)
            local = await self._resume_replicas(coll)
        failure: Exception | None = None
        try:
            remote = await self._remote_committed()
        except Exception as exc:  # training starts anyway: the drains are tried at the next commit
            remote, failure = set(), exc
        if local is None:
            local = await self._local_committed()
        # agreed by every rank: a step only some ranks still hold locally (a node was lost) can
        # never be remote-committed, and rank 0 would wait for the others' objects in vain
        views = await coll.all_gather_object((local, sorted(remote), failure is None))
        if failure is not None or not all(v[2] for v in views):
            for step in local:
                self._failed(step, failure or AsyncCkptError("a rank could not list the remote root"))
            return
        everywhere = set.intersection(*(set(v[0]) for v in views))
        agreed = set.intersection(*(set(v[1]) for v in views))
        for step in sorted(everywhere):
            if step not in agreed and (not agreed or step > max(agreed)):
                self.stats.resumed.append(step)
                self._drain(step, None)

    async def _resume_replicas(self, coll: Collectives) -> list[int]:
        """Replicas a previous run left unmade (killed mid-replica; a node replaced since) of
        the steps every rank still holds locally: made again, by themselves, like drains.
        Returns this rank's committed local steps (the start's drains resume from them)."""
        assert self.replicas is not None
        own, held = await self._local_holdings()
        views = await coll.all_gather_object((own, held))
        todo = self.replicas.missing([set(v[0]) for v in views], [set(v[1]) for v in views])
        for step, (send, receive) in todo.items():
            self.stats.replicas_resumed.append(step)
            task = self.replicas.replicate(step, receive=receive)
            task.add_done_callback(functools.partial(self._replicated, step, now(), send))
        return own

    async def _remote_has(self, step: int) -> bool:
        """Whether ``step`` is remote-committed; False while the remote cannot be read (an
        outage must not stop the local tier's work)."""
        try:
            return await steps.read_commit(self.host, self.remote, step) is not None
        except Exception as exc:
            log.debug("remote commit of step %d unknown: %s", step, exc)
            return False

    async def _remote_committed(self) -> set[int]:
        return {r.step for r in await steps.committed_steps(self.host, self.remote)}

    async def before_save(self, step: int) -> None:
        """A save of ``step`` starts: ``when_busy`` decides about drains still running."""
        self._started[step] = (now(), time.time())
        busy = [t for t in self._running if not t.done()]
        if not busy:
            return
        if self.when_busy == "skip":
            self._skip_next = True
            return
        limit = 0 if self.when_busy == "wait" else self.max_queued
        t0, waited = now(), False
        while len(busy) > limit:
            waited = True
            await asyncio.wait(busy, return_when=asyncio.FIRST_COMPLETED)
            busy = [t for t in busy if not t.done()]
        if waited:
            self.stats.drains_waited.append((step, now() - t0))
        if busy:
            self.stats.drains_queued.append(step)

    async def committed(self, record: StepCommit) -> None:
        """``record``'s step committed locally: record it, drain it (unless skipped), prune."""
        step = record.step
        mine = self.stats.of(step)
        started = self._started.pop(step, None)
        mine.local_commit_s = None if started is None else now() - started[0]
        mine.started_at = None if started is None else started[1]
        mine.state = "local"
        await self._local_record(record)
        self._local_done.setdefault(step, asyncio.Event()).set()
        if self.replicas is not None:
            task = self.replicas.replicate(step)
            task.add_done_callback(functools.partial(self._replicated, step, now(), True))
        for failed in sorted({s for s, _ in self.stats.drain_failures}):
            if self.stats.of(failed).state == "failed" and failed < step:
                self._drain(failed, None)  # the remote may be back: try again, in step order
        if self._skip_next:
            self._skip_next = False
            self.stats.drains_skipped.append(step)
            mine.state = "skipped"
            self._settle(step)
        else:
            self._drain(step, record)
        await self._prune_local()

    def _replicated(self, step: int, t0: float, sending: bool, task: asyncio.Task[Moved]) -> None:
        """A replica's end: its figures, or its failure reported once with its first cause
        (``sending``: this rank's own object was to go to its peer)."""
        mine = self.stats.of(step)
        error = None if task.cancelled() else task.exception()
        if error is None and not task.cancelled():
            moved = task.result()
            if moved.sent or not sending:
                assert self.replicas is not None and self.replicas.ring is not None and self._coll
                mine.replicated_to = self.replicas.ring.peer[self._coll.rank]
                if moved.sent:
                    mine.bytes_replicated, mine.replica_s = moved.sent, now() - t0
                return
            error = IntegrityError("this rank's local object could not be read (or carries no checksums)")
        why = "cancelled" if error is None else f"{type(error).__name__}: {error}"
        self.stats.replica_failures.append((step, why))
        log.error(
            "a replica of step %d to or from a peer node failed (the remote copy still drains): %s", step, why
        )

    async def drain_began(self, step: int) -> None:
        """Until this rank's drain of ``step`` has started (a hook for callers and tests that
        act while a drain runs)."""
        await self._began.setdefault(step, asyncio.Event()).wait()

    async def local_committed(self, step: int) -> None:
        """Until ``step`` is committed on the local tier (a hook, like :meth:`drain_began`)."""
        await self._local_done.setdefault(step, asyncio.Event()).wait()

    def _settle(self, step: int) -> None:
        self._settled.setdefault(step, asyncio.Event()).set()

    async def reached(self, step: int, within_s: float) -> str:
        """Where ``step`` is, as far as this rank knows, waiting for its drain at most
        ``within_s`` seconds: ``"remote"`` (remote-committed: rank 0 wrote the record), ``"drained"``
        (this rank's object is on the remote; the commit is rank 0's) or ``"local"``."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._settled.setdefault(step, asyncio.Event()).wait(), max(within_s, 0.0))
        return {"remote-committed": "remote", "drained": "drained"}.get(self.stats.of(step).state, "local")

    async def stop(self) -> None:
        """Stop the drains and remote commits still running (a preempted run's close must not
        outlive its deadline for them): their uploads are aborted, nothing half-written is
        published, and the next start drains those committed local steps again."""
        pending = [t for t in self._running | self._committing if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
        if self.replicas is not None:  # lockstep with every rank: finished, never cancelled
            await self.replicas.wait()
        left = sorted(
            s
            for s, t in self.stats.steps.items()
            if t.state in ("local", "draining", "drained") and s not in self.stats.drains_left
        )
        self.stats.drains_left.extend(left)
        if left:
            log.warning("drains of steps %s stopped (preempted); the next start drains them again", left)

    async def wait(self) -> None:
        """Until every drain and remote commit started so far has ended."""
        while pending := [t for t in self._running | self._committing if not t.done()]:
            await asyncio.wait(pending)
        if self.replicas is not None:
            await self.replicas.wait()

    async def aclose(self) -> None:
        """Close the drains' checkpointer (after :meth:`wait`)."""
        drainer, self._drainer = self._drainer, None
        if drainer is not None:
            await drainer.aclose()
        if self.replicas is not None:
            self.replicas.close()

    # -- draining -----------------------------------------------------------------------
    def _drain(self, step: int, record: StepCommit | None) -> None:
        previous = self._last
        task = asyncio.create_task(self._drain_after(step, record, previous), name=f"asyncckpt-drain {step}")
        self._last = task
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _drain_after(
        self, step: int, record: StepCommit | None, previous: asyncio.Task[None] | None
    ) -> None:
        if previous is not None:
            await asyncio.wait([previous])
        coll = self._coll
        assert coll is not None
        mine = self.stats.of(step)
        mine.state, mine.error = "draining", None
        self._began.setdefault(step, asyncio.Event()).set()
        name = steps.rank_object(coll.rank, coll.world_size)
        base = steps.step_uri(self.remote, step)
        try:
            if record is None:  # a resumed drain: read once, for the marker and the remote commit
                record = await steps.read_commit(self.host, self.local, step)
            done = await self._drain_mine(step, name, base, record)
        except Exception as exc:
            self._failed(step, exc)
            self._settle(step)
            return
        if done is not None:
            mine.bytes_drained, mine.drain_s, mine.drain_gb_per_s = done.size, done.seconds, done.gb_per_s
        mine.state = "drained"
        if not coll.is_coordinator:
            self._settle(step)
        else:
            task = asyncio.create_task(
                self._remote_commit(step, record, self._last_commit), name=f"asyncckpt-remote-commit {step}"
            )
            self._last_commit = task
            self._committing.add(task)
            task.add_done_callback(self._committing.discard)

    async def _drain_mine(self, step: int, name: str, base: str, record: StepCommit | None) -> Drained | None:
        """This rank's object of ``step`` to the remote root, then its marker; None when a
        previous run had already drained this very object (its marker names it as the source).

        A marker of another object (an earlier save of this step number) does not count; the
        remote commit of that earlier save is withdrawn before its object is replaced."""
        source = self._source(record)
        marker = await steps.get_record(self.host, f"{base}/{_marker(name)}")
        if marker is not None and source is not None and marker.get("source") == source:
            return None
        await steps.make_directory(self.host, base)
        await steps.withdraw_commit(self.host, base)
        await self._collect_dead_drain(base, name)
        me = {"host": host(), "boot": boot_id(), "pid": os.getpid(), "started_at": time.time()}
        await steps.put_record(self.host, f"{base}/{_draining(name)}", me)
        local = f"{steps.step_uri(self.local, step)}/{name}"
        if self._drainer is None:
            idle = self.priority == "idle"
            self._drainer = AsyncCheckpointer(drainer_config(self.host.config, idle=idle))
            self._drainer.runtime.background = idle
        done = await drain_object(self._drainer, local, f"{base}/{name}", bandwidth=self.bandwidth)
        facts = {
            "object": name,
            "size": done.size,
            "identity": done.identity,
            "drain_s": done.seconds,
            "source": source,
        }
        await steps.put_record(self.host, f"{base}/{_marker(name)}", facts)
        return done

    def _source(self, record: StepCommit | None) -> Any:
        """This rank's local object as its step's local commit record names it (a file's
        identity): what a remote marker must name to stand for it; None if unknown."""
        coll = self._coll
        assert coll is not None
        if record is None or coll.rank >= len(record.identities):
            return None
        return _as_json(record.identities[coll.rank])

    async def _collect_dead_drain(self, base: str, name: str) -> None:
        """A previous drain of this object whose recorded process provably died (this host and
        boot, pid gone) may have left a pending multipart upload: removed, by the owner rule. A
        file remote's dead temporaries are removed by the next save into its directory."""
        target = f"{base}/{name}"
        if self.host.storage.backend_of(target).has_directories:
            return
        record = await steps.get_record(self.host, f"{base}/{_draining(name)}")
        if record is None:
            return
        try:
            owner = Owner(name, str(record["host"]), str(record["boot"]), int(record["pid"]))
        except (KeyError, TypeError, ValueError):
            return
        if not owner.provably_dead():
            return
        options = dict(self.host.config.backend_options)
        mine = [x for x in await leftovers.find(target, 0.0, options) if x.where == target]
        for gone in await leftovers.remove(mine, target, options):
            self.stats.collected.append(f"{gone.where} (upload {gone.upload_id})")
            log.info("removed the pending upload %s of a dead drain of %s", gone.upload_id, target)

    def _failed(self, step: int, exc: Exception) -> None:
        mine = self.stats.of(step)
        mine.state, mine.error = "failed", f"{type(exc).__name__}: {exc}"
        if step in self._logged:  # reported once per step, with its first cause
            log.debug("drain of step %d failed again: %s", step, exc)
            return
        self._logged.add(step)
        self.stats.drain_failures.append((step, mine.error))
        log.error(
            "drain of step %d to %s failed (the step stays local-only; retried later): %s",
            step,
            self.remote,
            exc,
        )

    async def _remote_commit(
        self, step: int, record: StepCommit | None, previous: asyncio.Task[None] | None
    ) -> None:
        """Rank 0: once every rank's marker is there and the previous commit has ended, the
        remote commit record; then retention."""
        if previous is not None:
            await asyncio.wait([previous])
        try:
            await self._commit_when_complete(step, record)
        except Exception as exc:
            self._failed(step, exc)
            return
        finally:
            self._settle(step)
        await self._prune_remote(step)
        # a local step kept beyond keep_local because its drain was still running can go now,
        # not at the next local commit (this node's local rank 0 is rank 0 here)
        await self._prune_local()

    async def _commit_when_complete(self, step: int, record: StepCommit | None) -> None:
        coll = self._coll
        assert coll is not None
        base = steps.step_uri(self.remote, step)
        names = [steps.rank_object(r, coll.world_size) for r in range(coll.world_size)]
        if record is None:
            record = await steps.read_commit(self.host, self.local, step)
        sources = _as_json(record.identities) if record is not None else None
        found = await self._markers(base, names, sources)
        metadata = dict(record.metadata or {}) if record is not None else {}
        mine = self.stats.of(step)
        metadata["tiers"] = {
            "local_committed_at": record.committed_at if record else None,
            "rank0": asdict(mine),
        }
        index = await self._copy_indexes(step, base, record)
        remote = StepCommit(
            step=step,
            world_size=coll.world_size,
            objects=names,
            sizes=[int(m["size"]) for m in found],
            identities=[m.get("identity") for m in found],
            committed_at=time.time(),
            metadata=metadata,
            index=index,
            checksums=record.checksums if record is not None else None,
        )
        await steps.put_record(self.host, f"{base}/{steps.COMMIT}", asdict(remote))
        mine.remote_commit_s = None if mine.started_at is None else time.time() - mine.started_at
        mine.state = "remote-committed"
        self.stats.remote_committed.append(step)

    async def _copy_indexes(self, step: int, base: str, record: StepCommit | None) -> str | None:
        """The step's indexes, local to remote, before the remote commit names them: the step
        index (without it no other number of ranks can load the remote copy) and the Hugging
        Face index when the step has one. Returns the step index's name, as the record gives it.

        Copied as bytes, checked against the CRC32C the commit record gives; a record written
        before it gave them: parsed as JSON and written again, the check it had then."""
        local = steps.step_uri(self.local, step)
        index = record.index if record is not None else None
        if record is not None and record.checksums is not None:
            for name, expected in record.checksums.items():
                raw = await steps.get_index_bytes(self.host, f"{local}/{name}", expected)
                if raw is None:
                    raise IntegrityError(f"{local}/{name}: an index file its commit record names is missing")
                await steps.put_raw(self.host, f"{base}/{name}", raw)
            return index
        for name in ([index] if index else []) + [HF_INDEX]:
            got = await steps.get_record(self.host, f"{local}/{name}", limit=steps.INDEX_LIMIT)
            if got is None:
                if name == index:
                    raise IntegrityError(f"{local}/{name}: the step index its commit record names is missing")
                continue
            await steps.put_record(self.host, f"{base}/{name}", got, large=True)
        return index

    async def _markers(self, base: str, names: list[str], sources: list[Any] | None) -> list[dict[str, Any]]:
        """Every rank's marker under ``base``, read until all are there (backing off); with
        ``sources``, only markers naming the rank's local object of this save: a marker left
        by an earlier save of this step number is passed over until its rank replaces it."""
        deadline, pause = now() + self.remote_commit_timeout, _POLL_FIRST
        found: dict[str, dict[str, Any]] = {}
        while True:
            for rank, name in enumerate(names):
                if name in found:
                    continue
                got = await steps.get_record(self.host, f"{base}/{_marker(name)}")
                if got is not None and (sources is None or got.get("source") == sources[rank]):
                    found[name] = got
            if len(found) == len(names):
                return [found[n] for n in names]
            if now() > deadline:
                missing = [n for n in names if n not in found]
                raise AsyncCkptError(
                    f"{base}: {missing} not drained within {self.remote_commit_timeout:g} s; no remote commit"
                )
            await asyncio.sleep(pause)  # polling the remote store: the other ranks finish at their own time
            pause = min(pause * 2, _POLL_MAX)

    # -- retention ----------------------------------------------------------------------
    async def _prune_remote(self, step: int) -> None:
        if not self.retention.active:
            return
        try:
            found = await steps.step_records(self.host, self.remote)
        except Exception as exc:  # was the remote commit task's end, read by nobody
            self.stats.retention_failures.append((step, f"could not list {self.remote}: {exc}"))
            log.warning("remote retention after step %d could not list %s: %s", step, self.remote, exc)
            return
        records = [r for _, r in found if isinstance(r, StepCommit) and r.step <= step]
        for old in to_delete(self.retention, records, time.time()):
            try:
                await steps.delete_step(self.host, self.remote, old)
            except Exception as exc:
                self.stats.retention_failures.append((old, f"could not delete it: {exc}"))
                log.warning("could not delete old remote step %d: %s", old, exc)
            else:
                self.stats.remote_deleted.append(old)

    async def _prune_local(self) -> None:
        """Keep the ``keep_local`` newest local steps; older ones go only once remote-committed.
        Each node's first local rank prunes its own local directory."""
        if local_rank() != 0:
            return
        async with self._pruning.current():  # after a local commit and after a remote one, never at once
            await self._prune_local_now()

    async def _prune_local_now(self) -> None:
        committed = await self._local_committed()
        for old in committed[: -self.keep_local]:
            if not await self._remote_has(old):
                why = "not remote-committed yet: kept beyond keep_local"
                if (old, why) not in self.stats.kept_local:
                    self.stats.kept_local.append((old, why))
                continue
            if self.replicas is not None:  # its directory may be receiving a peer's replica
                await self.replicas.settled(old)
            try:
                await steps.delete_step(self.host, self.local, old)
            except Exception as exc:
                log.warning("could not delete old local step %d: %s", old, exc)
            else:
                self.stats.local_deleted.append(old)

    async def make_room(self, failed_step: int, cause: Exception) -> None:
        """The local disk is full (a save of ``failed_step`` failed with NoSpaceError): the
        local steps beyond ``keep_local`` go even if not remote-committed, and the manager says
        so; never the newest committed one, nor one being drained."""
        if local_rank() != 0:
            return
        committed = await self._local_committed()
        for old in committed[: -self.keep_local]:
            if self.stats.of(old).state == "draining":
                continue
            if self.replicas is not None:
                await self.replicas.settled(old)
            try:
                await steps.delete_step(self.host, self.local, old)
            except Exception as exc:
                log.warning("could not delete local step %d to make room: %s", old, exc)
                continue
            remote = await self._remote_has(old)
            why = f"local disk full (step {failed_step}: {cause})" + (
                "" if remote else "; it was not remote-committed"
            )
            self.stats.dropped_local.append((old, why))
            self.stats.local_deleted.append(old)
            log.warning("deleted local step %d: %s", old, why)

    # -- restore ------------------------------------------------------------------------
    async def _local_committed(self) -> list[int]:
        """Local steps committed with this rank's object present, ascending."""
        return (await self._local_holdings(with_replicas=False))[0]

    async def _local_holdings(self, *, with_replicas: bool = True) -> tuple[list[int], list[int]]:
        """Local steps committed with this rank's object present, and (with replicas on) those
        holding the replica this node keeps for its source rank, both ascending: one pass over
        the tier, each commit record read once."""
        coll = self._coll
        assert coll is not None
        own = steps.rank_object(coll.rank, coll.world_size)
        held = (
            steps.rank_object(self.replicas.source(), coll.world_size)
            if with_replicas and self.replicas is not None
            else None
        )
        mine: list[int] = []
        kept: list[int] = []
        for step in await steps.steps_under(self.host, self.local):
            if await steps.read_commit(self.host, self.local, step) is None:
                continue
            where = steps.step_uri(self.local, step)
            if await steps.exists(self.host, f"{where}/{own}"):
                mine.append(step)
            if held is not None and await steps.exists(self.host, f"{where}/{held}"):
                kept.append(step)
        return mine, kept

    async def _local_record(self, record: StepCommit) -> None:
        """Node-local directories: the commit record in each node's directory, not only rank 0's."""
        uri = f"{steps.step_uri(self.local, record.step)}/{steps.COMMIT}"
        if await steps.get_record(self.host, uri) is None:
            await steps.put_record(self.host, uri, asdict(record))

    async def restore(
        self, into: Mapping[Any, Any] | None, *, as_torch: bool, coll: Collectives
    ) -> StepLoad | None:
        """This rank's state of the newest step committed on either tier, or None."""
        mine, held = await self._local_holdings()
        local = set(mine)
        try:
            remote = await self._remote_committed()
        except Exception as exc:  # the local tier alone may still hold a committed step
            log.warning(
                "remote root %s could not be listed (%s): restoring from the local tier only",
                self.remote,
                exc,
            )
            remote = set()
        # every rank must pick the same step: one that all of them hold locally (or, with
        # replicas, on their peers' nodes), or that all of them see remote-committed (a rank
        # that cannot list the remote sees none there)
        views = await coll.all_gather_object((sorted(local), sorted(remote), held))
        everywhere = set.intersection(*(set(v[0]) for v in views)) if views else set()
        remote = set.intersection(*(set(v[1]) for v in views)) if views else set()
        peers = (
            self.replicas.restorable([set(v[0]) for v in views], [set(v[2]) for v in views])
            if self.replicas
            else set()
        )
        candidates = everywhere | remote | peers
        if not candidates:
            return None
        step = max(candidates)
        fetched, unfetched = False, ""
        if step not in everywhere and step in peers:
            lacks = [step not in v[0] for v in views]
            assert self.replicas is not None
            unfetched = await self.replicas.fetch_back(step, lacks, self.remote if step in remote else None)
            fetched = lacks[coll.rank] and not unfetched
            if fetched:
                local.add(step)
        if step in local:
            try:
                loaded = await steps.load_step(
                    self.host, self.local, step, into=into, as_torch=as_torch, coll=coll
                )
            except (IntegrityError, TargetNotFoundError) as exc:
                if step not in remote:
                    raise
                offset = getattr(exc, "offset", None)
                where = f" at offset {offset}" if offset is not None else ""
                log.warning(
                    "local copy of step %d failed verification%s (%s): restoring from %s",
                    step,
                    where,
                    exc,
                    self.remote,
                )
                self.stats.restored_from = ("remote", f"the local copy failed verification{where}: {exc}")
            else:
                self.stats.restored_from = (
                    (
                        "peer",
                        f"step {step} was lost on this node: fetched back from its peer's replica, verified",
                    )
                    if fetched
                    else ("local", f"step {step} is complete on this node and verified")
                )
                return loaded
        elif unfetched:
            self.stats.restored_from = ("remote", unfetched)
        else:
            why = "not on this node's local tier" if step not in everywhere else "local copy missing"
            self.stats.restored_from = ("remote", f"step {step} is {why}")
        return await steps.load_step(self.host, self.remote, step, into=into, as_torch=as_torch, coll=coll)

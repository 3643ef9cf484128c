"""``CheckpointManager``: step directories for a training loop, saved on a cadence, pruned by policy.

The loop calls ``await mgr.maybe_save(step, state, metrics=...)`` each step; the cadence
(every N steps, every N seconds, or continuously) decides whether it saves, and the metrics and
asyncckpt version go into the step's commit record (:mod:`asyncckpt.retention`). A save runs in the background
(``staging="host"``: the loop waits only for the copy; the staging area is made in the
background at the first call that saves nothing, or at ``restore(into=)``) and commits its step
when every rank's object is durable (:mod:`asyncckpt.steps`). With a save still pending, ``when_busy="wait"``
waits for it and ``"skip"`` skips this step; both are recorded in ``stats``. After a commit,
rank 0 deletes, in the background, the committed steps no retention rule keeps. At start rank 0 removes
uncommitted steps of a crashed run, but only those whose recorded owner provably died; a step
whose save failed in this process is removed at once. ``wait()`` and ``aclose()`` raise the
first failure of that background work (``raise_on_failure=False``: logged and counted only).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import importlib.metadata
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from . import modes, steps
from .checkpointer import AsyncCheckpointer
from .engine.monitor import now
from .errors import CollectiveError, ConfigError, IntegrityError, NoSpaceError
from .modes import BestMode, DrainPriority, DrainWhenBusy, OnPreempt, StagingMode, Tier, WhenBusy
from .node.collectives import Collectives, get_collectives
from .preempt import Preemption, PreemptRecord
from .retention import Cadence, RetentionPolicy, check_metrics, to_delete
from .sinks import leftovers
from .sinks.loops import orphaned
from .steps import StepCommit
from .tiers import Tiers, TierStats, check_tiers
from .units import shown

log = logging.getLogger("asyncckpt")


@functools.cache  # read once: maybe_save runs every training step
def _version() -> str:
    """The installed asyncckpt's version, recorded with each step (the package's ``__init__``
    sits above this layer)."""
    try:
        return importlib.metadata.version("asyncckpt")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


@dataclass
class ManagerStats:
    """What the manager did, and what it did not do and why."""

    saved: list[int] = field(default_factory=list)  # steps committed
    skipped: list[int] = field(default_factory=list)  # steps not saved: a save was pending (skip)
    waited: list[tuple[int, float]] = field(default_factory=list)  # (step, seconds waited for a save)
    deleted: list[int] = field(default_factory=list)  # committed steps no retention rule kept
    cleaned: list[int] = field(default_factory=list)  # uncommitted steps removed: dead owners', failed saves'
    #: uncommitted steps kept, and steps whose commit record is unreadable, and why
    left: list[tuple[int, str]] = field(default_factory=list)
    failed: list[tuple[int, str]] = field(default_factory=list)  # saves or deletes that failed
    abandoned: list[int] = field(default_factory=list)  # saves whose event loop ended before they committed
    preempted: PreemptRecord | None = None  # the save a preemption signal (or save_now) made
    tiers: TierStats | None = None  # a tiered manager's drains, per-tier retention and restore


def _positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {shown(value)}")


def _log_reserve_failure(task: asyncio.Task[int]) -> None:
    # not fatal: the first save makes the area itself, and reports a bad state as its own error
    if not task.cancelled() and task.exception() is not None:
        log.warning("could not make the staging area ahead of the first save: %s", task.exception())


class CheckpointManager:
    """Saves under ``root`` on a :class:`Cadence`, keeps what a :class:`RetentionPolicy` keeps.

    >>> async with CheckpointManager("/nvme/run", every_n_steps=100, keep_last=3) as mgr:
    ...     start = (await mgr.restore(into=state) or 0) + 1
    ...     for step in range(start, steps):
    ...         loss = train_step()
    ...         await mgr.maybe_save(step, state, metrics={"loss": loss})

    ``clock`` (seconds, monotonic) times ``every_seconds``; tests inject their own.
    ``save_on_signal`` (e.g. ``(signal.SIGTERM,)``): the next ``maybe_save`` after such a signal
    saves its step and waits until it is committed within ``preempt_deadline_s`` of the signal,
    then acts as ``on_preempt`` says (:mod:`asyncckpt.preempt`).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        every_n_steps: int | None = None,
        every_seconds: float | None = None,
        continuous: bool = False,
        keep_last: int | None = None,
        keep_every_n_steps: int | None = None,
        best_n: int | None = None,
        best_metric: str | None = None,
        best_mode: BestMode = "min",
        keep_younger_than: float | None = None,
        max_pending_saves: int = 1,
        when_busy: WhenBusy = "wait",
        staging: StagingMode = "host",
        checkpointer: AsyncCheckpointer | None = None,
        raise_on_failure: bool = True,
        clock: Callable[[], float] = time.monotonic,
        save_on_signal: Any = None,
        preempt_deadline_s: float = 30.0,
        on_preempt: OnPreempt = "raise",
        local: str | os.PathLike[str] | None = None,
        keep_local: int | None = None,
        drain_when_busy: DrainWhenBusy | None = None,
        max_queued_drains: int | None = None,
        drain_bandwidth: float | None = None,
        drain_priority: DrainPriority | None = None,
        replicate_to_peer: bool | None = None,
        **options: Any,
    ) -> None:
        if not isinstance(raise_on_failure, bool):
            raise ConfigError(f"raise_on_failure must be True or False, got {raise_on_failure!r}")
        self.cadence = Cadence(every_n_steps, every_seconds, continuous)
        self.retention = RetentionPolicy(
            keep_last, keep_every_n_steps, best_n, best_metric, best_mode, keep_younger_than
        )
        _positive("max_pending_saves", max_pending_saves)
        if not callable(clock):
            raise ConfigError(f"clock must be a callable returning seconds, got {clock!r}")
        self.preempt = Preemption(save_on_signal, preempt_deadline_s, on_preempt)
        self._stop_drains = False  # set by a preemption that ends the run (raise, exit, deadline)
        when_busy = modes.parse("when_busy", when_busy, WhenBusy, fold=False)
        staging = modes.parse("staging", staging, StagingMode, fold=False)
        if checkpointer is not None and options:
            raise ConfigError("pass either checkpointer= or checkpointer options, not both")
        if checkpointer is not None and not isinstance(checkpointer, AsyncCheckpointer):
            raise ConfigError(f"checkpointer must be an AsyncCheckpointer, got {shown(checkpointer)}")
        self.ckpt = checkpointer if checkpointer is not None else AsyncCheckpointer(**options)
        self.root = steps.check_root(root, self.ckpt.storage)  # nothing allocated yet: no I/O
        self.tiers = self._tiers(
            local,
            keep_local,
            drain_when_busy,
            max_queued_drains,
            drain_bandwidth,
            drain_priority,
            replicate_to_peer,
        )
        if self.tiers is not None:  # saves commit on the local tier; the root given is the remote
            self.remote_root, self.root = self.root, self.tiers.local
        self.every_n_steps, self.keep_last = every_n_steps or 1, keep_last
        self.clock = clock
        self._last_start: float | None = None  # the clock when this manager last started a save
        self.max_pending_saves, self.when_busy, self.staging = max_pending_saves, when_busy, staging
        self._own = checkpointer is None
        self.stats = ManagerStats(tiers=None if self.tiers is None else self.tiers.stats)
        self.raise_on_failure = raise_on_failure
        self._unraised: list[Exception] = []  # background failures wait()/aclose() have not raised
        self._coll: Collectives | None = None
        self._pending: list[asyncio.Task[None]] = []
        self._steps: dict[asyncio.Task[None], int] = {}  # the step each pending task saves
        self._deleting: asyncio.Task[None] | None = None
        self._reserving: asyncio.Task[int] | None = None  # the staging area, made ahead of a save
        self._started = False
        self.restored: steps.StepLoad | None = None  # what restore() loaded
        #: restore() was called, or the first save checked the root for later steps
        self._lineage_checked = False

    def _tiers(
        self,
        local: object,
        keep_local: object,
        when_busy: object,
        max_queued: object,
        bandwidth: object,
        priority: object,
        replicate: object,
    ) -> Tiers | None:
        """The local tier under this manager (``local=``), validated before any I/O. Its
        options without it are refused: the run would silently have no local tier."""
        named = {
            "keep_local": keep_local,
            "drain_when_busy": when_busy,
            "max_queued_drains": max_queued,
            "drain_bandwidth": bandwidth,
            "drain_priority": priority,
            "replicate_to_peer": replicate,
        }
        if local is None:
            given = [f"{name}={value!r}" for name, value in named.items() if value is not None]
            if given:
                raise ConfigError(
                    f"{', '.join(given)} set(s) the local tier, but no local= was given: add "
                    "local='/nvme/run' (a local directory) or remove it"
                )
            return None
        keep_local = 2 if keep_local is None else keep_local
        when_busy = "queue" if when_busy is None else when_busy
        max_queued = 1 if max_queued is None else max_queued
        priority = "idle" if priority is None else priority
        replicate = False if replicate is None else replicate
        if not isinstance(replicate, bool):
            raise ConfigError(f"replicate_to_peer must be True or False, got {shown(replicate)}")
        root = check_tiers(self.root, local, keep_local, self.ckpt)
        _positive("max_queued_drains", max_queued)
        return Tiers(
            self.ckpt,
            local=root,
            remote=self.root,
            keep_local=keep_local,  # type: ignore[arg-type]  # checked above
            retention=self.retention,
            when_busy=modes.parse("drain_when_busy", when_busy, DrainWhenBusy, fold=False),
            max_queued=max_queued,  # type: ignore[arg-type]  # checked above
            bandwidth=bandwidth,
            priority=modes.parse("drain_priority", priority, DrainPriority, fold=False),
            replicate=replicate,
        )

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        """Join the job's collectives and clean up a crashed run's steps (rank 0); idempotent.
        ``restore`` and ``maybe_save`` call it."""
        if self._started:
            return
        self._started = True
        self.preempt.arm()
        self._coll = get_collectives()
        if self._coll.world_size > 1 and self.when_busy == "skip":
            # each rank would judge "busy" by its own timing: they could skip different steps
            raise ConfigError(
                f"when_busy='skip' needs one rank; this job has {self._coll.world_size}: use 'wait'"
            )
        if self._coll.world_size > 1 and not self.cadence.per_step:
            # a clock or a pending save is each rank's own: they could save different steps
            raise ConfigError(
                f"every_seconds and continuous need one rank; this job has {self._coll.world_size}: "
                "use every_n_steps"
            )
        if self._coll.is_coordinator:
            await self._clean_uncommitted()
        await self._coll.barrier()  # no rank writes a step while rank 0 may still be cleaning
        await self.preempt.join(self._coll)
        if self.tiers is not None:
            await self.tiers.start(self._coll)

    async def wait(self) -> None:
        """Until every pending save has committed (or failed) and old steps are deleted; then
        raises the first failure of that work not raised yet (unless ``raise_on_failure=False``):
        a loop must not train on believing its checkpoints exist. A save its event loop
        abandoned is reported (``stats.abandoned``), never waited for."""
        while self._still_pending():
            await asyncio.wait(list(self._pending))
        for task in (self._deleting, self._reserving):
            if task is not None and not orphaned(task):
                await asyncio.wait([task])
        if self.tiers is not None:  # a preempted run stops its drains: the next start resumes them
            await (self.tiers.stop() if self._stop_drains else self.tiers.wait())
        failures, self._unraised = self._unraised, []
        if failures and self.raise_on_failure:
            raise failures[0]  # the others are in stats.failed and the log

    def _still_pending(self) -> list[asyncio.Task[None]]:
        """The saves still running, after forgetting those an ended event loop left pending
        (closed without cancelling them): they can never finish, and waiting would hang."""
        for task in [t for t in self._pending if orphaned(t)]:
            self._abandoned(self._steps.get(task, -1))
        self._pending = [t for t in self._pending if not t.done() and not orphaned(t)]
        self._steps = {t: self._steps[t] for t in self._pending}
        return self._pending

    def _abandoned(self, step: int) -> None:
        self.stats.abandoned.append(step)
        log.error(
            "checkpoint of step %d under %s was abandoned before it committed: its event loop ended "
            "first; await mgr.wait() or mgr.aclose() before the loop ends",
            step,
            self.root,
        )

    async def aclose(self) -> None:
        """Wait for pending saves and deletions, then close the checkpointer if it is ours."""
        try:
            await self.wait()
        finally:
            self.preempt.close()
            if self.tiers is not None:
                await self.tiers.aclose()
            if self._coll is not None:
                self._coll.close()
            if self._own:
                await self.ckpt.aclose()

    async def __aenter__(self) -> CheckpointManager:
        self.preempt.arm()  # from here on a preemption signal is recorded, not fatal
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if e is None:
            await self.aclose()
            return
        try:
            await self.aclose()
        except Exception as failure:  # the body's own error is the one to see; ours was logged
            log.debug("not raised over the body's %s: %s", type(e).__name__, failure)

    # -- the loop's calls --------------------------------------------------------------
    async def restore(self, into: Mapping[Any, Any] | None = None, *, as_torch: bool = False) -> int | None:
        """Load the latest committed step (in place with ``into=``); its number, or None."""
        await self.start()
        self._lineage_checked = True  # this run knows what the root holds
        if into is not None:  # the state this run will save: its staging area, made meanwhile
            self._reserve(into)
        if self.tiers is not None:
            assert self._coll is not None
            self.restored = await self.tiers.restore(into, as_torch=as_torch, coll=self._coll)
            return None if self.restored is None else self.restored.step
        latest = await steps.latest_step(self.ckpt, self.root)
        if latest is None:
            return None
        self.restored = await steps.load_step(
            self.ckpt, self.root, latest, into=into, as_torch=as_torch, coll=self._coll
        )
        return latest

    async def steps(self, tier: Tier | None = None) -> list[StepCommit]:
        """The commit record of every committed step under the root, ascending: world size,
        time, objects and ``metadata`` (``metrics``, ``asyncckpt_version``; None for steps
        saved before metadata was recorded). With ``local=``: the steps of both tiers, each
        once (its remote record where it is remote-committed, with ``metadata["tiers"]``),
        or of the ``tier`` named, ``"local"`` or ``"remote"``."""
        if tier is not None:
            tier = modes.parse("tier", tier, Tier, fold=False)
        if self.tiers is None:
            if tier is not None:
                raise ConfigError(f"tier= applies to a manager with local= (a local tier), got tier={tier!r}")
            return await steps.committed_steps(self.ckpt, self.root)
        found: dict[int, StepCommit] = {}
        if tier != "remote":
            found.update((r.step, r) for r in await steps.committed_steps(self.ckpt, self.root))
        if tier != "local":
            found.update((r.step, r) for r in await steps.committed_steps(self.ckpt, self.remote_root))
        return [found[step] for step in sorted(found)]

    async def maybe_save(
        self, step: int, state: Mapping[Any, Any], *, metrics: Mapping[str, float] | None = None
    ) -> bool:
        """Save ``state`` as ``step`` if the cadence says it is due; True if a save was started.
        ``metrics`` (finite numbers by name) are recorded with the step, and ``best_n`` ranks by
        one of them."""
        step = steps.check_step(step)
        facts = {"metrics": check_metrics(metrics), "asyncckpt_version": _version()}
        if self.preempt.enabled:
            await self.start()
            if await self.preempt.agree():  # every rank, every call: they save the same step
                await self.save_now(step, state, metrics=metrics)
                return True
        milestone = self.retention.milestone(step)  # saved whatever the cadence: kept for ever
        if (
            self.cadence.per_step
            and not milestone
            and not self.cadence.due(step, now=0.0, last_start=None, busy=False)
        ):
            self._reserve(state)
            return False
        await self.start()
        busy = bool(self._still_pending())
        if not milestone and not self.cadence.due(
            step, now=self.clock(), last_start=self._last_start, busy=busy
        ):
            self._reserve(state)
            return False
        if len(self._still_pending()) >= self.max_pending_saves:
            if self.when_busy == "skip" and not milestone:
                self.stats.skipped.append(step)
                return False
            t0 = now()
            while len(self._still_pending()) >= self.max_pending_saves:
                await asyncio.wait(self._pending, return_when=asyncio.FIRST_COMPLETED)
            self.stats.waited.append((step, now() - t0))
        await self._check_lineage(step)
        commit = await self._start_step(step, state, facts, self.staging)
        self._track(step, asyncio.create_task(self._finish(step, commit), name=f"asyncckpt-step {step}"))
        return True

    async def _check_lineage(self, step: int) -> None:
        """At the first save of a manager that did not ``restore()``: committed steps after
        ``step`` under the root are an earlier run's, and a restart would restore the newest of
        them, not this run's progress: refused, naming them, before anything is written."""
        if self._lineage_checked:
            return
        self._lineage_checked = True
        shared = self.root if self.tiers is None else self.remote_root  # every rank sees the same
        try:
            found = await steps.step_records(self.ckpt, shared)
        except Exception as exc:  # a remote out: the local tier still saves; a root out: the save says so
            log.debug("could not look for later steps under %s: %s", shared, exc)
            return
        later = [s for s, record in found if isinstance(record, StepCommit) and s > step]
        if later:
            shown_steps = later
            raise ConfigError(
                f"step {step} would be saved under {shared!r}, which holds committed steps "
                f"{shown_steps} of an earlier run: a restart would restore step {shown_steps[-1]}, "
                "not this run's; call restore() first (then saving an earlier step is a rollback), "
                "or use a new root"
            )

    @property
    def preempted(self) -> bool:
        """A preemption signal arrived (on any rank, as far as ``maybe_save`` has learnt): the
        loop should stop after this step."""
        return self.preempt.signum is not None

    async def wait_preempted(self) -> None:
        """Return once a preemption signal reached this process (its handler ran on the event
        loop): for a loop that wants to stop its step early; ``maybe_save`` saves either way."""
        await self.preempt.noted.wait()

    async def save_now(
        self, step: int, state: Mapping[Any, Any], *, metrics: Mapping[str, float] | None = None
    ) -> PreemptRecord:
        """Save ``step`` now, out of cadence, and wait until it is committed within the deadline,
        then act as ``on_preempt`` says (as after a signal; every rank must call it at the same
        step). The record is also ``stats.preempted``; a missed deadline raises
        :class:`PreemptDeadlineError` whatever ``on_preempt`` says."""
        step = steps.check_step(step)
        facts = {"metrics": check_metrics(metrics), "asyncckpt_version": _version()}
        await self.start()

        async def job(object_durable: Callable[[], None]) -> None:
            commit = await self._start_step(step, facts=facts, state=state, staging="none")
            object_durable()  # staging "none": this rank's object is durable on return
            await self._finish(step, commit, reraise=True)

        def latest() -> int | None:
            return max(self.stats.saved, default=None)

        await self._check_lineage(step)
        self._last_start = self.clock()
        try:
            record = await self.preempt.save(
                step, job, lambda task: self._track(step, task, late=True), latest
            )
            if self.tiers is not None:  # the deadline's rest for the drain: say where the step got
                tier = await self.tiers.reached(step, self.preempt.remaining())
                record = self.preempt.record = dataclasses.replace(record, tier=tier)
        except BaseException:
            self._stop_drains = True  # a run that is ending: its close must not wait for drains
            raise
        finally:
            self.stats.preempted = self.preempt.record
        outcome = self.preempt.outcome(record)
        self._stop_drains = outcome is not None
        if isinstance(outcome, SystemExit):
            await self.aclose()
        if outcome is not None:
            raise outcome
        return record

    async def _start_step(
        self, step: int, state: Mapping[Any, Any], facts: dict[str, Any], staging: StagingMode
    ) -> asyncio.Task[StepCommit]:
        assert self._coll is not None
        if self.tiers is not None:
            await self.tiers.before_save(step)
        previous = self._pending[-1] if self._pending else None
        self._last_start = self.clock()
        try:
            return await steps.start_step(
                self.ckpt,
                self.root,
                step,
                state,
                staging=staging,
                coll=self._coll,
                after=previous,
                metadata=facts,
            )
        except Exception as exc:  # raised to the caller here: recorded, not raised again by wait()
            self.stats.failed.append((step, f"save: {exc}"))
            await self._clean_failed(step, exc)
            await self._make_room(step, exc)
            raise

    def _track(self, step: int, task: asyncio.Task[None], *, late: bool = False) -> None:
        """A save to wait for at ``wait()``; ``late``: a preemption save past its deadline, whose
        failure nobody awaits any more, so ``wait()`` raises it."""
        self._pending.append(task)
        self._steps[task] = step
        if late:
            task.add_done_callback(self._late_failure)

    def _late_failure(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and isinstance(task.exception(), Exception):
            self._unraised.append(task.exception())  # type: ignore[arg-type]

    # -- background work ---------------------------------------------------------------
    def _reserve(self, state: Mapping[Any, Any]) -> None:
        """Once, ahead of the first staged save: its staging area, allocated and faulted in the
        background, so that save blocks the loop no longer than the ones after it."""
        if self.staging != "host" or self._reserving is not None:
            return
        self._reserving = asyncio.create_task(self.ckpt.reserve_staging(state), name="asyncckpt-reserve")
        self._reserving.add_done_callback(_log_reserve_failure)

    async def _finish(self, step: int, commit: asyncio.Task[StepCommit], *, reraise: bool = False) -> None:
        try:
            await commit
        except asyncio.CancelledError:  # only the end of its event loop cancels it
            self._abandoned(step)
            raise
        except Exception as exc:
            self.stats.failed.append((step, f"save: {exc}"))
            if not reraise:
                self._unraised.append(exc)
            log.error("checkpoint of step %d failed: %s", step, exc)
            await self._clean_failed(step, exc)
            await self._make_room(step, exc)
            if reraise:
                raise
            return
        self.stats.saved.append(step)
        assert self._coll is not None
        if self.tiers is not None:  # the drain; retention per tier follows each commit
            try:
                await self.tiers.committed(await commit)
            except Exception as exc:
                self.stats.failed.append((step, f"tiers: {exc}"))
                self._unraised.append(exc)
                log.error("step %d committed locally; starting its drain failed: %s", step, exc)
            return
        if self.retention.active and self._coll.is_coordinator:
            previous = self._deleting
            self._deleting = asyncio.create_task(self._prune(step, previous))

    async def _make_room(self, step: int, cause: Exception) -> None:
        """A full local tier: un-drained steps beyond ``keep_local`` give way (tiers say so)."""
        if self.tiers is None or not isinstance(cause, NoSpaceError):
            return
        try:
            await self.tiers.make_room(step, cause)
        except Exception as exc:
            log.warning("could not make room on the local tier after step %d: %s", step, exc)

    async def _prune(self, just_committed: int, previous: asyncio.Task[None] | None) -> None:
        if previous is not None:
            await asyncio.wait([previous])
        try:
            found = await steps.step_records(self.ckpt, self.root)
        except Exception as exc:  # no step deleted blind; wait() raises it, as a failed delete
            self.stats.failed.append((just_committed, f"retention: could not list {self.root}: {exc}"))
            self._unraised.append(exc)
            log.warning("retention after step %d could not list %s: %s", just_committed, self.root, exc)
            return
        for step, damaged in found:  # kept: retention cannot judge it, and it may be all someone has
            if isinstance(damaged, IntegrityError):
                self._unreadable(step, damaged)
        records = [r for _, r in found if isinstance(r, StepCommit) and r.step <= just_committed]
        for old in to_delete(self.retention, records, time.time()):
            try:
                await steps.delete_step(self.ckpt, self.root, old)
            except Exception as exc:
                self.stats.failed.append((old, f"delete: {exc}"))
                self._unraised.append(exc)
                log.warning("could not delete old step %d: %s", old, exc)
            else:
                self.stats.deleted.append(old)

    async def _clean_failed(self, step: int, cause: Exception) -> None:
        """Remove what a failed save of ``step`` left (its ``OWNER.json``, objects of ranks that
        did save) now, not when a later run starts; rank 0, the owner, does it. After a failed
        collective another rank may still be writing into the step: left to the owner rule."""
        assert self._coll is not None
        if not self._coll.is_coordinator:
            return
        if isinstance(cause, CollectiveError):
            self.stats.left.append((step, f"its save failed in a collective: {cause}"))
            return
        try:
            if step not in await steps.steps_under(self.ckpt, self.root):
                return  # nothing of it was made (its directory could not be created)
            if await steps.read_commit(self.ckpt, self.root, step) is not None:
                return  # committed after all (a later barrier failed): a loadable step
            await steps.delete_step(self.ckpt, self.root, step)
        except Exception as exc:
            self.stats.left.append((step, f"could not remove it after its failed save: {exc}"))
            log.warning("could not remove step %d after its failed save: %s", step, exc)
        else:
            self.stats.cleaned.append(step)

    def _unreadable(self, step: int, exc: IntegrityError) -> None:
        """A step whose commit record cannot be read: kept, listed in ``stats.left`` once."""
        why = f"commit record unreadable, kept: {exc}"
        if (step, why) not in self.stats.left:
            self.stats.left.append((step, why))
            log.warning("step %d under %s: %s", step, self.root, why)

    async def _clean_uncommitted(self) -> None:
        for step, record in await steps.step_records(self.ckpt, self.root):
            if isinstance(record, IntegrityError):
                self._unreadable(step, record)
                continue
            if record is not None:
                continue
            owner = await steps.owner_of(self.ckpt, self.root, step)
            if owner is None:
                self.stats.left.append((step, "owner unrecorded"))
                continue
            state = owner.state()
            if state != "dead":
                why = "its owner is running" if state == "alive" else f"owner pid {owner.pid} on {owner.host}"
                self.stats.left.append((step, f"{why}: not provably dead"))
                continue
            base = steps.step_uri(self.root, step)
            if self.ckpt.storage.backend_of(
                base
            ).has_directories:  # dead ranks' temporaries, by the owner rule
                found = await leftovers.find(base)
                await leftovers.remove(found, base)
            try:
                await steps.delete_step(self.ckpt, self.root, step)
            except Exception as exc:
                self.stats.left.append((step, f"delete failed: {exc}"))
            else:
                self.stats.cleaned.append(step)

"""Save on a preemption signal: record it in the handler, save at the next step, within a deadline.

A scheduler that preempts a job sends SIGTERM and kills it for good a grace period later. The
handler (Python's, which runs even while the loop is inside a synchronous step) only records
the signal (its number and time: no I/O, nothing else), because the state
is consistent only between training steps: the training loop's next
``CheckpointManager.maybe_save`` sees the record, saves that step out of cadence and waits until
it is committed, within ``deadline_s`` counted from the signal. Ranks agree first: with several
ranks each ``maybe_save`` all-gathers the flag (one small collective per call, only when
``save_on_signal`` is set, over a second channel of the transport so that it never interleaves
with a background commit's collectives), so a signal that reached one rank makes every rank save
the same step.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any

from . import modes
from .engine.monitor import now
from .errors import ConfigError, PreemptDeadlineError, PreemptedError
from .modes import OnPreempt
from .node.collectives import Collectives
from .units import finite, shown

#: what a process cannot catch: no handler would ever run
UNCATCHABLE = frozenset({signal.SIGKILL, signal.SIGSTOP})


def _awake() -> None:
    """The event loop's handler: nothing to do but to have woken the loop."""


def check_signals(value: object) -> tuple[signal.Signals, ...]:
    """``save_on_signal`` as signals: one signal or an iterable of them; ConfigError names a bad one."""
    if value is None:
        return ()
    items = (value,) if isinstance(value, int) else value
    if isinstance(items, (str, bytes)) or not isinstance(items, Iterable):
        raise ConfigError(f"save_on_signal must be a signal or a tuple of signals, got {value!r}")
    found: list[signal.Signals] = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, int):
            raise ConfigError(f"save_on_signal: {item!r} is not a signal (use e.g. signal.SIGTERM)")
        try:
            sig = signal.Signals(item)
        except ValueError:
            raise ConfigError(f"save_on_signal: {item!r} is not a signal number on this system") from None
        if sig in UNCATCHABLE:
            raise ConfigError(f"save_on_signal: {sig.name} cannot be caught, so nothing could save on it")
        found.append(sig)
    return tuple(dict.fromkeys(found))


def check_deadline(value: object) -> float:
    number = finite(value)
    if number is None or number <= 0:
        raise ConfigError(f"preempt_deadline_s must be a positive number of seconds, got {shown(value)}")
    return number


@dataclass(frozen=True)
class PreemptRecord:
    """One preemption save, as ``mgr.stats.preempted`` records it."""

    signal: str | None  # "SIGTERM"; None: save_now on demand
    source: str  # "signal" (this rank got it), "peer" (another rank did), "on demand"
    signal_at: float  # seconds since the epoch: when the signal arrived (or save_now was called)
    step: int
    deadline_s: float
    object_durable_s: float | None  # from the signal until this rank's object was durable
    committed_s: float | None  # from the signal until every rank's object was and the step committed
    deadline_met: bool
    #: tiered managers: where the step was when the deadline's time ran out or its drain ended:
    #: "remote" (remote-committed), "drained" (this rank's object remote, the commit rank 0's) or
    #: "local" (committed on the local tier only; drained at the next start); None untiered
    tier: str | None = None


class Preemption:
    """The signal flag of one manager, its handlers, its agreement channel and its deadline."""

    def __init__(self, signals: object, deadline_s: object, on_preempt: object) -> None:
        self.signals = check_signals(signals)
        self.deadline_s = check_deadline(deadline_s)
        self.on_preempt: OnPreempt = modes.parse("on_preempt", on_preempt, OnPreempt, fold=False)
        self.signum: int | None = None  # the signal that preempted this run (stays set)
        self.pending = False  # recorded, not saved yet
        self._at = (0.0, 0.0)  # (monotonic, epoch) of the signal
        self._source = ""
        self._current = 0
        self._installed: list[tuple[signal.Signals, Any]] = []  # (signal, previous Python handler)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._coll: Collectives | None = None
        self.record: PreemptRecord | None = None  # the last preemption save, deadline met or not
        self.noted = asyncio.Event()  # set by the first signal: for a loop that waits on it

    @property
    def enabled(self) -> bool:
        return bool(self.signals)

    # -- the handler: record, nothing else ----------------------------------------------------
    def note(self, signum: int, source: str = "signal", *, wake: bool = True) -> None:
        """Remember the first signal (``signum`` 0: ``save_now`` on demand, no signal);
        ``wake=False``: from the signal handler, which leaves :attr:`noted` to the loop."""
        if not self.pending:
            self.signum, self.pending, self._source = signum or self.signum, True, source
            self._current = signum  # the one this save answers
            self._at = (now(), time.time())
            if source == "signal" and wake:
                self.noted.set()

    def _caught(self, signum: int, frame: object) -> None:
        """The Python-level handler. Python runs it on the main thread between two bytecodes,
        also while the loop is inside a synchronous step, so the flag is set before the next
        ``maybe_save`` (an event-loop handler would run only once the loop runs again, and that
        ``maybe_save``, awaiting nothing, would pass the signal by)."""
        self.note(signum, wake=False)
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self.noted.set)  # what a loop does from a handler

    def arm(self) -> None:
        """Install the handlers on the running loop (main thread only); idempotent."""
        if not self.enabled or self._installed:
            return
        if threading.current_thread() is not threading.main_thread():
            raise ConfigError(
                "save_on_signal: signal handlers can only be installed from the main thread; this "
                f"manager runs on thread {threading.current_thread().name!r}"
            )
        loop = asyncio.get_running_loop()
        self._loop = loop
        for sig in self.signals:
            previous = signal.getsignal(sig)
            with contextlib.suppress(NotImplementedError, RuntimeError):  # a loop without signals
                # the loop's own handler only wakes it (its wakeup fd): a signal that arrives
                # while it waits in select is then seen at once; the flag is set by ours
                loop.add_signal_handler(sig, _awake)
            signal.signal(sig, self._caught)
            self._installed.append((sig, previous))

    def disarm(self) -> None:
        """Put back the handlers found at :meth:`arm`."""
        installed, self._installed = self._installed, []
        for sig, previous in installed:
            if self._loop is not None and not self._loop.is_closed():
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    self._loop.remove_signal_handler(sig)
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._loop = None

    # -- agreement between ranks ------------------------------------------------------------
    async def join(self, coll: Collectives) -> None:
        """Open the side channel the flags travel on (collective: at the manager's start)."""
        if self.enabled and coll.world_size > 1 and self._coll is None:
            self._coll = await coll.duplicate()

    async def agree(self) -> bool:
        """True on every rank if any rank has a signal recorded and not yet saved on."""
        if self._coll is None:
            return self.pending
        flags = await self._coll.all_gather_object(self._current if self.pending else 0)
        raised = [f for f in flags if f]
        if raised and not self.pending:
            self.note(max(raised), source="peer")
        return bool(raised)

    def close(self) -> None:
        self.disarm()
        if self._coll is not None:
            self._coll.close()
            self._coll = None

    # -- the save and what follows it ---------------------------------------------------------
    async def save(
        self,
        step: int,
        job: Callable[[Callable[[], None]], Coroutine[Any, Any, None]],
        track: Callable[[asyncio.Task[None]], None],
        latest: Callable[[], int | None],
    ) -> PreemptRecord:
        """Run ``job(object_durable)`` (this rank's object, then the step's commit) until it
        finishes or the deadline passes; the record, or PreemptDeadlineError saying what was
        durable. A job still running at the deadline is handed to ``track`` (the manager waits
        for it at ``aclose``): nothing is cancelled half-written."""
        if not self.pending:
            self.note(0, source="on demand")
        start, wall = self._at
        marks: dict[str, float] = {}

        def object_durable() -> None:
            marks.setdefault("object", now() - start)

        task = asyncio.create_task(job(object_durable), name=f"asyncckpt-preempt {step}")
        done, _ = await asyncio.wait([task], timeout=max(0.0, self.deadline_s - (now() - start)))
        self.pending = False
        if done:
            task.result()  # the save's own failure, raised as it is
            marks["committed"] = now() - start
        else:
            track(task)
        name = signal.Signals(self._current).name if self._current else None
        durable, committed = marks.get("object"), marks.get("committed")
        record = PreemptRecord(
            name, self._source, wall, step, self.deadline_s, durable, committed, bool(done)
        )
        self.record = record
        if not done:
            message = self._missed(record, latest())
            raise PreemptDeadlineError(message, step=step, signum=self._current or None)
        return record

    def remaining(self) -> float:
        """Seconds left of the current preemption's deadline (negative once it passed)."""
        return self.deadline_s - (now() - self._at[0])

    def _missed(self, record: PreemptRecord, latest: int | None) -> str:
        obj = "durable" if record.object_durable_s is not None else "not durable yet"
        return (
            f"preemption save of step {record.step} missed its {record.deadline_s:g} s deadline "
            f"(from {record.signal or 'save_now'}): this rank's object {obj}, the step not committed "
            f"(still being saved); latest step this run committed: {'none' if latest is None else latest}"
        )

    def outcome(self, record: PreemptRecord) -> SystemExit | PreemptedError | None:
        """What to raise once the step is committed: nothing ("continue"), PreemptedError, or
        SystemExit (128 + the signal number, 0 on demand; the caller closes the manager first)."""
        if self.on_preempt == "continue":
            return None
        if self.on_preempt == "exit":
            return SystemExit(128 + self._current if self._current else 0)
        why = record.signal or "save_now"
        return PreemptedError(
            f"preempted by {why}: step {record.step} committed {record.committed_s:.3f} s after it",
            step=record.step,
            signum=self._current or None,
        )

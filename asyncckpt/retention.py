"""What a :class:`~asyncckpt.CheckpointManager` saves and keeps, as plain values and pure functions.

Modelled on Orbax's ``CheckpointManagerOptions`` (``max_to_keep``, ``keep_period``,
``best_fn``/``best_mode``, ``keep_time_interval``; ``save_interval_steps``, continuous saving).
Kept apart from the manager and from storage so every decision is testable without I/O:
steps and their records in, the steps to delete out. It sits beside ``steps`` (layer 10)
and names what it reads of a commit record as a protocol, so it imports nothing of the package
but its errors and modes.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from . import modes
from .errors import ConfigError
from .modes import BestMode
from .units import finite, shown


def _positive_int(name: str, value: object) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")


def _positive_seconds(name: str, value: object) -> None:
    if value is None:
        return
    number = finite(value)
    if number is None or number <= 0:
        raise ConfigError(f"{name} must be a positive number of seconds, got {shown(value)}")


def check_metrics(metrics: object) -> dict[str, float]:
    """``metrics`` as a JSON-safe dict; ConfigError naming the bad key (numbers only, finite)."""
    if metrics is None:
        return {}
    if not isinstance(metrics, Mapping):
        raise ConfigError(f"metrics must be a mapping of names to numbers, got {metrics!r}")
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if not isinstance(key, str) or not key:
            raise ConfigError(f"metrics keys must be non-empty strings, got {key!r}")
        number = _number(value)
        if number is None:
            raise ConfigError(f"metric {key!r} must be a number, got {value!r}")
        if finite(number) is None:  # JSON has no NaN or infinity; 10**400 is no float
            raise ConfigError(f"metric {key!r} must be finite, got {shown(value)}")
        out[key] = number
    return out


def _number(value: object) -> float | None:
    """A metric as a JSON number: Python's ints and floats, and what a training loop has at
    hand, a NumPy scalar or a 0-d array or tensor (no ``loss.item()`` needed)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, numbers.Integral):  # NumPy's integers, before the reals they are too
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if getattr(value, "shape", None) == () and callable(item := getattr(value, "item", None)):
        got = item()
        return None if isinstance(got, bool) or not isinstance(got, (int, float)) else got
    return None


@dataclass(frozen=True)
class Cadence:
    """When ``maybe_save`` saves: every N steps (the default, N=1), every N seconds, or
    continuously (whenever no save is pending). One of them; the others stay unset."""

    every_n_steps: int | None = None
    every_seconds: float | None = None
    continuous: bool = False

    def __post_init__(self) -> None:
        _positive_int("every_n_steps", self.every_n_steps)
        _positive_seconds("every_seconds", self.every_seconds)
        if not isinstance(self.continuous, bool):
            raise ConfigError(f"continuous must be True or False, got {self.continuous!r}")
        given = [
            f"{name}={value!r}"
            for name, value in (
                ("every_n_steps", self.every_n_steps),
                ("every_seconds", self.every_seconds),
                ("continuous", self.continuous or None),
            )
            if value is not None
        ]
        if len(given) > 1:
            raise ConfigError(f"choose one cadence, got {' and '.join(given)}")

    @property
    def per_step(self) -> bool:
        """Due by step number alone, so every rank agrees without talking."""
        return self.every_seconds is None and not self.continuous

    def due(self, step: int, *, now: float, last_start: float | None, busy: bool) -> bool:
        """Whether ``step`` should be saved. ``last_start``: the clock when this manager last
        started a save (None: never); ``busy``: a save is still pending."""
        if self.continuous:
            return not busy
        if self.every_seconds is not None:
            return last_start is None or now - last_start >= self.every_seconds
        return step % (self.every_n_steps or 1) == 0


@dataclass(frozen=True)
class RetentionPolicy:
    """Which committed steps stay. Policies combine: a step is deleted only when none keeps it,
    and the newest committed step is always kept (it is what a restart resumes from). With no
    policy set, nothing is deleted.

    - ``keep_last``: the N newest committed steps.
    - ``keep_every_n_steps``: milestones, steps divisible by N, kept forever (and saved by the
      manager whatever its cadence).
    - ``best_n`` of ``best_metric``, lowest (``best_mode="min"``) or highest (``"max"``) first;
      ties go to the newer step. A step saved without that metric is never among the best.
    - ``keep_younger_than``: steps committed less than this many seconds ago.
    """

    keep_last: int | None = None
    keep_every_n_steps: int | None = None
    best_n: int | None = None
    best_metric: str | None = None
    best_mode: BestMode = "min"
    keep_younger_than: float | None = None

    def __post_init__(self) -> None:
        _positive_int("keep_last", self.keep_last)
        _positive_int("keep_every_n_steps", self.keep_every_n_steps)
        _positive_int("best_n", self.best_n)
        _positive_seconds("keep_younger_than", self.keep_younger_than)
        modes.parse("best_mode", self.best_mode, BestMode, fold=False)
        if self.best_metric is not None and (not isinstance(self.best_metric, str) or not self.best_metric):
            raise ConfigError(f"best_metric must be a metric name, got {self.best_metric!r}")
        if (self.best_n is None) != (self.best_metric is None):
            raise ConfigError(
                f"best_n and best_metric go together, got best_n={self.best_n!r}, "
                f"best_metric={self.best_metric!r}"
            )

    def milestone(self, step: int) -> bool:
        """Whether ``step`` is one ``keep_every_n_steps`` keeps: the manager saves it even off
        its cadence (``every_n_steps=300, keep_every_n_steps=1000`` saves 1000, 2000, ...),
        since a milestone never saved is one the policy cannot keep."""
        return self.keep_every_n_steps is not None and step % self.keep_every_n_steps == 0

    @property
    def active(self) -> bool:
        """Whether any policy is set (otherwise the manager deletes nothing)."""
        rules = (self.keep_last, self.keep_every_n_steps, self.best_n, self.keep_younger_than)
        return any(v is not None for v in rules)


class StepRecord(Protocol):
    """What retention reads of a commit record (:class:`asyncckpt.steps.StepCommit` is one)."""

    @property
    def step(self) -> int: ...

    @property
    def committed_at(self) -> float: ...

    @property
    def metadata(self) -> Mapping[str, Any] | None: ...


def metric_of(record: StepRecord, name: str) -> float | None:
    """The step's recorded metric ``name``, or None when it was saved without it."""
    metrics = (record.metadata or {}).get("metrics")
    return finite(metrics.get(name) if isinstance(metrics, Mapping) else None)


def _best(policy: RetentionPolicy, records: Sequence[StepRecord]) -> Iterable[int]:
    assert policy.best_n is not None and policy.best_metric is not None
    scored = [(v, r.step) for r in records if (v := metric_of(r, policy.best_metric)) is not None]
    sign = 1 if policy.best_mode == "min" else -1
    scored.sort(key=lambda vs: (sign * vs[0], -vs[1]))  # best first; a tie to the newer step
    return [s for _, s in scored[: policy.best_n]]


def kept(policy: RetentionPolicy, records: Sequence[StepRecord], now: float) -> dict[int, list[str]]:
    """Each step some rule keeps, with the rules that keep it (``now``: seconds since the epoch)."""
    ordered = sorted(records, key=lambda r: r.step)
    why: dict[int, list[str]] = {}

    def keep(step: int, rule: str) -> None:
        why.setdefault(step, []).append(rule)

    if ordered:
        keep(ordered[-1].step, "newest")
    if policy.keep_last is not None:
        for r in ordered[-policy.keep_last :]:
            keep(r.step, "keep_last")
    if policy.keep_every_n_steps is not None:
        for r in ordered:
            if r.step % policy.keep_every_n_steps == 0:
                keep(r.step, "keep_every_n_steps")
    if policy.best_n is not None:
        for step in _best(policy, ordered):
            keep(step, "best_n")
    if policy.keep_younger_than is not None:
        for r in ordered:
            if now - r.committed_at < policy.keep_younger_than:
                keep(r.step, "keep_younger_than")
    return why


def to_delete(policy: RetentionPolicy, records: Sequence[StepRecord], now: float) -> list[int]:
    """The committed steps no rule keeps, oldest first; none when no policy is set."""
    if not policy.active:
        return []
    keep = kept(policy, records, now)
    return sorted(r.step for r in records if r.step not in keep)

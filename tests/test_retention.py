"""Manager policies as pure functions: which steps stay, by rule, and which settings are refused."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch

from asyncckpt.errors import ConfigError
from asyncckpt.retention import Cadence, RetentionPolicy, check_metrics, kept, to_delete

T0 = 1_700_000_000.0


@dataclass(frozen=True)
class Record:
    step: int
    committed_at: float
    metadata: Mapping[str, Any] | None = field(default=None)


def loss(step: int) -> float | None:
    """Distinct values; 71 (the lowest) and multiples of 7 are saved without the metric."""
    return None if step == 71 or step % 7 == 0 else (step * 37 % 101) / 10


def record(step: int) -> Record:
    value = loss(step)
    return Record(step, T0 + 10 * step, {"metrics": {} if value is None else {"loss": value}})


def test_a_100_step_run_with_mixed_policies_keeps_exactly_what_some_rule_keeps() -> None:
    policy = RetentionPolicy(
        keep_last=2, keep_every_n_steps=25, best_n=2, best_metric="loss", keep_younger_than=45
    )
    alive: list[Record] = []
    for step in range(1, 101):  # as the manager does: prune after each commit, at that time
        alive.append(record(step))
        gone = set(to_delete(policy, alive, now=T0 + 10 * step))
        assert step not in gone
        alive = [r for r in alive if r.step not in gone]
    final = set(to_delete(policy, alive, now=T0 + 1005))
    alive = [r for r in alive if r.step not in final]
    why = kept(policy, alive, now=T0 + 1005)
    assert sorted(why) == [11, 25, 41, 50, 75, 97, 98, 99, 100]
    by_rule = {rule: sorted(s for s, rules in why.items() if rule in rules) for rule in
               ("keep_last", "keep_every_n_steps", "best_n", "keep_younger_than", "newest")}  # fmt: skip
    assert by_rule == {
        "keep_last": [99, 100],
        "keep_every_n_steps": [25, 50, 75, 100],
        "best_n": [11, 41],  # losses 0.3 and 0.2; step 71 (0.1 if measured) has no loss: not best
        "keep_younger_than": [97, 98, 99, 100],  # committed less than 45 s before now
        "newest": [100],
    }


def test_best_n_max_mode_and_ties_go_to_the_newer_step() -> None:
    values = {1: 0.5, 2: 0.9, 3: 0.9, 4: 0.1, 5: 0.2}
    records = [Record(s, T0 + s, {"metrics": {"acc": v}}) for s, v in values.items()]
    records.append(Record(6, T0 + 6, None))  # an old record without metadata: readable, never best
    policy = RetentionPolicy(best_n=2, best_metric="acc", best_mode="max")
    assert to_delete(policy, records, now=T0 + 10) == [1, 4, 5]  # 2 and 3 best; 6 the newest
    one = RetentionPolicy(best_n=1, best_metric="acc", best_mode="max")
    assert to_delete(one, records, now=T0 + 10) == [1, 2, 4, 5]  # 2 and 3 tie: 3 is newer
    assert to_delete(RetentionPolicy(best_n=1, best_metric="acc"), records, now=T0) == [1, 2, 3, 5]


def test_the_only_or_newest_committed_step_is_never_deleted() -> None:
    only = [Record(7, T0, {"metrics": {}})]
    assert to_delete(RetentionPolicy(best_n=1, best_metric="loss"), only, now=T0 + 1e6) == []
    assert to_delete(RetentionPolicy(keep_younger_than=1), only, now=T0 + 1e6) == []
    two = [Record(1, T0, {"metrics": {"loss": 0.1}}), Record(2, T0, {"metrics": {"loss": 9.0}})]
    assert to_delete(RetentionPolicy(best_n=1, best_metric="loss"), two, now=T0) == []


def test_no_policy_deletes_nothing() -> None:
    assert to_delete(RetentionPolicy(), [record(s) for s in range(1, 10)], now=T0 + 1e6) == []


def test_cadences() -> None:
    assert [s for s in range(10) if Cadence().due(s, now=0, last_start=None, busy=True)] == list(range(10))
    by_step = Cadence(every_n_steps=4)
    assert [s for s in range(10) if by_step.due(s, now=0, last_start=0, busy=True)] == [0, 4, 8]
    timed = Cadence(every_seconds=60)
    assert timed.due(5, now=100.0, last_start=None, busy=False)
    assert not timed.due(6, now=159.9, last_start=100.0, busy=False)
    assert timed.due(7, now=160.0, last_start=100.0, busy=False)
    assert Cadence(continuous=True).due(3, now=0, last_start=0, busy=False)
    assert not Cadence(continuous=True).due(4, now=0, last_start=0, busy=True)
    assert Cadence().per_step and not timed.per_step and not Cadence(continuous=True).per_step


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"keep_last": 0}, "keep_last must be a positive integer, got 0"),
        ({"keep_every_n_steps": 2.5}, "keep_every_n_steps must be a positive integer, got 2.5"),
        ({"best_n": True, "best_metric": "loss"}, "best_n must be a positive integer, got True"),
        ({"best_n": 2}, "best_n and best_metric go together"),
        ({"best_metric": "loss"}, "best_n and best_metric go together"),
        ({"best_n": 1, "best_metric": ""}, "best_metric must be a metric name, got ''"),
        ({"best_n": 1, "best_metric": "loss", "best_mode": "lowest"},
         "best_mode must be one of min, max, got 'lowest'"),
        ({"keep_younger_than": -1}, "keep_younger_than must be a positive number of seconds, got -1"),
        ({"keep_younger_than": math.inf}, "keep_younger_than must be a positive number of seconds, got inf"),
    ],
)  # fmt: skip
def test_bad_retention_settings_name_the_value(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        RetentionPolicy(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"every_n_steps": 0}, "every_n_steps must be a positive integer, got 0"),
        ({"every_seconds": "60"}, "every_seconds must be a positive number of seconds, got '60'"),
        ({"every_seconds": math.nan}, "every_seconds must be a positive number of seconds, got nan"),
        ({"continuous": 1}, "continuous must be True or False, got 1"),
        ({"every_n_steps": 10, "every_seconds": 60},
         "choose one cadence, got every_n_steps=10 and every_seconds=60"),
        ({"every_seconds": 60, "continuous": True},
         "choose one cadence, got every_seconds=60 and continuous=True"),
    ],
)  # fmt: skip
def test_conflicting_or_bad_cadences_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Cadence(**kwargs)


def test_metrics_as_a_training_loop_has_them_are_numbers() -> None:
    """A NumPy scalar or a 0-d tensor (the loss itself) was refused: "must be a number"."""
    got = check_metrics(
        {"loss": np.float32(0.5), "step": np.int64(7), "acc": torch.tensor(0.25), "n": np.array(3)}
    )
    assert got == {"loss": 0.5, "step": 7, "acc": 0.25, "n": 3}
    assert all(type(v) in (int, float) for v in got.values())  # JSON-safe, as a record holds them


@pytest.mark.parametrize(
    ("metrics", "message"),
    [
        ({"loss": math.nan}, "metric 'loss' must be finite, got nan"),
        ({"loss": -math.inf}, "metric 'loss' must be finite, got -inf"),
        ({"loss": "0.5"}, "metric 'loss' must be a number, got '0.5'"),
        ({"ok": True}, "metric 'ok' must be a number, got True"),
        ({"ok": np.bool_(True)}, "metric 'ok' must be a number"),
        ({"loss": np.float32("nan")}, "metric 'loss' must be finite"),
        ({"loss": np.zeros(2)}, "metric 'loss' must be a number"),
        ({3: 1.0}, "metrics keys must be non-empty strings, got 3"),
        ([("loss", 1.0)], "metrics must be a mapping"),
    ],
)
def test_bad_metrics_name_the_key(metrics: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        check_metrics(metrics)
    assert check_metrics({"loss": 1, "acc": 0.5}) == {"loss": 1, "acc": 0.5}

"""Where this process runs: usable CPUs, MPI ranks on this node, generator thread budget.

The seed bug of this project: dividing the node's CPUs by the *global* MPI world size
(192 CPUs / 64 ranks = 3 threads) starves generation on multi-node runs. The divisor must be
the number of ranks sharing *this node*.

Two rules size the budget from that share (:data:`asyncckpt.modes.ThreadBudgetRule`):
``"mlperf"`` gives the generator the whole share (usable CPUs ÷ ranks, the rule MLPerf-style
measurements use, and the bench CLI's); ``"leave_loop_core"`` keeps one core of it for the
rank's event loop (share − 1, at least 1), the library default: a generator on every core makes
the loop thread wait for a CPU, and a training loop sharing the event loop feels that lag.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import NamedTuple

from .. import modes
from ..env import environ
from . import launcher

#: Environment variables naming the ranks on this node, first present wins (then Slurm's
#: compressed task list); the launcher module documents the precedence
LOCAL_SIZE_VARS = launcher.LOCAL_SIZE_VARS
LOCAL_RANK_VARS = launcher.LOCAL_RANK_VARS
RANK_VARS = tuple(r for r, _ in launcher.MPI_PAIRS)
SIZE_VARS = tuple(s for _, s in launcher.MPI_PAIRS)


#: ranks on this node as measured by the MPI library (set by :mod:`asyncckpt.node.distributed`);
#: preferred over environment variables, which not every launcher sets
_measured_local: tuple[int, str] | None = None
#: of those, how many share this process's CPU set (the launcher may have bound ranks)
_cpu_sharers: int | None = None


def set_local_ranks(count: int | None, source: str = "mpi4py", sharers: int | None = None) -> None:
    """Record the node-local rank count measured by MPI (``None`` forgets it).

    ``sharers``: node-local ranks whose CPU affinity overlaps this one's. mpirun binds ranks
    (to a core, or for more ranks to a socket/NUMA node), and then the affinity mask is
    already this rank's share: dividing it by *all* ranks on the node would undercount just
    like the seed bug. Unbound, every rank shares every CPU and ``sharers == count``.
    """
    global _measured_local, _cpu_sharers
    if count is not None and count < 1:
        raise ValueError(f"local rank count must be >= 1, got {count}")
    if sharers is not None and not 1 <= sharers <= (count or 1):
        raise ValueError(f"CPU sharers must be in 1..{count}, got {sharers}")
    _measured_local = None if count is None else (count, source)
    _cpu_sharers = None if count is None else sharers


def cpu_sharers(mine: frozenset[int], masks: list[frozenset[int]]) -> int:
    """How many of the node's ranks (``masks``, including this one) overlap CPU set ``mine``."""
    return max(1, sum(1 for m in masks if m & mine))


class ThreadBudget(NamedTuple):
    """How many generator threads to use and how that number was reached."""

    threads: int
    usable_cpus: int
    local_ranks: int
    local_ranks_source: str  # the variable it came from, or "default"
    overridden: bool
    rule: modes.ThreadBudgetRule = "mlperf"  # how ``threads`` was sized (unless overridden)
    share: int = 0  # this rank's whole CPU share (0: not known, e.g. an override)

    @property
    def blocked_threads(self) -> int:
        """Threads for work the caller waits on (the host staging copy): the whole CPU share,
        since the loop's core has nothing to do but wait for that copy either way."""
        return max(self.threads, self.share)

    @property
    def rule_used(self) -> str:
        """What decided ``threads``: the rule, or ``"override"`` (``gen_threads`` was given)."""
        return "override" if self.overridden else self.rule


def usable_cpus() -> int:
    """CPUs this process may run on (affinity mask), not the machine's total."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


def _first_int(env: Mapping[str, str], names: tuple[str, ...]) -> tuple[int, str] | None:
    for name in names:
        raw = env.get(name)
        if raw:
            try:
                value = int(raw)
            except ValueError:
                continue
            if value >= 0:
                return value, name
    return None


def local_ranks(env: Mapping[str, str] | None = None) -> tuple[int, str]:
    """Ranks on this node and where that came from; ``(1, "default")`` outside MPI.

    With no explicit ``env``, a count measured by MPI (:func:`set_local_ranks`) wins.
    """
    if env is None and _measured_local is not None:
        return _measured_local
    found = launcher.local_size(environ(env))
    return found if found else (1, "default")


def thread_budget(
    override: int | None = None,
    *,
    rule: modes.ThreadBudgetRule = "mlperf",
    env: Mapping[str, str] | None = None,
    cpus: int | None = None,
) -> ThreadBudget:
    """Generator threads from this rank's share of the CPUs, unless overridden.

    The share is usable CPUs // ranks on this node sharing them (from the environment every
    node-local rank counts as sharing). ``"mlperf"``: the whole share; ``"leave_loop_core"``:
    the share less the core this rank's event loop runs on. At least 1 either way.
    """
    modes.parse("thread_budget", rule, modes.ThreadBudgetRule, fold=False)
    ncpu = usable_cpus() if cpus is None else cpus
    nlocal, source = local_ranks(env)
    if override is not None:
        return ThreadBudget(override, ncpu, nlocal, source, True, rule)
    divisor = _cpu_sharers if env is None and _measured_local is not None and _cpu_sharers else nlocal
    share = ncpu // divisor
    threads = share - 1 if rule == "leave_loop_core" else share
    return ThreadBudget(max(1, threads), ncpu, nlocal, source, False, rule, max(1, share))


def world(env: Mapping[str, str] | None = None) -> tuple[int, int]:
    """``(rank, size)`` from the launcher's environment; ``(0, 1)`` outside any launcher."""
    found = launcher.detect(env)
    return found.rank, found.size

"""Which launcher started this process, and its rank, world size and ranks on this node.

Launchers nest (``srun`` starts one ``torchrun`` per node, ``mpirun`` runs inside a Slurm
allocation), and then the outer launcher's variables describe the *outer* processes. So the
innermost launcher wins; precedence, first match:

1. **torchrun** (and other torch.distributed launchers): ``RANK``, ``WORLD_SIZE``,
   ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``.
2. **MPI launchers**: Open MPI ``OMPI_COMM_WORLD_*``, MPICH/Hydra ``PMI_RANK``/``PMI_SIZE``
   (+ ``MPI_LOCALNRANKS``/``MPI_LOCALRANKID``), MVAPICH2 ``MV2_COMM_WORLD_*``. Under one of
   these, :mod:`asyncckpt.node.distributed` measures the same facts through mpi4py when installed.
3. **PMIx**: ``PMIX_RANK``; the size from ``PMIX_SIZE`` or, under ``srun --mpi=pmix``,
   from Slurm.
4. **Slurm srun** (a job step: ``SLURM_STEP_ID`` is set; a batch script's own
   ``SLURM_PROCID=0`` is not a rank): ``SLURM_PROCID``, ``SLURM_STEP_NUM_TASKS`` or
   ``SLURM_NTASKS``, ``SLURM_LOCALID``, and the ranks on this node from
   ``SLURM_STEP_TASKS_PER_NODE`` or ``SLURM_TASKS_PER_NODE`` (compressed, ``4(x2),3``)
   at index ``SLURM_NODEID``.

Ranks on this node are found in the same order, independently (a bare
``MPI_LOCALNRANKS`` still counts). Every answer names the variable it came from.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..env import environ
from ..errors import ConfigError

TORCH_LAUNCHER_VARS = ("RANK", "WORLD_SIZE")
#: (rank variable, size variable) of the MPI launchers, first present wins
MPI_PAIRS = (
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PMI_RANK", "PMI_SIZE"),
    ("MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE"),
)
LOCAL_SIZE_VARS = (
    "LOCAL_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "MPI_LOCALNRANKS",
    "MV2_COMM_WORLD_LOCAL_SIZE",
)
LOCAL_RANK_VARS = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK")
SLURM_SIZE_VARS = ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS")
SLURM_LAYOUT_VARS = ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")

#: launchers whose ranks coordinate through MPI (mpi4py) in this package
MPI_FAMILY = ("mpi", "pmix", "slurm")


@dataclass(frozen=True)
class Launch:
    """Where this process sits in the job and which variables said so."""

    launcher: str  # "torchrun", "mpi", "pmix", "slurm" or "none"
    rank: int = 0
    size: int = 1
    rank_source: str = "default"


def _int(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name, "").strip()
    try:
        value = int(raw)
    except ValueError:
        return None
    return value if value >= 0 else None


def _first(env: Mapping[str, str], names: tuple[str, ...]) -> tuple[int, str] | None:
    for name in names:
        value = _int(env, name)
        if value is not None:
            return value, name
    return None


def parse_tasks_per_node(text: str) -> list[int]:
    """Expand Slurm's compressed task counts: ``"4(x2),3"`` → ``[4, 4, 3]``."""
    out: list[int] = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:\(x(\d+)\))?\s*", part)
        if m is None:
            raise ConfigError(f"cannot parse Slurm task list {text!r} at {part!r} (expected e.g. 4(x2),3)")
        out += [int(m.group(1))] * int(m.group(2) or 1)
    return out


def in_slurm_step(env: Mapping[str, str]) -> bool:
    return bool(env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID")) and _int(env, "SLURM_PROCID") is not None


def _torch(env: Mapping[str, str]) -> Launch | None:
    rank, size = _int(env, "RANK"), _int(env, "WORLD_SIZE")
    if rank is None or size is None:
        return None
    name = "torchrun" if env.get("TORCHELASTIC_RUN_ID") or "LOCAL_WORLD_SIZE" in env else "torch"
    return Launch(name, rank, size, "RANK")


def _mpi(env: Mapping[str, str]) -> Launch | None:
    size = _first(env, tuple(s for _, s in MPI_PAIRS))
    if size is None:
        return None
    rank = _first(env, tuple(r for r, _ in MPI_PAIRS))
    return Launch("mpi", rank[0] if rank else 0, size[0], rank[1] if rank else "default")


def _slurm_size(env: Mapping[str, str]) -> int | None:
    found = _first(env, SLURM_SIZE_VARS)
    return found[0] if found else None


def _pmix(env: Mapping[str, str]) -> Launch | None:
    rank = _int(env, "PMIX_RANK")
    if rank is None:
        return None
    size = _int(env, "PMIX_SIZE")
    if size is None and in_slurm_step(env):
        size = _slurm_size(env)
    if size is None:
        if rank == 0:
            return None  # a PMIx singleton says nothing
        raise ConfigError(
            f"PMIX_RANK={rank} is set but nothing gives the world size (PMIX_SIZE, SLURM_NTASKS)"
        )
    return Launch("pmix", rank, size, "PMIX_RANK")


def _slurm(env: Mapping[str, str]) -> Launch | None:
    if not in_slurm_step(env):
        return None
    rank, size = _int(env, "SLURM_PROCID"), _slurm_size(env)
    if rank is None or size is None:
        return None
    return Launch("slurm", rank, size, "SLURM_PROCID")


DETECTORS: tuple[Callable[[Mapping[str, str]], Launch | None], ...] = (_torch, _mpi, _pmix, _slurm)


def detect(env: Mapping[str, str] | None = None) -> Launch:
    """The innermost launcher's view of rank and world size (``none``: a single process)."""
    e = environ(env)
    for detector in DETECTORS:
        found = detector(e)
        if found is not None:
            if found.size < 1 or found.rank >= found.size:
                raise ConfigError(
                    f"rank {found.rank} from {found.rank_source} is not below the world size {found.size}"
                )
            return found
    return Launch("none")


def _slurm_local_size(env: Mapping[str, str]) -> tuple[int, str] | None:
    if not in_slurm_step(env):
        return None
    for name in SLURM_LAYOUT_VARS:
        raw = env.get(name)
        if not raw:
            continue
        counts = parse_tasks_per_node(raw)
        node = _int(env, "SLURM_NODEID")
        if node is None and len(set(counts)) == 1:
            node = 0  # every node runs the same number: no need to know which one this is
        if node is None or node >= len(counts):
            continue
        return counts[node], f"{name}[{node}]"
    return None


def local_size(env: Mapping[str, str] | None = None) -> tuple[int, str] | None:
    """Ranks on this node and the variable it came from; ``None`` when no launcher says."""
    e = environ(env)
    found = _first(e, LOCAL_SIZE_VARS)
    if found is not None and found[0] >= 1:
        return found
    return _slurm_local_size(e)


def local_rank(env: Mapping[str, str] | None = None) -> int:
    e = environ(env)
    found = _first(e, LOCAL_RANK_VARS)
    if found is None and in_slurm_step(e):
        found = _first(e, ("SLURM_LOCALID",))
    return found[0] if found else 0

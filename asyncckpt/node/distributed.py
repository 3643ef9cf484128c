"""Who am I in an MPI job, and a tiny communicator for coordinating ranks between saves.

Open MPI (or any MPI) through mpi4py is the engine: asyncckpt never launches processes or
moves data between ranks itself. When mpi4py is installed *and* the process was started by
an MPI launcher, rank/size come from ``MPI.COMM_WORLD`` and the node-local size from
``Split_type(COMM_TYPE_SHARED)`` (which every MPI implements, unlike the launchers'
variables); otherwise from the launchers' environment variables (``OMPI_COMM_WORLD_*``,
``PMI_*``, ``MPI_LOCALNRANKS``, ``MV2_COMM_WORLD_*``).

Collective calls block, so they belong *between* saves: call the plain methods outside the
event loop, or the ``a*`` methods, which run them on the communicator's own thread through
:func:`run_blocking` so the loop keeps turning.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

from ..blocking import run_blocking
from ..env import environ
from ..errors import ConfigError, MissingDependencyError
from . import launcher, topology

T = TypeVar("T")


@dataclass(frozen=True)
class RankInfo:
    """Position of this process in the job; ``source`` says where the numbers came from."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1
    source: str = "default"
    launcher: str = "none"  # what started the ranks (see :mod:`asyncckpt.node.launcher`)


def launched_by_mpi(env: Mapping[str, str] | None = None) -> bool:
    """True when a launcher whose ranks talk MPI (mpirun, mpiexec, PMIx, srun) started us."""
    return launcher.detect(env).launcher in launcher.MPI_FAMILY


def rank_info_from_env(env: Mapping[str, str] | None = None) -> RankInfo:
    """Rank, size and node-local size from the launchers' variables (no MPI calls)."""
    e = environ(env)
    found = launcher.detect(e)
    local_size, source = topology.local_ranks(e)
    return RankInfo(
        found.rank,
        found.size,
        launcher.local_rank(e),
        local_size,
        found.rank_source if found.size > 1 else source,
        found.launcher,
    )


class Comm:
    """Single-process communicator: every collective is trivial. Base of :class:`MPIComm` and
    :class:`asyncckpt.node.collectives.TorchComm`; ``engine`` names the transport in results."""

    engine = "single"

    def __init__(self, info: RankInfo | None = None) -> None:
        self.info = info or RankInfo()
        self._executor: ThreadPoolExecutor | None = None

    @property
    def rank(self) -> int:
        return self.info.rank

    @property
    def size(self) -> int:
        return self.info.size

    @property
    def is_root(self) -> bool:
        return self.info.rank == 0

    def barrier(self) -> None:
        return None

    def gather(self, obj: T, root: int = 0) -> list[T] | None:
        """Every rank's ``obj`` (picklable) on ``root`` in rank order; ``None`` elsewhere."""
        return [obj]

    def bcast(self, obj: T, root: int = 0) -> T:
        """``root``'s ``obj`` on every rank."""
        return obj

    def allgather(self, obj: T) -> list[T]:
        return [obj]

    def sendrecv(self, send: memoryview | None, dest: int, recv: memoryview | None, source: int) -> None:
        """Send ``send`` to rank ``dest`` while receiving ``len(recv)`` bytes from ``source``
        into ``recv`` (either may be None: nothing that way). Both ends must agree on each
        length: a ring shift of raw bytes, without pickling (a replica of a local object)."""
        if send is not None or recv is not None:
            raise ConfigError("a world of one rank has no peer to exchange bytes with")

    def abort(self, code: int = 1) -> NoReturn:
        """End the whole job now: no rank is left waiting at a collective."""
        os._exit(code)

    def dup(self) -> Comm:
        """A second communicator over the same ranks (collective: every rank calls it, in the
        same order), whose collectives never interleave with this one's: a side channel whose
        calls may overlap this one's from another thread."""
        return Comm(self.info)

    # -- from a coroutine: on the communicator's own thread, the loop keeps turning ---------
    async def _call(self, fn: Callable[..., T], *args: object) -> T:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="asyncckpt-comm")
        return await run_blocking(self._executor, fn, *args)

    async def abarrier(self) -> None:
        await self._call(self.barrier)

    async def agather(self, obj: T, root: int = 0) -> list[T] | None:
        return await self._call(self.gather, obj, root)

    async def abcast(self, obj: T, root: int = 0) -> T:
        return await self._call(self.bcast, obj, root)

    def close(self) -> None:
        """Stop the helper thread (the MPI library is finalised by mpi4py at exit)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def shutdown(self) -> None:
        """Release a transport this communicator set up itself (after the last collective)."""
        self.close()


class MPIComm(Comm):
    """``MPI.COMM_WORLD`` through mpi4py."""

    engine = "mpi"

    def __init__(self, mpi: Any) -> None:
        world = mpi.COMM_WORLD
        node = world.Split_type(mpi.COMM_TYPE_SHARED)
        info = RankInfo(
            world.Get_rank(),
            world.Get_size(),
            node.Get_rank(),
            node.Get_size(),
            "mpi4py",
            launcher.detect().launcher,
        )
        mine = frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else frozenset()
        sharers = topology.cpu_sharers(mine, node.allgather(mine)) if mine else info.local_size
        node.Free()
        super().__init__(info)
        self._world = world
        self._mpi = mpi
        # Collectives from a helper thread need THREAD_SERIALIZED; below that, call inline.
        self._threaded = mpi.Query_thread() >= mpi.THREAD_SERIALIZED
        self.cpu_sharers = sharers
        source = f"mpi4py COMM_TYPE_SHARED, {sharers} sharing this CPU set"
        topology.set_local_ranks(info.local_size, source, sharers)

    def barrier(self) -> None:
        self._world.Barrier()

    def gather(self, obj: T, root: int = 0) -> list[T] | None:
        out: list[T] | None = self._world.gather(obj, root=root)
        return out

    def bcast(self, obj: T, root: int = 0) -> T:
        out: T = self._world.bcast(obj, root=root)
        return out

    def allgather(self, obj: T) -> list[T]:
        out: list[T] = self._world.allgather(obj)
        return out

    def sendrecv(self, send: memoryview | None, dest: int, recv: memoryview | None, source: int) -> None:
        mpi = self._mpi
        self._world.Sendrecv(
            [send if send is not None else bytearray(0), mpi.BYTE],
            dest if send is not None else mpi.PROC_NULL,
            recvbuf=[recv if recv is not None else bytearray(0), mpi.BYTE],
            source=source if recv is not None else mpi.PROC_NULL,
        )

    def dup(self) -> Comm:
        if self._mpi.Query_thread() < self._mpi.THREAD_MULTIPLE:  # two threads call collectives
            raise ConfigError("a second MPI communicator used beside the first needs THREAD_MULTIPLE")
        clone = copy.copy(self)
        clone._world = self._world.Dup()
        clone._executor = None
        return clone

    def abort(self, code: int = 1) -> NoReturn:
        self._world.Abort(code)
        os._exit(code)  # pragma: no cover - Abort does not return

    async def _call(self, fn: Callable[..., T], *args: object) -> T:
        if not self._threaded:  # pragma: no cover - Open MPI and MPICH give THREAD_MULTIPLE
            return fn(*args)
        return await super()._call(fn, *args)


def get_comm(env: Mapping[str, str] | None = None) -> Comm:
    """The job's communicator: mpi4py under an MPI launcher, else a single-process one.

    Under a launcher with more than one rank but without mpi4py the ranks could not
    coordinate (barriers, gathering results), so that is an error naming the extra.
    """
    found = launcher.detect(env)
    if found.launcher != "mpi" and found.size == 1:
        return Comm(rank_info_from_env(env))  # one rank (srun -n 1, torchrun with one process)
    if not launched_by_mpi(env):
        info = rank_info_from_env(env)
        if info.size > 1:  # torchrun: ranks would need torch.distributed to coordinate
            raise ConfigError(
                f"{info.size} ranks started by {info.launcher} ({info.source}={info.rank}): "
                "coordinating them needs MPI here; start the ranks with mpirun or srun"
            )
        return Comm(info)
    try:
        from mpi4py import MPI
    except ImportError:
        info = rank_info_from_env(env)
        if info.size > 1:
            raise MissingDependencyError(
                "mpi4py", "mpi", f"coordinating {info.size} MPI ranks (rank {info.rank})"
            ) from None
        return Comm(info)
    return MPIComm(MPI)

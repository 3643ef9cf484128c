"""The few collectives a multi-rank checkpoint needs: barrier, broadcast, all-gather, rank/world.

asyncckpt moves no bytes between ranks itself; it borrows the job's transport:

1. ``torch.distributed`` when the process group is initialised (torchrun, or any launcher
   followed by ``init_process_group``): the training job already set it up;
2. else ``mpi4py`` (``MPI.COMM_WORLD``) when an MPI launcher started more than one rank;
3. a world of one needs no transport at all;
4. several ranks with neither is a :class:`ConfigError` naming the launcher (the ranks could
   not agree when a step is complete, so nothing would be safe to commit).

The collectives block, so each call runs on the communicator's one helper thread (one
thread keeps every rank issuing them in the same order) while the event loop keeps turning.
A collective cannot be interrupted: a cancelled call waits for it (as every blocking call in
asyncckpt does, see :func:`run_blocking`), and a dead peer surfaces as the transport's
timeout, raised as :class:`CollectiveError`.
"""

from __future__ import annotations

import copy
import os
import sys
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import TracebackType
from typing import Any, NoReturn, TypeVar

from .. import env as env_vars
from ..blocking import run_blocking
from ..errors import AsyncCkptError, CollectiveError, ConfigError, MissingDependencyError
from . import launcher, topology
from .distributed import Comm, RankInfo, get_comm

T = TypeVar("T")


@dataclass(frozen=True)
class _Ops:
    """The blocking primitives of one transport."""

    barrier: Callable[[], None]
    broadcast: Callable[[Any, int], Any]
    all_gather: Callable[[Any], list[Any]]
    dup: Callable[[], _Ops]  # collective: the same ranks over a second, independent channel
    sendrecv: Callable[[memoryview | None, int, memoryview | None, int], None]


def _single() -> _Ops:
    return _Ops(
        barrier=lambda: None,
        broadcast=lambda obj, src: obj,
        all_gather=lambda obj: [obj],
        dup=_single,
        sendrecv=Comm().sendrecv,
    )


def _comm_ops(comm: Comm) -> _Ops:
    return _Ops(
        barrier=comm.barrier,
        broadcast=lambda obj, src: comm.bcast(obj, src),
        all_gather=comm.allgather,
        dup=lambda: _comm_ops(comm.dup()),
        sendrecv=comm.sendrecv,
    )


class TorchComm(Comm):
    """The default ``torch.distributed`` process group as a :class:`Comm` (gloo, nccl, ...).

    ``owns``: this communicator initialised the group, and :meth:`shutdown` destroys it.
    """

    engine = "torch"

    def __init__(self, dist: Any, *, owns: bool = False, env: Mapping[str, str] | None = None) -> None:
        e = env_vars.environ(env)
        local_size, _ = topology.local_ranks(e)
        info = RankInfo(
            dist.get_rank(),
            dist.get_world_size(),
            launcher.local_rank(e),
            local_size,
            "torch.distributed",
            launcher.detect(e).launcher,
        )
        super().__init__(info)
        self._dist = dist
        self._owns = owns
        self._group: Any = None  # None: the default process group

    def barrier(self) -> None:
        self._dist.barrier(group=self._group)

    def gather(self, obj: T, root: int = 0) -> list[T] | None:
        out: list[T] | None = [None] * self.size if self.rank == root else None  # type: ignore[list-item]
        self._dist.gather_object(obj, out, dst=root, group=self._group)
        return out

    def bcast(self, obj: T, root: int = 0) -> T:
        box = [obj]
        self._dist.broadcast_object_list(box, src=root, group=self._group)
        return box[0]

    def allgather(self, obj: T) -> list[T]:
        out: list[T] = [None] * self.size  # type: ignore[list-item]
        self._dist.all_gather_object(out, obj, group=self._group)
        return out

    def sendrecv(self, send: memoryview | None, dest: int, recv: memoryview | None, source: int) -> None:
        """Point-to-point over the group (gloo: TCP), both ways at once: a ring's sends all
        posted before any receive completes, so no rank waits on another's send."""
        torch = sys.modules["torch"]
        ops = []
        if send is not None:
            ops.append(self._dist.P2POp(self._dist.isend, _as_tensor(torch, send), dest, self._group))
        if recv is not None:
            ops.append(self._dist.P2POp(self._dist.irecv, _as_tensor(torch, recv), source, self._group))
        if ops:
            for work in self._dist.batch_isend_irecv(ops):
                work.wait()

    def dup(self) -> Comm:
        """A new gloo group over every rank (``new_group`` is itself collective)."""
        clone = copy.copy(self)
        clone._group = self._dist.new_group(backend="gloo")
        clone._owns = False
        clone._executor = None
        return clone

    def abort(self, code: int = 1) -> NoReturn:
        """Exit now: torchrun's agent sees a failed worker and stops the others."""
        os._exit(code)

    def shutdown(self) -> None:
        self.close()
        if self._owns and self._dist.is_initialized():
            self._dist.destroy_process_group()
            self._owns = False


def _as_tensor(torch: Any, view: memoryview) -> Any:
    """A uint8 tensor over ``view``'s memory (no copy; torch wants a writable buffer)."""
    return torch.frombuffer(view, dtype=torch.uint8) if len(view) else torch.empty(0, dtype=torch.uint8)


def _torch_dist() -> Any:
    """``torch.distributed`` if it is initialised; never imports torch (a 2 s import) itself."""
    if "torch.distributed" not in sys.modules:
        return None
    dist = sys.modules["torch.distributed"]
    return dist if dist.is_available() and dist.is_initialized() else None


def _init_torch(found: launcher.Launch) -> Any:
    """Initialise the default gloo process group from torchrun's variables (``env://``)."""
    purpose = f"coordinating {found.size} ranks started by {found.launcher}"
    try:
        import torch.distributed as dist
    except ImportError:
        raise MissingDependencyError("torch", "torch", purpose) from None
    if not dist.is_available():
        raise ConfigError(f"{purpose}: this torch build has no torch.distributed")
    try:
        dist.init_process_group("gloo")
    except ValueError as exc:  # MASTER_ADDR/MASTER_PORT missing: not really torchrun
        raise ConfigError(f"{purpose}: cannot initialise torch.distributed: {exc}") from None
    return dist


def job_comm(env: Mapping[str, str] | None = None) -> Comm:
    """The job's communicator for a program that owns its ranks (the bench CLI).

    torch.distributed when it is initialised, or when torchrun started several ranks and no
    MPI launcher is around (then a gloo group is initialised here and :meth:`Comm.shutdown`
    destroys it); else MPI (:func:`~asyncckpt.node.distributed.get_comm`); else a world of one.
    """
    dist = _torch_dist()
    if dist is not None:
        return TorchComm(dist, env=env)
    found = launcher.detect(env)
    if found.launcher in ("torchrun", "torch") and found.size > 1:
        return TorchComm(_init_torch(found), owns=True, env=env)
    return get_comm(env)


class Collectives:
    """Rank, world size and async collectives over one transport (see the module docstring).

    >>> async with get_collectives() as coll:
    ...     await coll.barrier()
    ...     uris = await coll.all_gather_object(my_uri)
    """

    def __init__(self, ops: _Ops, *, backend: str, rank: int, world_size: int) -> None:
        self._ops = ops
        self.backend = backend  # "torch", "mpi" or "single"
        self.rank = rank
        self.world_size = world_size
        self._executor: ThreadPoolExecutor | None = None

    @property
    def is_coordinator(self) -> bool:
        return self.rank == 0

    async def _call(self, what: str, fn: Callable[..., T], *args: object) -> T:
        if self.world_size == 1:
            return fn(*args)  # trivial: no thread needed
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="asyncckpt-collectives")
        try:
            return await run_blocking(self._executor, fn, *args)
        except AsyncCkptError:
            raise
        except Exception as exc:  # the transport's own errors (RuntimeError, MPI.Exception, ...)
            raise CollectiveError(f"{what} over {self.backend} failed on rank {self.rank}: {exc}") from exc

    async def barrier(self) -> None:
        """Return once every rank has called it."""
        await self._call("barrier", self._ops.barrier)

    async def broadcast_object(self, obj: T, src: int = 0) -> T:
        """``src``'s ``obj`` (picklable) on every rank."""
        self._check_rank(src)
        out: T = await self._call("broadcast", self._ops.broadcast, obj, src)
        return out

    async def all_gather_object(self, obj: T) -> list[T]:
        """Every rank's ``obj`` (picklable), in rank order, on every rank."""
        out: list[T] = await self._call("all-gather", self._ops.all_gather, obj)
        return out

    async def sendrecv(
        self, send: memoryview | None, dest: int, recv: memoryview | None, source: int
    ) -> None:
        """Raw bytes to ``dest`` and from ``source`` at once (see :meth:`Comm.sendrecv`); every
        rank of a ring calls it in the same round. Only on a :meth:`duplicate` channel whose
        other calls are the same ring's: it is point-to-point, not a collective."""
        if send is not None:
            self._check_rank(dest)
        if recv is not None:
            self._check_rank(source)
        await self._call("send-receive", self._ops.sendrecv, send, dest, recv, source)

    async def duplicate(self) -> Collectives:
        """The same ranks over a second channel of the transport, for a side conversation
        (a flag at each training step) that must never interleave with this one's collectives
        running meanwhile on the helper thread. Collective: every rank calls it in the same order."""
        ops = await self._call("duplicate", self._ops.dup)
        return Collectives(ops, backend=self.backend, rank=self.rank, world_size=self.world_size)

    def _check_rank(self, rank: int) -> None:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise ConfigError(f"rank must be in 0..{self.world_size - 1}, got {rank!r}")

    def close(self) -> None:
        """Join the helper thread (the transport itself belongs to the job and stays up)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    async def __aenter__(self) -> Collectives:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def get_collectives(env: Mapping[str, str] | None = None) -> Collectives:
    """This job's collectives: torch.distributed if initialised, else MPI, else a world of one."""
    dist = _torch_dist()
    if dist is not None:
        return _over(TorchComm(dist, env=env))
    found = launcher.detect(env)
    if found.size == 1:
        return Collectives(_single(), backend="single", rank=0, world_size=1)
    if found.launcher not in launcher.MPI_FAMILY:
        raise ConfigError(
            f"{found.size} ranks started by {found.launcher} ({found.rank_source}={found.rank}) but no "
            "collectives to coordinate them: call torch.distributed.init_process_group() first, or start "
            "the ranks with mpirun/srun and install mpi4py (pip install 'asyncckpt[mpi]')"
        )
    comm = get_comm(env)  # mpi4py's COMM_WORLD; MissingDependencyError names the extra without it
    from mpi4py import MPI

    if MPI.Query_thread() < MPI.THREAD_SERIALIZED:  # pragma: no cover - mpi4py asks for MULTIPLE
        raise ConfigError("MPI was initialised below THREAD_SERIALIZED: collectives need a helper thread")
    return _over(comm)


def _over(comm: Comm) -> Collectives:
    return Collectives(_comm_ops(comm), backend=comm.engine, rank=comm.rank, world_size=comm.size)

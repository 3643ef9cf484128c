"""The storage interface: one small class per backend, one instance per checkpoint object.

A sink is written as open → write_part* → complete, or abandoned with abort; until complete
returns nothing is visible at the target (files: temporary name + rename; S3: multipart
upload that only completes at the end). ``read_into`` serves loads.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from ..blocking import read_full, run_blocking
from ..cpu import CpuCounters, CpuTally
from ..errors import ConfigError
from .shared import Shared
from .shm import SharedArena

if TYPE_CHECKING:
    from ..sources.base import GenSpec


@dataclass(frozen=True, slots=True)
class InPlaceWrite:
    """One chunk generated straight into a client library's memory and handed to it, timed
    where it happened (in a writer process, when isolated): ``fill_s`` the generation,
    ``checksum_s`` the CRC32C of the bytes as they went up (None and 0 when the save takes no
    checksums), ``write_s`` the library's own calls (reserving its memory and committing the
    chunk, where its back-pressure shows)."""

    fill_s: float
    write_s: float
    checksum: int | None
    checksum_s: float


@dataclass(frozen=True, kw_only=True)
class SinkOptions:
    """Options every sink understands; backends ignore what does not apply to them."""

    direct_io: bool | None = None  # None: use it when the file system accepts it
    fsync: bool = True
    reserve_space: bool = True  # fallocate the whole file up front (early ENOSPC)
    chunk_size: int | None = None  # bytes per write_part (the last may be shorter); object stores map parts
    extra: dict[str, Any] = field(default_factory=dict)


#: ``(offset, view)`` of each read of a batch (``Sink.read_batch``)
ReadBatch = Sequence[tuple[int, memoryview]]
#: blocking ``(index in the batch, bytes read)``, run once a batch's read is done
AfterRead = Callable[[int, int], None]


class Sink(ABC):
    """Writes (and reads) one checkpoint object.

    ``write_part`` may run concurrently for different offsets (up to ``max_in_flight``) and
    must not touch ``data`` after it returns: the buffer then goes back to the pool.
    """

    backend: ClassVar[str] = "abstract"
    # capabilities, asked by the rest of the code (never a list of backend names)
    #: parts written concurrently when the caller does not say
    default_in_flight: ClassVar[int] = 1
    #: a client runtime that must not run in the caller's process (``isolation="auto"``)
    needs_isolation: ClassVar[bool] = False
    #: whether writes can bypass the page cache (O_DIRECT)
    supports_direct_io: ClassVar[bool] = False
    #: whether chunks must lie in a shared-memory arena (a writer process reads them there):
    #: the engine then builds its pool in shared memory and calls :meth:`attach_arena`
    uses_shared_arena: ClassVar[bool] = False
    #: whether :meth:`kill` can stop a stuck call (a process can be killed, a thread cannot)
    stoppable: ClassVar[bool] = False
    #: whether the bytes stay in this process's memory (nothing to stall on)
    in_process_memory: ClassVar[bool] = False
    #: whether names under a URI form directories that exist on their own (files), rather than
    #: being prefixes of object keys (object stores): step directories are made and removed
    has_directories: ClassVar[bool] = False
    #: whether objects under a URI can be listed (step directories need it)
    can_list: ClassVar[bool] = False
    #: whether what is written can be read back (``null://`` discards it)
    keeps_data: ClassVar[bool] = True
    #: whether the backend spreads ranks over several endpoints (S3_ENDPOINT_URIS & co.)
    multi_endpoint: ClassVar[bool] = False
    #: whether a read is a blocking call a worker thread makes (a file's ``pread``): a load then
    #: reads several pieces in one thread hop and works on each in that hop (:meth:`read_batch`)
    reads_in_batches: ClassVar[bool] = False

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> None:
        """Refuse ``backend_options`` this backend does not understand, before any I/O (each
        backend checks its own: the configuration does not know any backend's settings)."""
        if options:
            raise ConfigError(
                f"backend {cls.backend!r} takes no backend_options, got {', '.join(sorted(options))}"
            )

    @classmethod  # noqa: B027 - optional hook
    def check_target(cls, uri: str) -> None:
        """Refuse ``uri`` as an object of this backend, before any I/O and without importing
        its client library (a writer process asks this before it starts a child)."""

    @classmethod
    def check_root(cls, uri: str) -> None:
        """Refuse ``uri`` as the root of step directories, before any I/O, if it cannot be one."""
        if not cls.can_list:
            raise ConfigError(f"step directories need a backend that lists objects; {cls.backend!r} cannot")

    async def make_directory(self) -> None:  # noqa: B027 - optional hook
        """Create this URI as a directory, parents included (``has_directories`` backends)."""

    def write_behind(self) -> int:
        """After ``open``: bytes the library may still hold, not acknowledged by the storage,
        after its write calls returned (it uploads in the background); 0 when a write returns
        once the storage has its bytes. The stall watchdog counts a write of such a library as
        progress only when it proves an earlier part acknowledged (``asyncckpt.watchdog``)."""
        return 0

    def writes_in_flight(self) -> int:
        """After ``open``: writes to keep in flight when the caller does not say. The class's
        ``default_in_flight`` unless the opened object knows better (a file on tmpfs)."""
        return self.default_in_flight

    @classmethod  # noqa: B027 - by default there is nothing to import: not a stub
    def import_library(cls) -> None:
        """Import the client library (blocking, so a checkpointer calls it in a thread before its
        first sink). A sink module defers a slow import to this, because the module itself is
        imported on the caller's loop whenever a configuration's capabilities are checked."""

    def __init__(
        self, uri: str, *, executor: Executor, options: SinkOptions, shared: Shared | None = None
    ) -> None:
        self.committed = False  # set once complete() published the object (asyncckpt.sinks.commit)
        #: CPU seconds of this handle's storage calls, measured in their threads; ``None`` for
        #: sinks that do not measure it (their storage work is not reported as a stage)
        self.storage_cpu: CpuTally | None = None
        self.uri = uri
        self.executor = executor
        self.options = options
        #: what this backend's objects share (clients, settings): the store's, else private
        self.shared = shared if shared is not None else Shared()
        self._owns_shared = shared is None

    def attach_arena(self, arena: SharedArena) -> None:  # noqa: B027 - optional hook
        """Chunks of the next operation travel as offsets in ``arena`` (``uses_shared_arena``
        handles only; the others read and write the buffers they are given)."""

    async def kill(self, why: str) -> None:  # noqa: B027 - optional hook
        """Stop whatever runs this handle's calls, now (``stoppable`` handles only)."""

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Start what the sink runs on (a writer process), no storage I/O; idempotent. The
        stall watchdog does not time it: a slow start on a loaded machine is not a stall."""

    def check(self) -> None:  # noqa: B027 - optional hook
        """Validate the target cheaply, before any I/O; raise a clear error if it is wrong."""

    @abstractmethod
    async def open(self, size: int) -> None:
        """Start writing an object of ``size`` bytes (invisible until ``complete``)."""

    @abstractmethod
    async def write_part(self, offset: int, data: memoryview) -> float | None:
        """Write ``data`` at ``offset``; return the pure I/O seconds if measured inside."""

    @abstractmethod
    async def complete(self) -> dict[str, float]:
        """Make the object durable and visible; return named timings (e.g. fsync_s)."""

    @abstractmethod
    async def abort(self) -> None:
        """Discard a write in progress; idempotent; never raises for cleanup failures."""

    async def begin_generation(self, spec: GenSpec) -> bool:
        """After ``open``: whether this handle will generate the object's chunks itself, in
        memory its client library owns (``write_generated``), from ``spec``. The default: no,
        chunks arrive filled through ``write_part``."""
        del spec
        return False

    async def write_generated(self, offset: int, nbytes: int) -> InPlaceWrite:
        """Generate the next ``nbytes`` at ``offset`` in place and write them (only after
        ``begin_generation`` said yes; offsets in order, as the generator's stream is)."""
        raise NotImplementedError(f"backend {self.backend!r} does not generate in place")

    async def open_read(self, *, defeat_cache: bool = True) -> None:  # noqa: B027 - optional hook
        """Prepare for a series of ``read_into`` calls (a load); released by ``aclose``.

        Sinks that keep a descriptor or connection open across reads, or that can keep
        reads out of a cache (``defeat_cache``), do it here; the default does nothing.
        ``describe()`` afterwards reports how reads were done.
        """

    @abstractmethod
    async def read_into(self, offset: int, buf: memoryview) -> int:
        """Read up to ``len(buf)`` bytes at ``offset`` into ``buf``; return the count."""

    async def read_batch(self, reads: ReadBatch, after: AfterRead) -> None:
        """Read each ``(offset, view)`` in turn, until the view is full or the object ends, and
        call the blocking ``after(i, bytes read)`` once the i-th read is done, before the next
        starts (the views may share memory). A backend with ``reads_in_batches`` does the whole
        batch in one worker-thread hop, ``after`` included: a load of many small reads then pays
        one hop per batch instead of two per read (the hops, not the bytes, held a resharded
        load back). This default reads with :meth:`read_into` and runs each ``after`` in a hop."""
        for i, (offset, view) in enumerate(reads):
            got = await read_full(self.read_into, offset, view)
            await run_blocking(self.executor, after, i, got)

    @abstractmethod
    async def size(self) -> int:
        """Size of the published object (raises TargetNotFoundError if absent)."""

    async def check_unchanged(self) -> None:  # noqa: B027 - optional hook
        """IntegrityError if the object is no longer the version this load began with. Asked
        after a checksum mismatch, so that an object another save replaced mid-load is named
        as such, not as corrupt. A file load reads through the descriptor it opened: nothing
        to ask."""

    @abstractmethod
    async def delete(self) -> None:
        """Remove the published object (no error if absent)."""

    async def list_names(self) -> list[str]:
        """Names of the objects one level under this URI taken as a directory or prefix
        (``<uri>/<name>`` or ``<uri>/<name>/...``), sorted; [] when there are none. One level
        is what step directories need, and it is what a file system lists cheaply."""
        raise ConfigError(f"backend {self.backend!r} cannot list objects under {self.uri!r}")

    async def aclose(self) -> None:
        """Release descriptors, and clients unless a store shares them."""
        await self.release_shared()

    async def release_shared(self) -> None:
        if self._owns_shared:
            await self.shared.aclose()

    async def cpu_counters(self) -> CpuCounters:
        """Cumulative CPU counters, read at the start and the end of a save or load: the
        storage calls' thread CPU, and (a writer process) the CPU of the process they run in."""
        return CpuCounters(storage=self.storage_cpu.total if self.storage_cpu is not None else None)

    def describe(self) -> dict[str, Any]:
        """Facts for the run metadata: direct I/O engaged and why (not), part sizes, ...

        An ``identity`` or ``etag`` entry (after ``complete``/``size``) names the published
        version of the object; the manifest keeps it so a load can tell it was replaced.
        """
        return {"direct_io": False, "direct_io_reason": f"not applicable to {self.backend}"}

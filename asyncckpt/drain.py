"""One rank's object copied from the local tier to the remote one: the drain of a tiered step.

The local object is a ``save_state`` object: its safetensors header carries the CRC32C of each
chunk. The drain reads it (O_DIRECT where the file sink reads so) straight into the pool's
page-aligned buffers (:class:`~asyncckpt.sources.ReadFrom`) and streams the bytes through the
ordinary save (:meth:`AsyncCheckpointer.save` with
``expect_crc32c``: the pool, bounded writes in flight, multipart, the CPU lane), so the remote
object is byte for byte the local one and verifies with the same checksums. Nothing is hashed
twice: the pipeline's own CRC32C of each chunk, taken beside its write, is compared with the
header's before the remote object is published; a corrupt local byte fails the drain with its
offset (:class:`ChecksumMismatchError`) and nothing is published remotely.

A drain is background work beside a training that may use every core, so its checkpointer
(:func:`drainer_config`) asks for as little as it can: its loop monitor ticks every 0.1 s, not
every 5 ms, and by default (``drain_priority="idle"``) its CPU-only work (the CRC32C of each
chunk) runs in ``SCHED_IDLE``, on the CPU the training's threads leave. Each wake-up of a drain
thread preempts a training thread, and a training whose threads meet at each op waits for the
one preempted: with the training on both cores of the 2-core VM, the steps beside a drain
capped at 100 MB/s ran 4.7-10.3 % slower than beside a sham checkpoint (medians of five runs),
0.8-2.7 % with these two settings, for a remote commit 0.3-0.5 s later (docs/benchmarks.md).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Protocol

from .config import CheckpointConfig
from .engine import chunks
from .engine.header import state_manifest
from .engine.monitor import now
from .errors import ChecksumMismatchError, ConfigError, IntegrityError, SourceChangedError
from .results.records import SaveResult
from .sinks.router import StorageRouter
from .sources import ReadFrom
from .units import finite, shown


class DrainHost(Protocol):
    """What a drain needs of a checkpointer (:class:`asyncckpt.AsyncCheckpointer` is one)."""

    storage: StorageRouter

    @property
    def config(self) -> Any: ...

    async def save(
        self,
        uri: str,
        size: int | None = None,
        *,
        data: Any = None,
        method: Any = "streaming",
        progress: Any = None,
        expect_crc32c: Any = None,
    ) -> SaveResult: ...


@dataclass(frozen=True)
class Drained:
    """What one drain did: bytes copied, its wall time, the remote object's identity."""

    size: int
    seconds: float
    identity: Any

    @property
    def gb_per_s(self) -> float:
        return self.size / self.seconds / 1e9 if self.seconds > 0 else 0.0


#: seconds between a drain's loop-monitor ticks (a save's default: 0.005)
DRAIN_MONITOR_S = 0.1


def drainer_config(config: CheckpointConfig, *, idle: bool = True) -> CheckpointConfig:
    """The configuration of the checkpointer that drains for one configured as ``config``: the
    same, with its loop monitor at :data:`DRAIN_MONITOR_S` and, with ``idle``
    (``drain_priority="idle"``), its CPU lane in ``SCHED_IDLE`` (see the module docstring)."""
    cpu_idle = True if idle else config.cpu_idle
    return replace(config, cpu_idle=cpu_idle, monitor_interval=max(config.monitor_interval, DRAIN_MONITOR_S))


def check_bandwidth(value: object) -> float | None:
    """``drain_bandwidth`` in bytes per second (None: uncapped); ConfigError naming it."""
    if value is None:
        return None
    number = finite(value)
    if number is None or number <= 0:
        raise ConfigError(
            f"drain_bandwidth must be a positive number of bytes per second, got {shown(value)}"
        )
    return number


async def drain_object(
    host: DrainHost, local_uri: str, remote_uri: str, *, bandwidth: float | None = None
) -> Drained:
    """Copy the state object at ``local_uri`` to ``remote_uri``, checked against its own
    checksums on the way; published remotely only if every byte matched."""
    sink = await host.storage.handle(local_uri)
    try:
        await sink.open_read(defeat_cache=True)
        size = await sink.size()
        manifest = await state_manifest(sink, size, local_uri)
        if manifest is None or not manifest.chunk_crc32c:
            raise IntegrityError(f"{local_uri!r} carries no chunk checksums: it cannot be drained verified")
        chunk = host.config.chunk_size
        block = manifest.chunk_size
        if chunk % block:
            raise ConfigError(
                f"{local_uri!r} carries checksums of {block}-byte blocks, which do not divide this "
                f"checkpointer's chunk_size={chunk}: drain it with the checkpointer that saved it"
            )
        # the header's checksum blocks (256 KiB) combine into the pipeline's chunk CRCs
        expect = chunks.coarsen(manifest.chunk_crc32c, size, block, chunk)
        t0 = now()
        try:
            saved = await host.save(
                remote_uri,
                size,
                data=ReadFrom(sink.read_into, local_uri, bandwidth),
                expect_crc32c=list(expect),
            )
        except SourceChangedError as exc:
            offset = exc.offset if exc.offset is not None else -1
            raise ChecksumMismatchError(
                f"local copy {local_uri!r} is corrupt at offset {offset} (its CRC32C differs from "
                f"the one its header recorded): drain to {remote_uri!r} stopped, nothing published there",
                chunk=max(offset, 0) // chunk,
                offset=offset,
            ) from None
        facts = saved.metadata.extra
        return Drained(size, now() - t0, facts.get("etag") or facts.get("identity"))
    finally:
        await sink.aclose()

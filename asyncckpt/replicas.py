"""Peer replicas: each rank's local object of a step, copied to the next node's local tier.

A node that dies takes its local tier with it; the remote copy of its objects may be minutes
behind (the drain) or a slow round trip away. With ``replicate_to_peer=True`` a tiered
manager sends each rank's object of every locally committed step to its *peer*: the rank with
the same node-local index on the next node (a ring over the nodes, as nvidia-resiliency-ext's
local checkpoints and Orbax's replicator do). The peer stores it under the object's own name
in its node's step directory, beside its own objects; a restore after a node's loss fetches
the lost ranks' objects back from their peers and loads them as local copies.

The bytes go over the job's own transport (MPI ``Sendrecv`` or torch.distributed
point-to-point), on a side channel of their own, never through a store: every rank sends its
piece to its peer while receiving its source's, in lockstep rounds of :data:`PIECE` bytes. The
receiver checks each piece against the sender's sealed manifest (the CRC32C of each block its
header records) before writing it, and publishes the replica atomically (a temporary named
after its owner, then the rename) only when every byte matched; a rank that fails to read or
to write keeps taking part in the rounds (the ring would hang otherwise) and publishes nothing.
"""

from __future__ import annotations

import asyncio
import logging
import mmap
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .blocking import run_blocking
from .engine.header import read_exact, state_manifest
from .engine.manifest import Manifest
from .engine.verify import first_bad
from .errors import AsyncCkptError, ChecksumMismatchError, CollectiveError, ConfigError
from .node.collectives import Collectives
from .owner import host
from .pool import close_mapping
from .sinks.base import Sink
from .sinks.commit import commit
from .state.hf_index import INDEX as HF_INDEX
from .steps import (
    COMMIT,
    StepHost,
    exists,
    get_index_bytes,
    get_record,
    make_directory,
    put_raw,
    put_record,
    rank_object,
    step_uri,
)

log = logging.getLogger("asyncckpt")

#: bytes per round of the ring: a multiple of any checksum block (256 KiB)
PIECE = 16 << 20
#: pieces read ahead, and written behind, while one goes through the transport: 2 x DEPTH
#: buffers of PIECE bytes per rank while a replica moves
DEPTH = 4


@dataclass(frozen=True)
class Ring:
    """Each rank's peer: the rank with the same node-local index on the next node."""

    peer: tuple[int, ...]  # peer[r]: the rank whose node holds r's replica
    hosts: tuple[str, ...]  # each rank's node

    @classmethod
    def of(cls, hosts: Sequence[str]) -> Ring:
        """The ring of a job whose rank ``r`` runs on node ``hosts[r]``; ConfigError when it
        has one node (no peer to hold a copy) or nodes with different numbers of ranks."""
        nodes: dict[str, list[int]] = {}
        for rank, name in enumerate(hosts):
            nodes.setdefault(name, []).append(rank)
        groups = list(nodes.values())
        if len(groups) < 2:
            raise ConfigError(
                f"replicate_to_peer=True needs ranks on two nodes or more; all {len(hosts)} rank(s) "
                f"run on {hosts[0]!r}"
            )
        counts = {name: len(ranks) for name, ranks in nodes.items()}
        if len(set(counts.values())) > 1:
            raise ConfigError(f"replicate_to_peer=True needs as many ranks on every node, got {counts}")
        peer = [0] * len(hosts)
        for i, ranks in enumerate(groups):
            after = groups[(i + 1) % len(groups)]
            for j, rank in enumerate(ranks):
                peer[rank] = after[j]
        return cls(tuple(peer), tuple(hosts))

    def source(self, rank: int) -> int:
        """The rank whose replica ``rank`` holds."""
        return self.peer.index(rank)


@dataclass(frozen=True)
class Offer:
    """What one rank tells the others before a transfer: what it sends (its object's manifest,
    or None), whether it wants its source's object, and a record to hand over with it."""

    manifest: Manifest | None
    wants: bool
    record: dict[str, Any] | None = None


@dataclass(frozen=True)
class Moved:
    """One rank's side of a transfer: bytes sent and received (published)."""

    sent: int
    received: int
    record: dict[str, Any] | None  # the sender's record, when this rank received


async def transfer(
    host: StepHost,
    coll: Collectives,
    to: Sequence[int],
    *,
    send: str | None,
    recv: str | None,
    record: dict[str, Any] | None = None,
) -> Moved:
    """Collective over ``coll`` (every rank calls it, in the same order): rank ``r`` sends the
    object at its ``send`` URI to rank ``to[r]``, and receives into its ``recv`` URI what its
    source (the rank ``s`` with ``to[s] == r``) sends, if both ends take part.

    Raises on this rank's failure (nothing published at ``recv``) only after the last round."""
    me = coll.rank
    source = list(to).index(me)
    reader = await _opened(host, send) if send is not None else None
    try:
        manifest = reader[1] if reader is not None else None
        offers = await coll.all_gather_object(Offer(manifest, recv is not None, record))
        out = manifest if offers[to[me]].wants else None
        come = offers[source].manifest if recv is not None else None
        rounds = max(
            (_pieces(o.manifest.size) for r, o in enumerate(offers) if o.manifest and offers[to[r]].wants),
            default=0,
        )
        failure: Exception | None = None
        try:
            result = await _rounds(
                host, coll, rounds, (reader[0] if reader and out else None, out, to[me]), (recv, come, source)
            )
        except CollectiveError:
            raise  # the ring itself broke: no barrier can complete
        except Exception as exc:  # this rank's own failure, after the last round
            failure = exc
        await coll.barrier()  # every receiver published or aborted: a prune may see the step
        if failure is not None:
            raise failure
    finally:
        if reader is not None:
            await reader[0].aclose()
    sent, received = result
    return Moved(sent, received, offers[source].record if received else None)


def _pieces(size: int) -> int:
    return -(-size // PIECE)


async def _opened(host: StepHost, uri: str) -> tuple[Sink, Manifest] | None:
    """The object at ``uri`` open for reading, with its sealed manifest; None (nothing to
    send) if it is missing, unreadable or carries no checksums: the peer then has no copy."""
    sink = await host.storage.handle(uri)
    try:
        await sink.open_read(defeat_cache=True)
        manifest = await state_manifest(sink, await sink.size(), uri)
    except Exception as exc:
        await sink.aclose()
        log.warning("%s cannot be read for its replica: %s", uri, exc)
        return None
    if manifest is None or not manifest.chunk_crc32c or PIECE % manifest.chunk_size:
        await sink.aclose()
        log.warning("%s carries no checksums a replica can be checked against: not replicated", uri)
        return None
    return sink, manifest


async def _rounds(
    host: StepHost,
    coll: Collectives,
    rounds: int,
    out: tuple[Sink | None, Manifest | None, int],
    come: tuple[str | None, Manifest | None, int],
) -> tuple[int, int]:
    """The lockstep rounds; (bytes sent, bytes received and published).

    Pipelined over :data:`DEPTH` pairs of buffers: while piece ``k`` goes through the transport,
    the next pieces are read from the local tier (one read at a time) and the previous ones
    checked and written (up to DEPTH writes at once). A failure
    each way (a read of what this rank sends; a check or write of what it receives) is kept,
    and the rounds go on: the peers wait for each one."""
    reader, sending, dest = out
    uri, receiving, source = come
    area = mmap.mmap(-1, 2 * DEPTH * PIECE)  # page-aligned: O_DIRECT reads and writes take it
    view = memoryview(area)
    sends = [view[i * PIECE : (i + 1) * PIECE] for i in range(DEPTH)]
    recvs = [view[(DEPTH + i) * PIECE : (DEPTH + i + 1) * PIECE] for i in range(DEPTH)]
    writer: Sink | None = None
    errors: dict[str, Exception] = {}  # "send", "receive": the first failure each way

    async def read(k: int, before: asyncio.Future[None] | None) -> None:
        if before is not None:  # one read at a time, ahead of the ring (measured: up to three at
            await asyncio.wait([before])  # once beside the writes took 14 % longer, median)
        n = _span(sending, k * PIECE) if reader is not None else 0
        if n and reader is not None and sending is not None:
            try:
                await read_exact(reader, k * PIECE, sends[k % DEPTH][:n], str(sending.object))
            except Exception as exc:  # sent anyway: the peer's check fails, nothing is published
                errors.setdefault("send", exc)

    async def write(k: int) -> None:
        n = _span(receiving, k * PIECE) if writer is not None else 0
        if not n or "receive" in errors or writer is None or receiving is None:
            return
        bad = await _check(host, receiving, recvs[k % DEPTH][:n], k * PIECE, uri)
        if bad is not None:
            errors["receive"] = bad
            return
        try:
            await writer.write_part(k * PIECE, recvs[k % DEPTH][:n])
        except Exception as exc:  # a full disk: the ring goes on, nothing is published
            errors["receive"] = exc

    reads: dict[int, asyncio.Future[None]] = {}  # read ahead, each after the one before
    writes: deque[tuple[int, asyncio.Future[None]]] = deque()  # written behind, in round order
    try:
        if uri is not None and receiving is not None:
            writer = await host.storage.handle(uri)
            try:
                writer.check()
                await writer.start()
                await writer.open(receiving.size)
            except Exception as exc:
                errors["receive"] = exc
        for k in range(min(DEPTH - 1, rounds)):
            reads[k] = asyncio.ensure_future(read(k, reads.get(k - 1)))
        for k in range(rounds):
            await reads.pop(k)
            ahead = k + DEPTH - 1  # into the buffer round k - 1 sent from: free
            if ahead < rounds:  # after the newest read (already popped, so done, if DEPTH is 2)
                reads[ahead] = asyncio.ensure_future(read(ahead, reads.get(ahead - 1)))
            while writes and writes[0][0] <= k - DEPTH:  # recvs[k % DEPTH] written out
                await writes.popleft()[1]
            mine = _span(sending, k * PIECE) if reader is not None else 0
            theirs = _span(receiving, k * PIECE) if writer is not None else 0
            await coll.sendrecv(
                sends[k % DEPTH][:mine] if mine else None,
                dest,
                recvs[k % DEPTH][:theirs] if theirs else None,
                source,
            )
            writes.append((k, asyncio.ensure_future(write(k))))
        while writes:
            await writes.popleft()[1]
        if writer is not None and receiving is not None:
            if "receive" in errors:
                await writer.abort()
            else:
                await commit(writer)
    except BaseException:
        tasks = [*reads.values(), *(task for _, task in writes)]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if writer is not None:
            await writer.abort()
        raise
    finally:
        if writer is not None:
            await writer.aclose()
        for v in (*sends, *recvs, view):
            v.release()
        close_mapping(area)
    if errors:
        raise errors.get("receive") or errors["send"]
    sent = sending.size if sending is not None and reader is not None else 0
    return sent, receiving.size if writer is not None and receiving is not None else 0


def _span(manifest: Manifest | None, offset: int) -> int:
    return 0 if manifest is None else max(0, min(PIECE, manifest.size - offset))


async def _check(
    host: StepHost, manifest: Manifest, view: memoryview, offset: int, uri: str | None
) -> Exception | None:
    """A ChecksumMismatchError naming the first bad offset of a received piece, or None."""
    chunk = offset // manifest.chunk_size
    count = -(-len(view) // manifest.chunk_size)
    bad = await run_blocking(host.runtime.executor(), first_bad, manifest, view, chunk, count)
    if bad is None:
        return None
    at = bad.chunk * manifest.chunk_size
    return ChecksumMismatchError(
        f"replica {uri!r}: the {manifest.chunk_span(bad.chunk)[1]}-byte block received at offset {at} "
        "differs from the CRC32C the sender's header recorded; nothing published",
        chunk=bad.chunk,
        offset=at,
    )


class Replicator:
    """The replicas of one manager's steps: one step at a time, in step order, on every rank
    (each is a collective on a side channel of its own, so it never interleaves with the
    save commits' collectives)."""

    def __init__(self, host: StepHost, local: str) -> None:
        self.host, self.local = host, local
        self.ring: Ring | None = None
        self._coll: Collectives | None = None
        self._tasks: dict[int, asyncio.Task[Moved]] = {}
        self._last: asyncio.Task[Moved] | None = None

    async def start(self, coll: Collectives) -> None:
        """Find each rank's peer (collective); ConfigError for a job on one node."""
        hosts = await coll.all_gather_object(host())
        self.ring = Ring.of(hosts)
        self._coll = await coll.duplicate()

    def name(self, rank: int) -> str:
        assert self._coll is not None
        return rank_object(rank, self._coll.world_size)

    def source(self) -> int:
        """The rank whose objects this rank's node holds as replicas."""
        assert self.ring is not None and self._coll is not None
        return self.ring.source(self._coll.rank)

    def replicate(self, step: int, *, receive: bool = True) -> asyncio.Task[Moved]:
        """Send this rank's object of ``step`` to its peer (if the peer receives) and take its
        source's (``receive``), after the replicas of earlier steps. Collective: every rank
        calls it for every locally committed step, and for every resumed one."""
        self._tasks = {s: t for s, t in self._tasks.items() if not t.done()}
        task = asyncio.create_task(self._after(step, receive, self._last), name=f"asyncckpt-replica {step}")
        self._tasks[step], self._last = task, task
        return task

    async def _after(self, step: int, receive: bool, previous: asyncio.Task[Moved] | None) -> Moved:
        if previous is not None:
            await asyncio.wait([previous])
        assert self.ring is not None and self._coll is not None
        base = step_uri(self.local, step)
        me = self._coll.rank
        # the step's index files are in rank 0's node's directory only: every node gets them,
        # so that any node's copy of the step stands alone (drained, or handed back)
        files = await self._coll.broadcast_object(await self._step_files(base) if me == 0 else None)
        if files is not None:
            await self._put_missing(base, files["files"])
        return await transfer(
            self.host,
            self._coll,
            self.ring.peer,
            send=f"{base}/{self.name(me)}",
            recv=f"{base}/{self.name(self.source())}" if receive else None,
        )

    def missing(self, own: list[set[int]], held: list[set[int]]) -> dict[int, tuple[bool, bool]]:
        """Steps every rank holds whose replica some peer lacks (a run killed mid-replica, a
        replaced node), each with (this rank sends its own, receives its source's)."""
        assert self.ring is not None and self._coll is not None
        peer, me, source = self.ring.peer, self._coll.rank, self.source()
        out = {}
        for step in sorted(set.intersection(*own) if own else set()):
            lacking = [step not in held[peer[r]] for r in range(len(own))]
            if any(lacking):
                out[step] = (lacking[me], lacking[source])
        return out

    async def _step_files(self, base: str) -> dict[str, Any] | None:
        """The step's commit record and the index files it names (checked against the CRC32C
        it gives them), handed with a replica to a node that lost the step: without them its
        copy could not be drained, nor loaded on another number of ranks. None when they
        cannot be read (logged): never raises, since the other ranks wait in the same round."""
        try:
            commit = await get_record(self.host, f"{base}/{COMMIT}")
            if commit is None:
                return None
            sums: dict[str, str | None] = dict(commit.get("checksums") or {})
            if not sums:  # a record written before it gave them: the indexes, unchecked
                sums = {name: None for name in (commit.get("index"), HF_INDEX) if name}
            files = {}
            for name, expected in sums.items():
                raw = await get_index_bytes(self.host, f"{base}/{name}", expected)
                if raw is not None:
                    files[name] = raw
        except Exception as exc:
            log.warning("%s: the commit record or an index file cannot be read for the peers: %s", base, exc)
            return None
        return {"commit": commit, "files": files}

    async def _put_missing(self, base: str, files: dict[str, bytes]) -> bool:
        """The step's index files this node's directory lacks, published (each atomically: two
        ranks of one node writing the same bytes at once is harmless). False when one cannot
        be (logged): never raises, as for :meth:`_step_files`."""
        try:
            for name, raw in files.items():
                if not await exists(self.host, f"{base}/{name}"):
                    await put_raw(self.host, f"{base}/{name}", raw)
        except Exception as exc:
            log.warning("%s: an index file from the peers cannot be written: %s", base, exc)
            return False
        return True

    def restorable(self, own: list[set[int]], held: list[set[int]]) -> set[int]:
        """Steps every rank holds on its node (``own[r]``) or its peer's node holds a replica
        of (``held[peer]``): restorable without the remote."""
        if self.ring is None or not own:
            return set()
        peer = self.ring.peer
        every = set().union(*own, *held)
        return {s for s in every if all(s in own[r] or s in held[peer[r]] for r in range(len(own)))}

    async def fetch_back(self, step: int, lacks: Sequence[bool], remote: str | None) -> str:
        """Collective: the ranks that lost their object of ``step`` (``lacks[r]``) get it back
        from their peers' replicas, with the step's commit record and index files. Returns why
        this rank, lacking it, did not get it ("" if it did, or did not need it): it then loads
        the copy at ``remote``; without one, AsyncCkptError. A rank that only gives logs its
        failure."""
        assert self.ring is not None and self._coll is not None
        base = step_uri(self.local, step)
        me, source = self._coll.rank, self.source()
        wants = lacks[me]
        if wants:  # a replaced node's disk: not even the step's directory is there
            try:
                await make_directory(self.host, base)
            except Exception as exc:  # then it takes part without receiving: its peer sends nothing
                log.warning("%s cannot be made for step %d's objects from the peers: %s", base, step, exc)
                wants = False
        giving = lacks[source] and not lacks[me]
        record = await self._step_files(base) if giving else None
        back = [self.ring.source(r) for r in range(self._coll.world_size)]  # replicas go home
        try:
            moved = await transfer(
                self.host,
                self._coll,
                back,
                send=f"{base}/{self.name(source)}" if giving else None,
                recv=f"{base}/{self.name(me)}" if wants else None,
                record=record,
            )
        except Exception as exc:
            if not lacks[me]:
                log.warning("could not give step %d's replica back to rank %d: %s", step, source, exc)
                return ""
            why = f"the peer's replica of step {step} could not be fetched: {type(exc).__name__}: {exc}"
        else:
            if not lacks[me]:
                return ""
            if moved.received:  # the commit record last, once what it names is there
                got = moved.record
                if (
                    got is not None
                    and await get_record(self.host, f"{base}/{COMMIT}") is None
                    and await self._put_missing(base, got["files"])
                ):
                    await put_record(self.host, f"{base}/{COMMIT}", got["commit"])
                return ""
            why = f"the peer's replica of step {step} was not there to fetch"
        if remote is None:
            raise AsyncCkptError(
                f"{why}, and the remote root has no committed step {step}: it cannot be restored"
            )
        log.warning("%s: restoring from %s", why, remote)
        return why

    async def settled(self, step: int) -> None:
        """Until the replica of ``step`` is written (before its step directory is deleted)."""
        task = self._tasks.get(step)
        if task is not None:
            await asyncio.wait([task])

    async def wait(self) -> None:
        """Until every replica started so far is written. Never cancelled: a rank that left the
        ring midway would hold every other rank in it."""
        while pending := [t for t in self._tasks.values() if not t.done()]:
            await asyncio.wait(pending)

    def close(self) -> None:
        coll, self._coll = self._coll, None
        if coll is not None:
            coll.close()

"""An object's synthetic chunks generated back to back in one thread, ahead of their requests.

Why: a writer process used to answer each chunk's request by handing one generation to a
worker thread, and the next generation started only once the event loop had seen the first
one finish and admitted the next request. On the 2-core VM, where the generator, the client
library's runtime and the server share the cores, those hand-offs left the generator idle
between consecutive chunks for 0.07-0.11 s of a 1.35 s save (timestamps taken in ``_generate``), where
s3dlio used directly, generating in a plain loop, lost 0.03 s. Here one thread reserves,
fills and commits chunk after chunk, as that loop does, and hands each committed chunk to a
second thread for its CRC32C; a request only collects its chunk's figures. At most
:data:`AHEAD` chunks are generated and not yet collected: their memory is the library's.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass

from ...blocking import run_blocking
from ...checksum import timed_crc

#: generated chunks not yet collected by a request: one being collected, one just committed,
#: one being generated (the requests of a writer process arrive two at a time by default)
AHEAD = 3


@dataclass(frozen=True)
class Placed:
    """A chunk generated in a library's memory and committed: ``view`` stays readable after
    the commit (s3dlio's ``reserve()`` guarantees it), so its CRC32C is taken over the very
    bytes uploaded while the next chunk is being generated."""

    view: memoryview
    fill_s: float
    write_s: float


@dataclass(frozen=True)
class Collected:
    """One chunk's figures: its generation and the library's calls, timed in the generating
    thread; its CRC32C and the seconds it took, in the checksum thread (None and 0 when the
    save takes no checksums); whether all that was done before its request came (the
    generating thread ran ahead)."""

    placed: Placed
    checksum: int | None
    checksum_s: float
    ready_when_asked: bool = False


class Ahead:
    """Runs ``make(nbytes) -> Placed`` for each chunk of ``layout`` ((offset, nbytes), in
    order) in its own thread; :meth:`take` waits for one chunk's figures. :meth:`stop` ends
    the threads (after the last chunk, or on abort) and releases what was never collected.
    ``checksums=False`` (``integrity="none"``): no CRC32C is computed; the second thread
    still hands each chunk to the loop, so the generating thread never wakes it."""

    def __init__(
        self,
        make: Callable[[int], Placed],
        layout: Sequence[tuple[int, int]],
        executor: Executor,
        *,
        checksums: bool = True,
    ) -> None:
        self._make = make
        self._checksums_on = checksums
        self._executor = executor  # joins the threads (run_blocking: never abandoned)
        self._layout = {offset: nbytes for offset, nbytes in layout}
        self._order = [offset for offset, _ in layout]
        self._loop = asyncio.get_running_loop()
        self._made: dict[int, asyncio.Future[Collected]] = {
            offset: self._loop.create_future() for offset in self._order
        }
        self._held: dict[int, Placed] = {}  # generated, view not yet released
        self._lock = threading.Lock()  # guards _held between the threads and the loop
        self._slots = threading.Semaphore(AHEAD)
        self._stopping = False
        self._checksums = ThreadPoolExecutor(1, thread_name_prefix="asyncckpt-crc")
        #: the generating thread (joined by ``stop``)
        self.thread = threading.Thread(target=self._run, name="asyncckpt-generate", daemon=True)
        self.thread.start()

    # -- the generating thread ---------------------------------------------------------
    def _run(self) -> None:
        for offset in self._order:
            self._slots.acquire()
            if self._stopping:
                return
            try:
                placed = self._make(self._layout[offset])
            except BaseException as exc:  # this chunk's request and every later one report it
                for later in self._order[self._order.index(offset) :]:
                    self._deliver(later, None, exc)
                return
            with self._lock:
                self._held[offset] = placed
            # the checksum thread hands the chunk to the loop once it has its CRC32C: waking
            # the loop from here would take the GIL from this thread between two chunks
            self._checksums.submit(self._checksum, offset, placed)

    def _checksum(self, offset: int, placed: Placed) -> None:
        if not self._checksums_on:
            self._deliver(offset, Collected(placed, None, 0.0), None)
            return
        try:
            value, seconds, _ = timed_crc(placed.view)
        except BaseException as exc:
            self._deliver(offset, None, exc)
        else:
            self._deliver(offset, Collected(placed, value, seconds), None)

    def _deliver(self, offset: int, value: Collected | None, exc: BaseException | None) -> None:
        def settle() -> None:
            fut = self._made[offset]
            if fut.done():  # stopped meanwhile
                return
            if value is not None:
                fut.set_result(value)
            else:
                fut.set_exception(exc if exc is not None else RuntimeError("no chunk was made"))

        with contextlib.suppress(RuntimeError):  # a closed loop: nobody will ask for it
            self._loop.call_soon_threadsafe(settle)

    # -- the requests (on the loop) ----------------------------------------------------
    async def take(self, offset: int, nbytes: int) -> Collected:
        """The figures of the chunk at ``offset`` once generated and checksummed; its memory
        is then returned to the library. Cancelled, the chunk stays held until :meth:`stop`."""
        if self._layout.get(offset) != nbytes:
            raise RuntimeError(f"chunk ({offset}, {nbytes}) is not in the generated layout")
        made = self._made[offset]
        ready = made.done()
        collected = await made
        self._release(offset)
        return dataclasses.replace(collected, ready_when_asked=ready)

    def _release(self, offset: int) -> None:
        with self._lock:
            placed = self._held.pop(offset, None)
        if placed is not None:
            placed.view.release()
            self._slots.release()

    async def stop(self) -> None:
        """End both threads and release every chunk not collected (blocking joins run in a
        thread of their own: a generation in progress ends first, it cannot be interrupted)."""
        self._stopping = True
        self._slots.release(AHEAD + 1)  # a generating thread waiting for a slot sees the stop
        await run_blocking(self._executor, self._join)
        with self._lock:
            left, self._held = list(self._held.values()), {}
        for placed in left:
            placed.view.release()
        for fut in self._made.values():
            if fut.done() and not fut.cancelled():
                fut.exception()  # retrieved: a failure was reported by its request, or by none
            else:
                fut.cancel()

    def _join(self) -> None:
        self.thread.join()
        self._checksums.shutdown(wait=True)

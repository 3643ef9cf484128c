"""The bench's progress bar on a terminal (rich): bytes, rate, ETA and the current bottleneck.

Only the CLI imports this module; the library reports progress through a plain callback. Not
on a terminal (piped, redirected, CI logs) or with ``-q`` there is no bar at all, so the
output is the summary alone. The bottleneck is read from the waits of the last
:data:`WINDOW` chunks: a producer waiting for free buffers means storage is the slower side,
storage waiting for data means generation (saves) or the consumer (loads) is.
"""

from __future__ import annotations

import contextlib
import sys
from collections import deque
from collections.abc import Iterator
from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from ..results.metrics import CONSUMER, GENERATION, IO, ChunkRecord, ReadRecord

WINDOW = 8


class Bar:
    """One operation's bar; call it with bytes done, and ``chunk(rec)`` with each record."""

    def __init__(self, total: int, label: str, console: Console) -> None:
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(binary_units=True),
            TransferSpeedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            TextColumn("bottleneck: {task.fields[bottleneck]}"),
            console=console,
        )
        self._task = self._progress.add_task(label, total=total, bottleneck="-")
        self._waits: deque[tuple[float, float]] = deque(maxlen=WINDOW)  # (storage slower, other slower)

    def __enter__(self) -> Bar:
        self._progress.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._progress.stop()

    def __call__(self, nbytes: int) -> None:
        self._progress.advance(self._task, nbytes)

    def chunk(self, rec: ChunkRecord | ReadRecord) -> None:
        if isinstance(rec, ReadRecord):  # the consumer waiting for reads: storage is slower
            self._waits.append((rec.wait_data_s, rec.wait_free_s))
            other = CONSUMER
        else:  # the producer waiting for free buffers: storage is slower
            self._waits.append((rec.wait_free_s, rec.wait_data_s))
            other = GENERATION
        io_slower = sum(w[0] for w in self._waits) >= sum(w[1] for w in self._waits)
        self._progress.update(self._task, bottleneck=IO if io_slower else other)


@contextlib.contextmanager
def progress_bar(total: int, label: str, enabled: bool) -> Iterator[Bar | None]:
    """A :class:`Bar` on stderr when ``enabled`` and stderr is a terminal, else ``None``."""
    if not enabled or total <= 0 or not sys.stderr.isatty():
        yield None
        return
    with Bar(total, label, Console(file=sys.stderr)) as bar:
        yield bar

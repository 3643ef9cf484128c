"""What ``save_state`` / ``load_state`` return, and the handle of a background (staged) save."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

from ..errors import SaveAbandonedError
from ..modes import StagingMode as StagingMode  # re-exported: asyncckpt.state.StagingMode
from ..modes import choices
from ..results.records import LoadResult, SaveResult
from ..sinks.loops import orphaned

STAGING_MODES = choices(StagingMode)


@dataclass(frozen=True, kw_only=True)
class StateSaveResult:
    """One state save. ``blocked_s``: how long the caller could not touch its arrays.

    With ``staging="none"`` that is the whole save; with ``"host"`` it is the target's check,
    the wait for the previous staged save (``waited_s``), the layout and the copy into the
    staging area (``copy_s``).
    ``prepass_s`` is the CRC32C pass that lets the header be written first.
    """

    uri: str
    staging: StagingMode
    blocked_s: float
    waited_s: float
    copy_s: float
    prepass_s: float
    tensors: int
    tensor_bytes: int
    header_bytes: int
    copied_contiguous: tuple[str, ...]  # tensors whose bytes had to be rearranged (see arrays.py)
    save: SaveResult
    #: every tensor's name in the object, in file order: what a step's Hugging Face index maps
    #: to objects (not in ``to_dict``: the object's header lists them)
    tensor_names: tuple[str, ...] = ()
    #: each tensor's name, dtype, shape, object byte range (and box of a sharded leaf)
    layout: tuple[dict[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k not in ("save", "tensor_names", "layout")}
        out["copied_contiguous"] = list(self.copied_contiguous)
        out["save"] = self.save.to_dict()
        return out


class StagedSave:
    """A ``staging="host"`` save writing in the background: ``await`` it for the result.

    The caller's arrays were copied before this handle was returned (``blocked_s``); the
    result arrives once the object is durable and published at its URI. The write runs on
    the event loop that started it: if that loop ends first (``asyncio.run`` returned), the
    write is abandoned, nothing is published, an error naming the URI is logged and awaiting
    this raises :class:`~asyncckpt.errors.SaveAbandonedError`.
    """

    def __init__(self, task: asyncio.Task[StateSaveResult], *, uri: str, blocked_s: float) -> None:
        self._task = task
        self.uri = uri
        self.blocked_s = blocked_s

    def done(self) -> bool:
        """True once the write finished (successfully or not) or was abandoned."""
        return self._task.done() or orphaned(self._task)

    def cancelled(self) -> bool:
        """True when the write was cancelled: its loop ended (and cancelled it) first."""
        return self._task.cancelled()

    def abandoned(self) -> bool:
        """True when the write was given up before it finished: its event loop ended first."""
        return self._task.cancelled() or orphaned(self._task)

    def abandoned_text(self) -> str:
        """What is logged and raised for an abandoned write: its URI, and what to do."""
        return (
            f"the staged save of {self.uri} was abandoned before it finished: its event loop ended "
            "first, and nothing was published there; await the StagedSave (or aclose() the "
            "checkpointer or manager) before the loop ends"
        )

    async def settled(self) -> None:
        """Until the write is over, never raising; a cancelled caller leaves it running."""
        if not self.done():
            await asyncio.wait([self._task])

    def add_done_callback(self, fn: Callable[[StagedSave], object]) -> None:
        """Call ``fn(self)`` once the background write has ended (written, failed or cancelled)."""
        self._task.add_done_callback(lambda _: fn(self))

    async def wait(self) -> StateSaveResult:
        """The result once the data is durable; raises what the background write raised."""
        await self.settled()
        if self.abandoned():
            raise SaveAbandonedError(self.abandoned_text())
        return self._task.result()

    def __await__(self) -> Generator[Any, None, StateSaveResult]:
        return self.wait().__await__()


@dataclass(frozen=True, kw_only=True)
class StateLoadResult:
    """A loaded state and how it was checked (``verified`` False says why in ``verification``)."""

    state: dict[Any, Any]
    verified: bool
    verification: str
    tensors: int
    tensor_bytes: int
    in_place: bool
    load: LoadResult
    metadata: dict[str, str] = field(default_factory=dict)  # the header's __metadata__ (user keys)

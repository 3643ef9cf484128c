"""The bench writes only where it may, and removes only what it wrote.

A target that exists and is not an asyncckpt checkpoint (someone's ``model.pt``) is refused
before the first byte unless ``--overwrite``; checkpoints, sealed or from an older save, are
the bench's own kind and may be replaced. Each object is checked the first time a run writes
it (directory layouts: per rank, per object), and at the end the run removes exactly the
objects its saves published, never one it only planned.
"""

from __future__ import annotations

from typing import Any

from .. import steps
from ..checkpointer import AsyncCheckpointer
from ..errors import IntegrityError, TargetExistsError
from ..results.records import SaveResult

WRITTEN_BY = "asyncckpt"  # marks the bench's records, so a re-run may replace them


class Writes:
    """Saves through ``ckpt``, refusing foreign objects and remembering what it published."""

    def __init__(self, ckpt: AsyncCheckpointer, *, overwrite: bool) -> None:
        self.ckpt = ckpt
        self.overwrite = overwrite
        self._checked: set[str] = set()
        self.created: list[str] = []

    async def check(self, uri: str) -> None:
        """Refuse ``uri`` if it holds something that is not an asyncckpt checkpoint."""
        if uri in self._checked:
            return
        if not self.overwrite and await self.ckpt.probe(uri) == "foreign":
            raise _refusal(uri, "an asyncckpt checkpoint")
        self._checked.add(uri)

    async def save(self, uri: str, size: int, **options: Any) -> SaveResult:
        await self.check(uri)
        result = await self.ckpt.save(uri, size, **options)
        self._published(uri)
        return result

    async def put_record(self, uri: str, record: dict[str, Any]) -> None:
        """Publish a small JSON record (a step's commit record) the run will also remove; one
        that exists is replaced only if an asyncckpt run wrote it (``written_by``)."""
        if uri not in self.created and not self.overwrite:
            try:
                existing = await steps.get_record(self.ckpt, uri)
            except IntegrityError:
                existing = {}
            if existing is not None and existing.get("written_by") != WRITTEN_BY:
                raise _refusal(uri, "a record asyncckpt wrote")
        await steps.put_record(self.ckpt, uri, {**record, "written_by": WRITTEN_BY})
        self._published(uri)  # after its step's objects: removed first (the list is popped)

    def _published(self, uri: str) -> None:
        if uri not in self.created:
            self.created.append(uri)

    async def remove_created(self) -> None:
        """Delete what this run's saves published (``--keep`` skips this)."""
        while self.created:
            await self.ckpt.delete(self.created.pop())


def _refusal(uri: str, what: str) -> TargetExistsError:
    return TargetExistsError(
        f"{uri!r} exists and is not {what}: refusing to overwrite (and later delete) it; "
        "choose another target, or pass --overwrite to replace it"
    )

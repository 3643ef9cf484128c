"""The commit point of a save: one atomic step, never torn by a cancellation.

A sealed object (data and manifest in one, see :mod:`asyncckpt.engine.seal`) becomes visible when
its backend commits it: a rename, a CompleteMultipartUpload, the close of an append stream.
A cancellation (task cancel, ``wait_for`` timeout, Ctrl-C in ``asyncio.run``) that arrives
while that step runs waits for it, so the caller is never left guessing: every exception a
save raises says whether the new checkpoint was published (``asyncckpt_published`` and a note).
"""

from __future__ import annotations

import asyncio
import contextlib

from .base import Sink


def note_publication(exc: BaseException, uri: str, *, published: bool | None) -> None:
    """Tell the caller, on the exception itself, what became of the checkpoint at ``uri``."""
    if getattr(exc, "asyncckpt_published", "unset") != "unset":
        return  # the innermost account is the true one
    exc.asyncckpt_published = published  # type: ignore[attr-defined]
    if published:
        exc.add_note(
            f"asyncckpt: the new checkpoint at {uri!r} was published (complete and verified-loadable)"
        )
    elif published is None:
        exc.add_note(
            f"asyncckpt: unknown whether the new checkpoint at {uri!r} was published (its commit failed "
            "mid-way); either the previous or the new one is there, complete"
        )
    else:
        exc.add_note(f"asyncckpt: nothing was published at {uri!r}; a checkpoint that was there is intact")


async def commit(sink: Sink) -> dict[str, float]:
    """``sink.complete()``, finished even if the caller is cancelled meanwhile."""
    task = asyncio.ensure_future(sink.complete())
    task.add_done_callback(lambda t: setattr(sink, "committed", not t.cancelled() and t.exception() is None))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError as cancel:
        while not task.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([task])
        failed = task.exception() if not task.cancelled() else None
        note_publication(cancel, sink.uri, published=not task.cancelled() and failed is None)
        raise
    except BaseException as exc:
        note_publication(exc, sink.uri, published=None)
        raise

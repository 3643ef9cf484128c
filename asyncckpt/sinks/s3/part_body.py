"""A part's memoryview as an aiohttp request body that is never copied on the event loop.

Handing aiohttp (3.10+) a 32 MiB ``memoryview`` costs up to three copies of the part on the
event-loop thread under Python < 3.12.9, all into freshly allocated memory (page faults):

1. aiohttp coalesces the request head with the first body write, ``b"".join((head, body))``
   (``writelines`` is skipped on these Pythons, CVE-2024-12254);
2. asyncio's selector transport sends what the socket takes and slices the rest of that
   ``bytes`` (``data[n:]``, a copy);
3. and appends the rest to its ``bytearray`` write buffer (``extend``, a copy).

Measured with cProfile in a 512 MiB save against the discard endpoint (on the shared
development machine): ≈ 0.6 s of 1.1 s wall went to ``join``, ``write`` and ``extend`` on the
loop thread. :class:`PartBody` instead writes the view in ``piece``-sized slices and lets the
next slice go only once the transport's buffer is empty (write-buffer high-water mark 0 for
the duration of the body, restored after): each slice goes from the pool's memory straight
into ``socket.send``; only what the socket did not take of one slice is buffered (copied).
The head is joined with a small first slice only.

Used when nothing else must read the body (unsigned payload, no request checksum computed by
botocore): SHA-256 payload signing and botocore's own checksums need a bytes-like body.

The class derives from aiohttp's ``Payload``, and aiohttp (an optional dependency, imported
with aiobotocore) is slow to import, while this module is imported with the aiobotocore sink's
whenever a configuration's capabilities are checked: :func:`part_body_class` builds it on
first use.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aiohttp.payload import Payload

#: bytes per ``writer.write``: one ``socket.send`` each when the socket has room
PIECE = 256 * 1024
#: the first slice, which aiohttp joins (copies) together with the request head
HEAD_PIECE = 16 * 1024


@functools.cache
def part_body_class() -> type[Payload]:
    """``PartBody(view)``: the class, made once, with aiohttp imported here."""
    from aiohttp.abc import AbstractStreamWriter
    from aiohttp.http_writer import StreamWriter
    from aiohttp.payload import Payload

    class PartBody(Payload):
        """``view`` sent as is: slices of the caller's memory, each once the previous one left."""

        def __init__(self, view: memoryview, *, piece: int = PIECE) -> None:
            super().__init__(view, content_type="application/octet-stream")
            self._size = view.nbytes
            self._piece = piece

        def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
            raise TypeError("a part body is binary data")

        async def write(self, writer: AbstractStreamWriter) -> None:
            await self.write_with_length(writer, None)

        async def write_with_length(self, writer: AbstractStreamWriter, content_length: int | None) -> None:
            view: memoryview = self._value
            if view.format != "B" or view.ndim != 1:
                view = view.cast("B")
            if content_length is not None:
                view = view[:content_length]
            transport: Any = getattr(writer, "transport", None)
            limits = None
            if transport is not None and hasattr(transport, "set_write_buffer_limits"):
                limits = transport.get_write_buffer_limits()  # (low, high)
                transport.set_write_buffer_limits(high=0)  # paused while anything is buffered
            try:
                start = 0
                for end in (
                    min(HEAD_PIECE, len(view)),
                    *range(HEAD_PIECE + self._piece, len(view), self._piece),
                ):
                    if end > start:
                        await self._send(writer, transport, view[start:end])
                    start = end
                if start < len(view):
                    await self._send(writer, transport, view[start:])
            finally:
                if limits is not None and not transport.is_closing():
                    transport.set_write_buffer_limits(high=limits[1], low=limits[0])

        async def _send(self, writer: AbstractStreamWriter, transport: Any, piece: memoryview) -> None:
            if transport is None or not isinstance(writer, StreamWriter):
                await writer.write(piece)
                return
            await writer.write(piece, drain=False)  # what the socket does not take now is buffered
            await writer.drain()  # until the transport's buffer is empty (high-water mark 0)

    return PartBody

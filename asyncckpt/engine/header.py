"""A state object's safetensors header, asyncckpt's part of it: written by ``save_state``, read
for ``load_state`` and for a plain ``load``, which verifies a ``save_state`` object against the
checksums its header carries."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..blocking import read_full, run_blocking
from ..config import ALIGN
from ..errors import ChecksumMismatchError, StateFormatError
from ..sinks.base import Sink
from . import chunks, jsontext
from .manifest import Manifest
from .safetensors_format import (
    FORMAT_VALUE,
    K_CHUNK,
    K_CRCS,
    K_FORMAT,
    K_TREE,
    Header,
    header_crc_ok,
    header_length,
    parse_header,
)

FIRST_READ = 64 << 10  # the header of most states fits: one request instead of two


async def read_exact(sink: Sink, offset: int, view: memoryview, uri: str) -> None:
    got = await read_full(sink.read_into, offset, view)
    if got < len(view):
        raise StateFormatError(f"{uri!r} ended at offset {offset + got} while reading its header")


async def read_prefix(sink: Sink, size: int, uri: str) -> tuple[bytearray, Header]:
    """The length field and JSON header of a safetensors object, parsed and validated."""
    first = bytearray(min(size, FIRST_READ))
    await read_exact(sink, 0, memoryview(first), uri)
    n = header_length(bytes(first[:8]), size, uri)
    if 8 + n > len(first):
        # a new buffer, never ``first += ...``: a store's client (or anyio's idle worker, which
        # keeps its last call's arguments) may still hold a view of ``first``, and a bytearray
        # with a view cannot be resized (BufferError)
        whole = bytearray(8 + n)
        whole[: len(first)] = first
        await read_exact(sink, len(first), memoryview(whole)[len(first) :], uri)
        first = whole
    prefix = first[: 8 + n]
    # in a thread: a header of 10 000 tensors takes 0.1-0.2 s to parse and check
    return prefix, await run_blocking(sink.executor, parse_header, bytes(prefix[8:]), size, uri)


async def state_manifest(sink: Sink, size: int, uri: str) -> Manifest | None:
    """The whole-object manifest a ``save_state`` object carries in its header (so a plain
    ``load`` verifies it too), or None when the object is no asyncckpt safetensors file."""
    found = await state_header(sink, size, uri)
    return None if found is None else found[0]


async def state_header(sink: Sink, size: int, uri: str) -> tuple[Manifest, Any] | None:
    """(manifest, state tree) of a ``save_state`` object from one read of its header (a
    resharded load needs both of rank 0's object), or None as for :func:`state_manifest`."""
    try:
        prefix, header = await read_prefix(sink, size, uri)
    except StateFormatError:
        return None  # not a safetensors object at all
    if not is_ours(header.metadata):
        return None  # another writer's safetensors file: no checksums to verify against
    # in a thread: the tree's JSON and the header's CRC of 80 000 tensors take 0.1-0.4 s
    return await run_blocking(sink.executor, _manifest_and_tree, prefix, header, uri)


def _manifest_and_tree(prefix: bytearray, header: Header, uri: str) -> tuple[Manifest, Any]:
    tree, chunk, crcs = asyncckpt_metadata(header.metadata, uri)
    return header_manifest(prefix, header, uri, chunk, crcs), tree


def header_manifest(
    prefix: bytes | bytearray, header: Header, uri: str, chunk: int, crcs: list[int]
) -> Manifest:
    """The whole-object manifest of an asyncckpt header, once the header's own CRC32C holds."""
    if not header_crc_ok(bytes(prefix)):
        raise ChecksumMismatchError(
            f"checkpoint {uri!r} is corrupt: its header's CRC32C does not match", chunk=0, offset=0
        )
    return chunks.manifest_of(
        uri, header.size, chunk, chunks.object_chunk_crcs(prefix, crcs, header.size, chunk)
    )


def is_ours(meta: Mapping[str, str]) -> bool:
    """Whether a safetensors header was written by ``save_state`` (it carries checksums)."""
    return K_FORMAT in meta


def our_metadata(tree: Any, chunk: int) -> dict[str, str]:
    """What a ``save_state`` header says of itself beside the caller's metadata: the format,
    the state's tree and the chunk size (:func:`with_crcs` adds the chunks' CRC32Cs)."""
    return {K_FORMAT: FORMAT_VALUE, K_TREE: json.dumps(tree, separators=(",", ":")), K_CHUNK: str(chunk)}


def with_crcs(meta: Mapping[str, str], crcs: Sequence[int]) -> dict[str, str]:
    return {**meta, K_CRCS: chunks.encode(crcs)}


def asyncckpt_metadata(meta: dict[str, str], uri: str) -> tuple[Any, int, list[int]]:
    where = f"{uri!r}"
    if meta.get(K_FORMAT) != FORMAT_VALUE:
        raise StateFormatError(
            f"{where}: asyncckpt format {meta.get(K_FORMAT)!r}; this reader knows {FORMAT_VALUE!r}"
        )
    try:
        tree = jsontext.loads(meta[K_TREE])
        chunk = int(meta[K_CHUNK])
    except (KeyError, ValueError) as exc:
        raise StateFormatError(f"{where}: asyncckpt metadata is malformed ({exc})") from None
    if chunk < ALIGN or chunk % ALIGN:
        raise StateFormatError(f"{where}: asyncckpt.chunk_size {chunk} is not a multiple of {ALIGN}")
    crcs = chunks.decode(meta.get(K_CRCS, ""), where)
    return tree, chunk, crcs

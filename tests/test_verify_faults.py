"""Every fault a checkpoint can suffer gives its own error naming the problem and the offset."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from asyncckpt import AsyncCheckpointer, IntegrityError, TargetNotFoundError
from asyncckpt.errors import ChecksumMismatchError, ManifestError, ManifestMissingError, TruncatedError
from asyncckpt.sinks import MEMORY_STORE
from asyncckpt.units import MiB

from .conftest import flip_byte, to_legacy

CHUNK = 1 * MiB
SIZE = 5 * CHUNK + 4321


async def saved(
    tmp_path: Path, name: str = "ck.bin", size: int = SIZE, seed: int = 21, legacy: bool = False
) -> Path:
    """A checkpoint file; ``legacy``: as asyncckpt < 0.2 wrote it (data + sidecar manifest)."""
    target = tmp_path / name
    async with AsyncCheckpointer(chunk_size=CHUNK, num_buffers=3, seed=seed) as ckpt:
        await ckpt.save(target, size)
    if legacy:
        to_legacy(target)
    return target


async def load(target: Path | str, **kwargs: object) -> None:
    async with AsyncCheckpointer(chunk_size=CHUNK, num_buffers=3) as ckpt:
        await ckpt.load(target, **kwargs)  # type: ignore[arg-type]


def flip(path: Path, offset: int) -> None:
    flip_byte(path, offset, 0x40)


async def test_clean_checkpoint_passes_both_checks(tmp_path: Path) -> None:
    target = await saved(tmp_path)
    await load(target, verify=True)
    await load(target, verify="regenerate")


@pytest.mark.parametrize("verify", [True, "regenerate"])
@pytest.mark.parametrize("read_chunk", [None, 256 * 1024])
async def test_flipped_byte_in_the_middle(tmp_path: Path, verify: object, read_chunk: int | None) -> None:
    target = await saved(tmp_path)
    bad = 2 * CHUNK + 123_457
    flip(target, bad)
    with pytest.raises(
        ChecksumMismatchError, match=rf"chunk 2 of 6: .*first bad byte at offset {bad}\b"
    ) as exc:
        await load(target, verify=verify, read_chunk_size=read_chunk, num_readers=2)
    assert (exc.value.chunk, exc.value.offset) == (2, bad)
    await load(target, verify=False)  # pure reads do not check: that is what verify=False means


async def test_flipped_byte_in_caller_data_names_the_chunk(tmp_path: Path) -> None:
    target = tmp_path / "c.bin"
    async with AsyncCheckpointer(chunk_size=CHUNK, num_buffers=2) as ckpt:
        await ckpt.save(target, data=os.urandom(3 * CHUNK))
    flip(target, CHUNK + 10)
    with pytest.raises(ChecksumMismatchError, match=rf"chunk 1 of 3: .*bytes {CHUNK}\.\.{2 * CHUNK - 1}"):
        await load(target)


async def test_flipped_last_byte_of_unaligned_tail(tmp_path: Path) -> None:
    target = await saved(tmp_path)
    flip(target, SIZE - 1)
    with pytest.raises(ChecksumMismatchError, match=rf"chunk 5 of 6: .*offset {SIZE - 1}\b"):
        await load(target)


async def test_truncated_file_legacy(tmp_path: Path) -> None:
    target = await saved(tmp_path, legacy=True)
    os.truncate(target, 3 * CHUNK + 99)
    with pytest.raises(
        TruncatedError, match=rf"truncated: {3 * CHUNK + 99} bytes, its manifest says {SIZE}"
    ) as exc:
        await load(target, verify=False)  # caught before any data is read, whatever verify says
    assert exc.value.offset == 3 * CHUNK + 99
    assert "changed after the save" in str(exc.value)


async def test_missing_manifest_legacy(tmp_path: Path) -> None:
    target = await saved(tmp_path, legacy=True)
    (tmp_path / "ck.bin.manifest.json").unlink()
    with pytest.raises(ManifestMissingError, match=r"has no manifest: .* no sidecar"):
        await load(target)


async def test_missing_object(tmp_path: Path) -> None:
    with pytest.raises(TargetNotFoundError, match=r"absent\.bin"):
        await load(tmp_path / "absent.bin")


async def test_manifest_for_another_size_legacy(tmp_path: Path) -> None:
    small = await saved(tmp_path, "small.bin", size=2 * CHUNK, legacy=True)
    big = await saved(tmp_path, "big.bin", size=SIZE, legacy=True)
    shutil.copy(tmp_path / "small.bin.manifest.json", tmp_path / "big.bin.manifest.json")
    with pytest.raises(
        ManifestError, match=rf"describes {2 * CHUNK} bytes but the object has {SIZE}.*'small.bin'"
    ):
        await load(big)
    await saved(tmp_path, "big.bin", size=SIZE, legacy=True)  # fresh pair
    shutil.copy(tmp_path / "big.bin.manifest.json", tmp_path / "small.bin.manifest.json")
    with pytest.raises(TruncatedError, match=r"manifest names object 'big.bin', not 'small.bin'"):
        await load(small)


async def test_object_replaced_after_save_legacy(tmp_path: Path) -> None:
    target = await saved(tmp_path, seed=21, legacy=True)
    other = await saved(tmp_path, "other.bin", seed=22, legacy=True)  # same size, other bytes
    os.replace(other, target)
    with pytest.raises(ChecksumMismatchError, match=r"chunk 0 of 6: .*offset 0\b.*changed after the save"):
        await load(target)


async def test_corrupt_manifest_legacy(tmp_path: Path) -> None:
    target = await saved(tmp_path, legacy=True)
    sidecar = tmp_path / "ck.bin.manifest.json"
    sidecar.write_bytes(sidecar.read_bytes()[:50])
    with pytest.raises(ManifestError, match="unreadable"):
        await load(target)
    sidecar.write_text('{"format": "something-else"}')
    with pytest.raises(ManifestError, match="not an asyncckpt-manifest"):
        await load(target)


async def test_failed_save_keeps_previous_checkpoint_verifiable(tmp_path: Path) -> None:
    target = await saved(tmp_path)

    def failing() -> object:
        yield bytes(CHUNK)
        raise RuntimeError("boom")

    async with AsyncCheckpointer(chunk_size=CHUNK, num_buffers=2) as ckpt:
        with pytest.raises(RuntimeError, match="boom"):
            await ckpt.save(target, 3 * CHUNK, data=failing())
        result = await ckpt.load(target, verify="regenerate")  # old object and manifest intact
    assert result.size_bytes == SIZE


async def test_object_published_without_manifest_is_incomplete_legacy(tmp_path: Path) -> None:
    """A crash between publishing the object and writing its manifest (simulated: no sidecar)."""
    target = await saved(tmp_path, legacy=True)
    os.replace(tmp_path / "ck.bin.manifest.json", tmp_path / "elsewhere.json")
    async with AsyncCheckpointer(chunk_size=CHUNK, num_buffers=2) as ckpt:
        with pytest.raises(ManifestMissingError, match="has no manifest"):
            await ckpt.load(target)


async def test_truncated_sealed_file_has_no_manifest(tmp_path: Path) -> None:
    """Truncation cuts the footer off: nothing left to trust, and the load says why."""
    target = await saved(tmp_path)
    os.truncate(target, 3 * CHUNK + 99)
    with pytest.raises(ManifestMissingError, match=r"does not end with one \(it was truncated"):
        await load(target, verify=False)


async def test_corrupt_sealed_manifest(tmp_path: Path) -> None:
    target = await saved(tmp_path)
    raw = target.read_bytes()
    start = -(-SIZE // 4096) * 4096
    target.write_bytes(raw[:start] + b"{not json" + raw[start + 9 :])
    with pytest.raises(ManifestError, match="unreadable"):
        await load(target)


async def test_sealed_object_replaced_by_another_sealed_one_loads_the_new_one(tmp_path: Path) -> None:
    """The manifest travels with its object: a replaced checkpoint is simply the new one."""
    target = await saved(tmp_path, seed=21)
    other = await saved(tmp_path, "other.bin", seed=22)
    os.replace(other, target)
    await load(target, verify="regenerate")


async def test_memory_object_corrupted() -> None:
    uri = "memory://faults/flip"
    async with AsyncCheckpointer(chunk_size=CHUNK, num_buffers=2, seed=3) as ckpt:
        await ckpt.save(uri, 2 * CHUNK)
        data = bytearray(MEMORY_STORE[uri])
        data[CHUNK + 5] ^= 1
        MEMORY_STORE[uri] = bytes(data)
        with pytest.raises(IntegrityError, match=rf"chunk 1 of 2: .*offset {CHUNK + 5}\b"):
            await ckpt.load(uri)
        await ckpt.delete(uri)

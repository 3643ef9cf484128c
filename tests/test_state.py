"""save_state / load_state on real files: round trips, safetensors interop, staging modes, faults."""

from __future__ import annotations

import asyncio
import json
import os
import struct
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import safetensors
import safetensors.numpy
import safetensors.torch
import torch

from asyncckpt import (
    AsyncCheckpointer,
    ChecksumMismatchError,
    ConfigError,
    IntegrityError,
    Shard,
    SourceChangedError,
    StateFormatError,
)
from asyncckpt.engine.safetensors_format import ALIGN
from asyncckpt.state import StagedSave

CHUNK = 64 * 1024  # small chunks: tensors and the header span several of them

NUMPY_DTYPES = [
    np.bool_,
    np.uint8,
    np.int8,
    np.int16,
    np.uint16,
    np.int32,
    np.uint32,
    np.int64,
    np.uint64,
    np.float16,
    np.float32,
    np.float64,
    np.complex64,
]


def ckpt(**kw: Any) -> AsyncCheckpointer:
    return AsyncCheckpointer(chunk_size=kw.pop("chunk_size", CHUNK), num_buffers=3, **kw)


def sample(dtype: Any, shape: tuple[int, ...], seed: int = 0) -> np.ndarray[Any, Any]:
    raw = np.random.default_rng(seed).integers(0, 256, size=int(np.prod(shape)) * np.dtype(dtype).itemsize)
    array = raw.astype(np.uint8).view(dtype).reshape(shape)
    return array if dtype is not np.bool_ else array.view(np.uint8) % 2 == 1


def floats(shape: tuple[int, ...], seed: int = 0) -> np.ndarray[Any, Any]:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def numpy_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        f"a_{np.dtype(d).name}": sample(d, (33, 7), i) for i, d in enumerate(NUMPY_DTYPES)
    }
    state["big"] = sample(np.float32, (300, 257), 99)  # > 4 chunks
    state["zero_d"] = np.array(3.5, dtype=np.float64)
    state["empty"] = np.zeros((0, 5), dtype=np.int32)
    state["strided"] = sample(np.int64, (40, 30), 7)[::3, 1::2]
    state["fortran"] = np.asfortranarray(sample(np.float32, (17, 9), 8))
    state["big_endian"] = sample(np.float32, (11,), 9).astype(">f4")
    state["scalar"] = np.float32(1.25)
    state["bytes"] = b"\x00\x01\xffab"
    return state


def assert_same(got: Any, want: Any, path: str = "state") -> None:
    if isinstance(want, dict):
        assert isinstance(got, dict) and list(got) == list(want), path
        for k in want:
            assert_same(got[k], want[k], f"{path}[{k!r}]")
    elif isinstance(want, (list, tuple)):
        assert type(got) is type(want) and len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same(g, w, f"{path}[{i}]")
    elif isinstance(want, torch.Tensor):
        g = got if isinstance(got, torch.Tensor) else torch.from_numpy(np.asarray(got).view(np.uint8))
        assert g.shape == want.shape or g.numel() == want.numel() * want.element_size(), path
        assert _raw(g) == _raw(want), path
    elif isinstance(want, (np.ndarray, np.generic, bytes)):
        w = np.asarray(want) if not isinstance(want, bytes) else np.frombuffer(want, np.uint8)
        g = np.asarray(got)
        assert g.shape == w.shape and g.dtype.newbyteorder("=") == w.dtype.newbyteorder("="), path
        assert g.dtype.byteorder in ("=", "|", "<"), path
        assert g.tobytes() == w.astype(w.dtype.newbyteorder("<")).tobytes(), path
        assert isinstance(got, np.generic) == isinstance(want, np.generic), path
    else:
        assert type(got) is type(want) and (got == want or got != got), path


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def size_of(path: str | Path) -> int:
    return os.path.getsize(path)


def _raw(t: torch.Tensor) -> bytes:
    return bytes(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())


async def test_numpy_round_trip_every_dtype_and_layout(tmp_path: Path) -> None:
    state = numpy_state()
    uri = str(tmp_path / "s.safetensors")
    async with ckpt() as c:
        saved = await c.save_state(uri, state)
        loaded = await c.load_state(uri)
    assert_same(loaded.state, state)
    assert loaded.verified and "CRC32C" in loaded.verification
    assert set(saved.copied_contiguous) == {"strided", "fortran", "big_endian"}
    as_json = json.loads(json.dumps(saved.to_dict()))  # plain data, like every result
    assert as_json["staging"] == "none" and as_json["save"]["size_bytes"] == saved.save.size_bytes
    assert saved.tensors == len(state) and saved.save.size_bytes == size_of(uri)
    assert saved.save.chunks == -(-size_of(uri) // CHUNK)  # the ordinary pipeline's chunks
    assert loaded.load.size_bytes == size_of(uri)
    async with ckpt() as c:  # the object is also an ordinary checkpoint, verified from its header
        assert (await c.load(uri)).size_bytes == size_of(uri)


async def test_file_layout_is_aligned_and_valid_safetensors(tmp_path: Path) -> None:
    state = numpy_state()
    uri = str(tmp_path / "s.safetensors")
    async with ckpt() as c:
        await c.save_state(uri, state, metadata={"format": "np"})
    raw = (tmp_path / "s.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert (8 + n) % ALIGN == 0  # data starts O_DIRECT-aligned
    header = json.loads(raw[8 : 8 + n])
    meta = header.pop("__metadata__")
    assert meta["format"] == "np" and "asyncckpt.crc32c" in meta
    ends = sorted((v["data_offsets"] for v in header.values()), key=lambda o: tuple(o))
    assert ends[-1][1] == len(raw) - 8 - n  # no bytes after the last tensor
    for info in header.values():  # each tensor aligned to its element size
        size = {"F64": 8, "I64": 8, "U64": 8, "C64": 8, "F32": 4, "I32": 4, "U32": 4}.get(info["dtype"], 2)
        assert info["data_offsets"][0] % size == 0 or (size == 2 and info["dtype"] in ("U8", "I8", "BOOL"))
    # the reference reader accepts it, from numpy and from torch, with the metadata
    flat = safetensors.numpy.load_file(uri)
    np.testing.assert_array_equal(flat["big"], state["big"])
    np.testing.assert_array_equal(flat["strided"], state["strided"])
    np.testing.assert_array_equal(flat["big_endian"], state["big_endian"])
    assert flat["zero_d"].shape == () and flat["empty"].shape == (0, 5)
    as_torch = safetensors.torch.load_file(uri)
    assert torch.equal(as_torch["fortran"], torch.from_numpy(np.ascontiguousarray(state["fortran"])))
    with safetensors.safe_open(uri, framework="np") as f:
        assert f.metadata()["format"] == "np"
        assert set(f.keys()) == set(state)


async def test_torch_tensors_incl_bfloat16_float8_noncontiguous(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(1)
    w = torch.randn(64, 48, generator=g, requires_grad=True)
    state = {
        "model": {"w": w, "bf16": torch.randn(130, 33, generator=g).to(torch.bfloat16)},
        "f8": torch.randn(50, generator=g).to(torch.float8_e4m3fn),
        "f8b": torch.randn(7, generator=g).to(torch.float8_e5m2),
        "t": torch.randn(20, 10, generator=g).t(),  # non-contiguous
        "zero_d": torch.tensor(5, dtype=torch.int64),
        "bf16_0d": torch.tensor(1.5, dtype=torch.bfloat16),
        "empty": torch.zeros(0, 3, dtype=torch.bfloat16),
        "opt": {
            "state": {0: {"step": torch.tensor(3.0)}},
            "param_groups": [{"lr": 0.1, "betas": (0.9, 0.99)}],
        },
    }
    uri = str(tmp_path / "t.safetensors")
    async with ckpt() as c:
        saved = await c.save_state(uri, state)
        as_t = await c.load_state(uri, as_torch=True)
        as_np = await c.load_state(uri)
    assert saved.copied_contiguous == ("t",)
    got = as_t.state
    assert torch.equal(got["model"]["w"], w.detach()) and not got["model"]["w"].requires_grad
    for key in ("f8", "f8b", "t", "zero_d", "bf16_0d", "empty"):
        assert got[key].dtype == state[key].dtype and got[key].shape == state[key].shape, key
        assert _raw(got[key]) == _raw(state[key]), key
    assert got["model"]["bf16"].dtype == torch.bfloat16 and torch.equal(
        got["model"]["bf16"], state["model"]["bf16"]
    )
    assert got["opt"]["param_groups"] == [{"lr": 0.1, "betas": (0.9, 0.99)}]
    assert list(got["opt"]["state"]) == [0]  # int keys stay ints
    # NumPy by default: native dtypes as NumPy, bfloat16/float8 as ml_dtypes arrays
    bf = as_np.state["model"]["bf16"]
    assert isinstance(bf, np.ndarray) and bf.dtype == ml_dtypes.bfloat16
    assert bf.tobytes() == _raw(state["model"]["bf16"])
    assert as_np.state["f8"].dtype == ml_dtypes.float8_e4m3fn
    assert isinstance(as_np.state["model"]["w"], np.ndarray)
    # ml_dtypes arrays save too, strided ones included (torch's reader sees the same bytes)
    again = str(tmp_path / "again.safetensors")
    async with ckpt() as c:
        for staging in ("none", "host"):
            handle = await c.save_state(again, {"bf": bf[:, ::2], "f8": as_np.state["f8"]}, staging=staging)
            await handle if isinstance(handle, StagedSave) else None
            ref2 = safetensors.torch.load_file(again)
            assert torch.equal(ref2["bf"], state["model"]["bf16"][:, ::2])
            assert _raw(ref2["f8"]) == _raw(state["f8"])
    # and torch's own reader agrees
    ref = safetensors.torch.load_file(uri)
    assert torch.equal(ref["model.bf16"], state["model"]["bf16"]) and torch.equal(ref["t"], state["t"])


async def test_structure_and_scalars(tmp_path: Path) -> None:
    state: dict[Any, Any] = {
        "step": 1200,
        "lr": 3e-4,
        "inf": float("inf"),
        "name": "run-ä",
        "flag": True,
        "none": None,
        "seeds": [1, 2, (3, 4)],
        "nested": {"deep": {"deeper": [np.arange(3), {"x": np.ones(2)}]}},
        7: "int key",
        "a.b": np.arange(2),
        "a": {"b": np.arange(3)},  # the same dotted name: disambiguated, both restored
        "": np.arange(1),
    }
    uri = str(tmp_path / "n.safetensors")
    async with ckpt() as c:
        await c.save_state(uri, state)
        loaded = (await c.load_state(uri)).state
    assert_same(loaded, state)
    assert set(safetensors.numpy.load_file(uri)) == {
        "nested.deep.deeper.0",
        "nested.deep.deeper.1.x",
        "a.b",
        "a.b#1",
        "#1",
    }


async def test_empty_state_is_a_valid_file(tmp_path: Path) -> None:
    uri = str(tmp_path / "e.safetensors")
    async with ckpt() as c:
        await c.save_state(uri, {"step": 3})
        loaded = await c.load_state(uri)
    assert loaded.state == {"step": 3} and loaded.tensors == 0
    assert safetensors.numpy.load_file(uri) == {}


async def test_header_larger_than_a_chunk(tmp_path: Path) -> None:
    state = {f"layer{i}": {"w": np.full((3,), i, np.int16), "b": np.float64(i)} for i in range(1500)}
    uri = str(tmp_path / "h.safetensors")
    async with ckpt(chunk_size=4096) as c:
        saved = await c.save_state(uri, state)
        loaded = await c.load_state(uri)
    assert saved.header_bytes > 64 * 1024  # more than the first read: the header takes two
    assert_same(loaded.state, state)


@pytest.mark.parametrize("staging", ["none", "host"])
async def test_a_state_of_many_tensors_never_blocks_the_loop(tmp_path: Path, staging: str) -> None:
    """Laying out 12 000 tensors (names, classification, a 1 MiB header) and binding them on
    load took 0.2-0.4 s of the loop's time; it runs in a thread (the loop guard of conftest
    fails the test otherwise)."""

    def make(value: float | None) -> dict[str, Any]:  # built and compared off the loop too
        tensors = {
            f"layers.{i}.w{j}": torch.full((2,), float(j) if value is None else value)
            for i in range(1200)
            for j in range(10)
        }
        return {"model": tensors}

    state, fresh = await asyncio.to_thread(make, None), await asyncio.to_thread(make, 0.0)
    uri = str(tmp_path / "many.safetensors")
    async with ckpt() as c:
        saved = await c.save_state(uri, state, staging=staging)  # type: ignore[call-overload]
        if isinstance(saved, StagedSave):
            await saved
        loaded = await c.load_state(uri, into=fresh)
        again = await c.load_state(uri, as_torch=True)
    assert loaded.tensors == 12_000
    await asyncio.to_thread(assert_same, fresh, state)
    await asyncio.to_thread(assert_same, again.state, state)


async def test_files_written_by_safetensors_load_too(tmp_path: Path) -> None:
    arrays = {
        "w": sample(np.float32, (100, 30)),
        "i": np.arange(10, dtype=np.int64),
        "e": np.zeros(0, np.uint8),
    }
    np_uri, pt_uri = str(tmp_path / "np.safetensors"), str(tmp_path / "pt.safetensors")

    def write_with_safetensors() -> dict[str, torch.Tensor]:
        """The test's own setup (file writes, torch) off the loop: the loop guard measures asyncckpt."""
        safetensors.numpy.save_file(arrays, np_uri, metadata={"who": "np"})
        made = {"bf": torch.randn(33, 5).to(torch.bfloat16), "x": torch.arange(6).reshape(2, 3)}
        safetensors.torch.save_file(made, pt_uri)
        return made

    tensors = await asyncio.to_thread(write_with_safetensors)
    async with ckpt() as c:
        got = await c.load_state(np_uri)
        got_t = await c.load_state(pt_uri, as_torch=True)
        into = {"bf": torch.empty(33, 5, dtype=torch.bfloat16), "x": torch.empty(2, 3, dtype=torch.int64)}
        in_place = await c.load_state(pt_uri, into=into)
    assert not got.verified and "no asyncckpt checksums" in got.verification
    assert got.metadata == {"who": "np"}
    assert list(got.state) == ["w", "i", "e"] or set(got.state) == set(arrays)
    for k, v in arrays.items():
        np.testing.assert_array_equal(got.state[k], v)
    for k, v in tensors.items():
        assert torch.equal(got_t.state[k], v) and torch.equal(into[k], v)
    assert in_place.state["bf"] is into["bf"]


async def test_in_place_restore(tmp_path: Path) -> None:
    state = {"w": sample(np.float32, (200, 100)), "t": torch.randn(8, 9), "meta": {"step": 4}}
    uri = str(tmp_path / "p.safetensors")
    base = np.zeros((100, 200), np.float32)
    into = {"w": base.T, "t": torch.zeros(9, 8).t(), "meta": {"step": 0}}  # both non-contiguous
    async with ckpt() as c:
        await c.save_state(uri, state)
        loaded = await c.load_state(uri, into=into)
        assert loaded.in_place and loaded.state["w"] is into["w"] and loaded.state["t"] is into["t"]
        np.testing.assert_array_equal(base.T, state["w"])
        assert torch.equal(into["t"], state["t"])
        assert loaded.state["meta"] == {"step": 4}
        with pytest.raises(
            ConfigError, match=r"state\['w'\] is F64\[200, 100\] but .* 'w' is F32\[200, 100\]"
        ):
            await c.load_state(uri, into={"w": np.zeros((200, 100)), "t": torch.zeros(8, 9)})
        with pytest.raises(ConfigError, match=r"state\['t'\] is F32\[9, 8\] but"):
            await c.load_state(uri, into={"w": np.zeros((200, 100), np.float32), "t": torch.zeros(9, 8)})
        with pytest.raises(ConfigError, match=r"into lacks the checkpoint's tensor\(s\) \['t'\]"):
            await c.load_state(uri, into={"w": np.zeros((200, 100), np.float32)})
        with pytest.raises(ConfigError, match=r"state\['x'\] not in the checkpoint"):
            await c.load_state(uri, into={**into, "x": np.zeros(1)})
        with pytest.raises(ConfigError, match="read-only"):
            ro = np.zeros((200, 100), np.float32)
            ro.flags.writeable = False
            await c.load_state(uri, into={"w": ro, "t": torch.zeros(8, 9)})


async def test_in_place_restore_updates_scalars(tmp_path: Path) -> None:
    """Issue 25 item 13: ``into=`` brings back the saved scalars too, at every depth of
    mutable containers; a tuple (immutable) is replaced in its parent, its arrays kept."""
    w, v = sample(np.float32, (4, 5)), sample(np.int64, (3,))
    saved = {
        "w": w,
        "step": 7,
        "meta": {"epoch": 2, "lr": 0.5, "tag": "b", "deep": {"seen": True}},
        "hist": [1, {"loss": 0.25}, v],
        "betas": (0.9, 0.99, v),
        "none": None,
    }
    uri = str(tmp_path / "s.safetensors")
    into_w, into_v = np.zeros_like(w), np.zeros_like(v)
    into_v2 = np.zeros_like(v)
    meta: dict[str, Any] = {"epoch": 0, "lr": 0.0, "tag": "a", "deep": {"seen": False}}
    hist: list[Any] = [0, {"loss": 9.0}, into_v]
    into = {"w": into_w, "step": 0, "meta": meta, "hist": hist, "betas": (0.0, 0.0, into_v2), "none": 3}
    async with ckpt() as c:
        await c.save_state(uri, saved)
        loaded = await c.load_state(uri, into=into)
    assert into["step"] == 7 and into["none"] is None
    assert into["meta"] is meta and meta == {"epoch": 2, "lr": 0.5, "tag": "b", "deep": {"seen": True}}
    assert into["hist"] is hist and hist[0] == 1 and hist[1] == {"loss": 0.25} and hist[2] is into_v
    assert into["betas"][:2] == (0.9, 0.99) and into["betas"][2] is into_v2
    assert into["w"] is into_w and np.array_equal(into_w, w) and np.array_equal(into_v2, v)
    assert loaded.state["step"] == 7 and loaded.state["w"] is into_w


async def test_mutation_during_unstaged_save_is_refused(tmp_path: Path) -> None:
    uri = tmp_path / "m.safetensors"
    weights = np.zeros(400_000, np.float32)  # 1.6 MB: 25 chunks
    async with ckpt() as c:
        await c.save_state(str(uri), {"w": weights})  # a good previous version
        before = uri.read_bytes()

        def train_step(_: int) -> None:  # the caller "keeps training" during the save
            weights[-1000:] += 1.0

        with pytest.raises(SourceChangedError, match=r"changed while being saved .* Nothing was published"):
            await c.save_state(str(uri), {"w": weights}, progress=train_step)
    assert uri.read_bytes() == before  # the previous checkpoint is untouched
    assert names(tmp_path) == ["m.safetensors"]


async def test_host_staging_snapshot_handle(tmp_path: Path) -> None:
    weights = floats((500, 300), 3)
    snapshot = weights.copy()
    async with ckpt() as c:
        handle = await c.save_state(
            str(tmp_path / "h.safetensors"), {"w": weights, "step": 1}, staging="host"
        )
        assert isinstance(handle, StagedSave) and handle.blocked_s > 0
        weights += 1.0  # training resumes at once: the staged copy is what gets written
        result = await handle
        assert handle.done() and result.staging == "host" and result.blocked_s == handle.blocked_s
        assert result.copy_s <= result.blocked_s and result.save.size_bytes == size_of(
            tmp_path / "h.safetensors"
        )
        loaded = await c.load_state(str(tmp_path / "h.safetensors"))
        np.testing.assert_array_equal(loaded.state["w"], snapshot)
        # the staging area is reused; a second staged save waits for the first to finish
        first = await c.save_state(str(tmp_path / "a.safetensors"), {"w": weights}, staging="host")
        second = await c.save_state(str(tmp_path / "b.safetensors"), {"w": weights * 2}, staging="host")
        assert first.done()  # the area was busy: the second save waited for it
        assert (await second).waited_s > 0
        # staged saves started together take turns: neither overwrites the other's staged copy
        states = [{"w": np.full(100_000, i, np.float32)} for i in range(3)]
        handles = await asyncio.gather(
            *(
                c.save_state(str(tmp_path / f"g{i}.safetensors"), s, staging="host")
                for i, s in enumerate(states)
            )
        )
        await asyncio.gather(*handles)
        for i, s in enumerate(states):
            np.testing.assert_array_equal(
                (await c.load_state(str(tmp_path / f"g{i}.safetensors"))).state["w"], s["w"]
            )
        # a staged save still running when the checkpointer closes is finished, not dropped
        await c.save_state(str(tmp_path / "last.safetensors"), {"w": snapshot}, staging="host")
    np.testing.assert_array_equal(safetensors.numpy.load_file(tmp_path / "last.safetensors")["w"], snapshot)
    np.testing.assert_array_equal(safetensors.numpy.load_file(tmp_path / "b.safetensors")["w"], (weights * 2))


async def test_staged_object_is_written_from_the_staging_area(tmp_path: Path) -> None:
    """The staged copy is already the whole object in page-aligned memory and its chunk CRCs
    come from the header's pre-pass: the write takes it from there (no pool, no copy into
    pool buffers, no second CRC pass), and the CRCs it reports are the file's."""
    from asyncckpt.checksum import crc

    uri = tmp_path / "w.safetensors"
    weights = floats((700, 300), 4)  # 840 KB: 13 chunks, the header's in the first
    async with ckpt() as c:
        handle = await c.save_state(str(uri), {"w": weights, "step": 3}, staging="host")
        assert isinstance(handle, StagedSave)
        saved = (await handle).save
        streamed = (await c.save_state(str(tmp_path / "s.safetensors"), {"w": weights})).save
    raw = uri.read_bytes()
    assert saved.method == "preallocated" and saved.metadata.pool_bytes == len(raw) == saved.size_bytes
    assert saved.gen_s == 0.0 and saved.checksum_s == 0.0  # no fill, no checksum in the write
    assert [r.checksum for r in saved.records] == [crc(raw[o : o + CHUNK]) for o in range(0, len(raw), CHUNK)]
    assert streamed.method == "streaming" and streamed.checksum_s > 0  # the caller's arrays: via the pool
    np.testing.assert_array_equal(safetensors.numpy.load_file(uri)["w"], weights)


async def test_staged_save_failure_surfaces_on_the_handle(tmp_path: Path) -> None:
    async with ckpt() as c:
        handle = await c.save_state(str(tmp_path / "x.safetensors"), {"w": np.ones(10)}, staging="host")
        (tmp_path / "x.safetensors").mkdir()  # the target becomes a directory: the publish fails
        with pytest.raises(ConfigError, match="is a directory"):
            await handle
        assert not any(name.endswith(".partial") for name in names(tmp_path))


async def test_corrupt_data_and_header_are_detected(tmp_path: Path) -> None:
    uri = tmp_path / "c.safetensors"
    state = {"w": sample(np.float32, (300, 300)), "step": 1234}
    async with ckpt() as c:
        await c.save_state(str(uri), state)
        raw = bytearray(uri.read_bytes())
        data_start = 8 + struct.unpack("<Q", raw[:8])[0]
        raw[data_start + 3 * CHUNK + 5] ^= 0x01
        uri.write_bytes(raw)
        with pytest.raises(ChecksumMismatchError, match="corrupt in chunk 3") as info:
            await c.load_state(str(uri))
        assert info.value.chunk == 3
        assert (await c.load_state(str(uri), verify=False)).verification == "none: verify=False"
        raw[data_start + 3 * CHUNK + 5] ^= 0x01
        at = raw.index(b"1234")  # the saved step, inside the tree of the header
        raw[at : at + 4] = b"1235"
        uri.write_bytes(raw)
        with pytest.raises(ChecksumMismatchError, match="header's CRC32C does not match"):
            await c.load_state(str(uri))


def _file(tmp: Path, header: bytes | dict[str, Any], data: bytes = b"", length: int | None = None) -> str:
    raw = json.dumps(header).encode() if isinstance(header, dict) else header
    path = tmp / "bad.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    return str(path)


T = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}


@pytest.mark.parametrize(
    ("header", "data", "length", "match"),
    [
        (b"", b"", 2**40, "header length 1099511627776 is impossible"),
        (b"{}", b"", 10**9, "is impossible"),
        (b"\xff\xfe{}", b"", None, "unreadable header"),
        (b"[1, 2]", b"", None, r"does not start with '\{'"),
        (b'{"a": 1, "a": 2}', b"", None, "duplicate key 'a'"),
        ({"t": {**T, "dtype": "F128"}}, bytes(8), None, "unknown dtype 'F128'"),
        (
            {"t": {**T, "shape": [3]}},
            bytes(8),
            None,
            r"F32\[3\] = 12 bytes, but its data_offsets \[0, 8\] span 8",
        ),
        ({"t": {**T, "shape": [-2]}}, bytes(8), None, "has shape"),
        ({"t": T, "u": {**T, "data_offsets": [12, 20]}}, bytes(20), None, "begins at data offset 12, not 8"),
        ({"t": T}, bytes(9), None, "cover 8 data bytes but the object holds 9"),
        ({"t": {"dtype": "F32", "shape": [2]}}, bytes(8), None, "lacks dtype, shape or data_offsets"),
        ({"__metadata__": {"k": 1}}, b"", None, "must map strings to strings"),
        ({"__metadata__": {"asyncckpt.format": "state/99"}}, b"", None, "asyncckpt format 'state/99'"),
    ],
)
async def test_bad_headers_are_clear_errors(
    tmp_path: Path, header: Any, data: bytes, length: int | None, match: str
) -> None:
    uri = _file(tmp_path, header, data, length)
    async with ckpt() as c:
        with pytest.raises(StateFormatError, match=match):
            await c.load_state(uri)


async def test_tiny_file_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "t.safetensors").write_bytes(b"abc")
    async with ckpt() as c:
        with pytest.raises(StateFormatError, match="3 bytes, shorter than its 8-byte length"):
            await c.load_state(str(tmp_path / "t.safetensors"))


@pytest.mark.parametrize(
    ("state", "match"),
    [
        ([np.ones(2)], "state must be a mapping"),
        ({"s": {1, 2}}, r"state\['s'\]: set is neither an array"),
        ({"o": np.array([object()])}, r"state\['o'\] \('o'\): dtype object has no safetensors equivalent"),
        ({"c": np.ones(2, np.complex128)}, "dtype complex128 has no safetensors equivalent"),
        ({"k": {(1, 2): np.ones(1)}}, r"keys must be str or int, got \(1, 2\)"),
    ],
)
async def test_bad_state_is_refused_before_any_io(tmp_path: Path, state: Any, match: str) -> None:
    async with ckpt() as c:
        for staging in ("none", "host"):
            with pytest.raises(ConfigError, match=match):
                await c.save_state(str(tmp_path / "x.safetensors"), state, staging=staging)
        with pytest.raises(ConfigError, match="staging must be one of none, host, got 'gpu'"):
            await c.save_state(str(tmp_path / "x.safetensors"), {}, staging="gpu")
        with pytest.raises(
            ConfigError,
            match=r"num_readers must be an integer in 1\.\.num_buffers=3 \(each read holds a buffer\), got 0",
        ):
            await c.load_state(str(tmp_path / "absent.safetensors"), num_readers=0)
        with pytest.raises(ConfigError, match="read_chunk_size must be a positive multiple of 4096, got 100"):
            await c.load_state(str(tmp_path / "absent.safetensors"), read_chunk_size=100)
        with pytest.raises(ConfigError, match=r"'asyncckpt\.' prefix is reserved"):
            await c.save_state(str(tmp_path / "x.safetensors"), {}, metadata={"asyncckpt.tree": "x"})
    assert names(tmp_path) == []


_WITHOUT = """
import asyncio, sys
for name in {blocked!r}:
    sys.modules[name] = None  # import of it now raises ImportError, as if not installed
import numpy as np
from asyncckpt import AsyncCheckpointer

async def main():
    async with AsyncCheckpointer(chunk_size=65536, num_buffers=2) as c:
        await c.save_state(sys.argv[2], {{"w": np.arange(4.0)}})  # NumPy-only state: no extra needed
        print(type((await c.load_state(sys.argv[2])).state["w"]).__module__)
        state = (await c.load_state(sys.argv[1])).state
        print(type(state["bf"]).__module__, state["bf"].dtype)

asyncio.run(main())
"""


@pytest.mark.parametrize(
    ("blocked", "expect"),
    [
        (("ml_dtypes",), "numpy\ntorch torch.bfloat16\n"),  # bfloat16 falls back to torch
        (("torch",), "numpy\nnumpy bfloat16\n"),  # ... or comes as an ml_dtypes array
        (("torch", "ml_dtypes"), "needs the optional package 'ml_dtypes'"),
    ],
)
def test_dtypes_numpy_lacks_without_optional_packages(
    tmp_path: Path, blocked: tuple[str, ...], expect: str
) -> None:
    import subprocess
    import sys

    bf = str(tmp_path / "bf.safetensors")
    safetensors.torch.save_file({"bf": torch.ones(3, dtype=torch.bfloat16)}, bf)
    code = _WITHOUT.format(blocked=blocked)
    proc = subprocess.run(
        [sys.executable, "-c", code, bf, str(tmp_path / "np.safetensors")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if "needs" in expect:
        assert proc.returncode == 1 and "MissingDependencyError" in proc.stderr, proc.stderr[-2000:]
        assert "tensor 'bf' is BF16, which NumPy lacks" in proc.stderr and expect in proc.stderr
        assert proc.stdout == "numpy\n"
    else:
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout == expect


async def test_cancelled_state_load_and_save_clean_up(tmp_path: Path, leak_check: None) -> None:
    uri = str(tmp_path / "c.safetensors")
    state = {"w": floats((400, 1000))}  # 1.6 MB: 25 chunks
    started = asyncio.Event()
    async with ckpt() as c:
        await c.save_state(uri, state)
        for op in ("load", "save"):
            started.clear()

            def on_chunk(_: int) -> None:
                started.set()

            if op == "load":
                task = asyncio.create_task(c.load_state(uri, progress=on_chunk))
            else:
                task = asyncio.create_task(c.save_state(uri + ".2", state, progress=on_chunk))
            await started.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            pool = c.runtime.pool_now
            assert pool is not None and pool.stats().free == 3, op
        np.testing.assert_array_equal((await c.load_state(uri)).state["w"], state["w"])  # still usable
    assert names(tmp_path) == ["c.safetensors"]  # no partial file


async def test_object_replaced_during_state_load_is_refused(tmp_path: Path, leak_check: None) -> None:
    uri = tmp_path / "r.safetensors"
    async with ckpt(chunk_size=2 << 20) as c:  # chunks >= 1 MiB: the scatter copies in a thread
        await c.save_state(str(uri), {"w": floats((1000, 1000))}, metadata={"v": "1"})
        other = bytearray(uri.read_bytes())
        at = other.index(b'"v":"1"')
        other[at : at + 7] = b'"v":"2"'  # same size, another header
        async with c.runtime.lock:  # the load reads the header, then waits here for the pool
            task = asyncio.create_task(c.load_state(str(uri), verify=False))  # no CRC catches it first
            while not c.runtime.lock._waiters:  # type: ignore[attr-defined]  # noqa: ASYNC110 - no hook to await
                await asyncio.sleep(0)
            uri.write_bytes(other)
        with pytest.raises(IntegrityError, match="changed during the load: its header differs"):
            await task
        assert (
            c.runtime.pool_now is not None and c.runtime.pool_now.stats().free == 3
        )  # reclaimed at once, not at GC


@pytest.mark.parametrize(
    ("header", "data", "chunk"),
    [
        (4096, 0, 4096),
        (4096, 1, 4096),
        (8192, 5000, 4096),
        (4096, 70_000, 65536),
        (12288, 3, 8192),
        (4096, 8192, 4096),
    ],
)
def test_chunk_crcs_equal_the_objects_own(header: int, data: int, chunk: int) -> None:
    from asyncckpt.checksum import crc
    from asyncckpt.engine import chunks

    raw = np.random.default_rng(header + data).integers(0, 256, header + data, dtype=np.uint8).tobytes()
    views = [memoryview(raw)[header : header + data // 3], memoryview(raw)[header + data // 3 :]]
    data_crcs = chunks.data_chunk_crcs(views, header, chunk)
    assert len(data_crcs) == chunks.data_chunk_count(header, len(raw), chunk)
    got = chunks.object_chunk_crcs(raw[:header], data_crcs, len(raw), chunk)
    assert got == tuple(crc(raw[o : o + chunk]) for o in range(0, len(raw), chunk))


_MEMORY = """
import asyncio, sys
import numpy as np
from asyncckpt import AsyncCheckpointer

def peak() -> int:
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss across exec, so a child of a large pytest
    # process starts with the parent's peak and a growth below it reads as 0 (measured: 744 MB)
    with open("/proc/self/status") as f:
        line = next(x for x in f if x.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024

async def main() -> None:
    weights = np.ones(64 * 2**20, np.float32)  # 256 MiB, touched
    async with AsyncCheckpointer(chunk_size=2**20, num_buffers=4) as c:
        await c.save_state(sys.argv[1], {"w": weights[:1024]}, staging=sys.argv[2])  # pool etc. warm
        before = peak()
        handle = await c.save_state(sys.argv[1], {"w": weights}, staging=sys.argv[2])
        if sys.argv[2] == "host":
            await handle
        print(peak() - before)

asyncio.run(main())
"""


@pytest.mark.parametrize("staging", ["none", "host"])
def test_memory_of_each_staging_mode(tmp_path: Path, staging: str) -> None:
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", _MEMORY, str(tmp_path / "m.safetensors"), staging],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    grew = int(proc.stdout)
    if staging == "none":  # streamed from the array itself: the pool, no full-size copy
        assert grew < 32 * 2**20, grew
    else:  # a staging area the size of the state
        assert grew > 200 * 2**20, grew


@pytest.mark.parametrize("how", ["load_state", "load_step", "resharded"])
async def test_into_is_matched_by_where_each_leaf_sits_not_its_dotted_name(tmp_path: Path, how: str) -> None:
    """``{"a.b": x}`` and ``{"a": {"b": y}}`` both flatten to the name ``a.b``. Before: a
    checkpoint of ``{"a.b": x}`` loaded into ``{"a": {"b": y}}`` filled ``y`` with ``x``, and with
    both saved, an ``into=`` listing them in the other order had each array filled with the
    other's values (and the two swapped in ``into``, hiding it there)."""
    x, y = np.arange(3.0), np.arange(3.0) + 10
    both: dict[str, Any] = {"a.b": x, "a": {"b": y}}
    one: dict[str, Any] = {"a.b": x}
    if how == "resharded":  # a sharded leaf: the step loads by boxes
        both["s"] = one["s"] = Shard((2,), (0,), np.ones(2))

    async def load(state: dict[str, Any], into: dict[str, Any]) -> None:
        if how == "load_state":
            await c.save_state(tmp_path / "s.safetensors", state)
            await c.load_state(tmp_path / "s.safetensors", into=into)
        else:
            await c.save_step(tmp_path / "run", 1, state)
            await c.load_step(tmp_path / "run", into=into)

    extra = {"s": np.zeros(2)} if how == "resharded" else {}
    async with AsyncCheckpointer(chunk_size=1 << 20, num_buffers=3) as c:
        nested, dotted = np.zeros(3), np.zeros(3)  # a model's parameters, say: filled in place
        into: dict[str, Any] = {"a": {"b": nested}, "a.b": dotted, **extra}  # the other order
        await load(both, into)
        np.testing.assert_array_equal(dotted, x)
        np.testing.assert_array_equal(nested, y)
        assert into["a.b"] is dotted and into["a"]["b"] is nested
        into = {"a": {"b": np.zeros(3)}, **extra}
        with pytest.raises(ConfigError, match=r"state\['a'\]\['b'\].* not in the checkpoint"):
            await load(one, into)
        np.testing.assert_array_equal(into["a"]["b"], np.zeros(3))


async def test_a_shard_takes_numpy_integers(tmp_path: Path) -> None:
    """Before: ``Shard((np.int64(6), 2), np.cumsum(...)...)`` was a ConfigError ('must be tuples
    of non-negative ints'), though NumPy integers are what an array's split gives."""
    rows = np.arange(8.0).reshape(4, 2)
    start = np.cumsum([0, 2])[1]  # np.int64(2)
    box = Shard((np.int64(6), 2), (start, np.int64(0)), rows)
    async with AsyncCheckpointer(chunk_size=1 << 20, num_buffers=3) as c:
        await c.save_state(tmp_path / "s.safetensors", {"w": box})
        got = (await c.load_state(tmp_path / "s.safetensors")).state["w"]
        with pytest.raises(ConfigError, match="must be tuples of non-negative ints"):
            await c.save_state(tmp_path / "t.safetensors", {"w": Shard((np.int64(-1), 2), (0, 0), rows)})
    assert got.global_shape == (6, 2) and got.offsets == (2, 0)
    assert all(type(n) is int for n in (*got.global_shape, *got.offsets))
    np.testing.assert_array_equal(got.data, rows)

"""Partial loads (issue 27 item 4): ``keys=`` / ``prefix=`` read and verify only the checksum
blocks that hold the chosen tensors, on files (O_DIRECT) and S3 (ranged GETs)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from asyncckpt import AsyncCheckpointer, ChecksumMismatchError, ConfigError, Shard
from asyncckpt.engine.chunks import CHECK_BLOCK
from asyncckpt.servers.s3endpoint import S3Endpoint

from .s3_harness import new_bucket

CHUNK = 8 << 20  # pipeline chunks of 8 MiB (S3 parts are >= 5 MiB); checksum blocks of 256 KiB


def _make_state() -> dict[str, Any]:
    rng = np.random.default_rng(3)
    return {
        "model": {
            f"w{i}": rng.standard_normal((512, 1024)).astype(np.float32) for i in range(10)
        },  # 2 MiB each
        "optim": {"m": rng.standard_normal((1024, 1024)).astype(np.float32)},
        "step": 7,
    }


STATE = _make_state()  # built once, at import: not on a test's event loop


def big_state() -> dict[str, Any]:
    return STATE


def flip_byte_of(path: Path, needle: bytes) -> int:
    """Flip one bit of the first occurrence of ``needle`` in the file; its offset."""
    raw = path.read_bytes()
    at = raw.find(needle)
    assert at > 0
    with path.open("r+b") as f:
        f.seek(at)
        f.write(bytes([raw[at] ^ 0x10]))
    return at


def ckpt(**kw: Any) -> AsyncCheckpointer:
    return AsyncCheckpointer(chunk_size=CHUNK, num_buffers=3, **kw)


async def test_checksum_blocks_are_finer_than_the_pipeline_chunks(tmp_path: Path) -> None:
    uri = tmp_path / "s.safetensors"
    async with ckpt() as c:
        await c.save_state(uri, big_state())
        whole = await c.load_state(uri)
    assert whole.verified
    assert f"of {CHECK_BLOCK} bytes" in whole.verification


async def test_a_key_reads_only_its_blocks_and_verifies_them(tmp_path: Path) -> None:
    uri = tmp_path / "s.safetensors"
    state = big_state()
    async with ckpt() as c:
        await c.save_state(uri, state)
        size = uri.stat().st_size
        part = await c.load_state(uri, keys=["model.w3"])
        pre = await c.load_state(uri, prefix="optim.")
    assert part.verified and part.tensors == 1
    np.testing.assert_array_equal(part.state["model"]["w3"], state["model"]["w3"])
    assert set(part.state) == {"model"} and set(part.state["model"]) == {"w3"}
    # 2 MiB of tensor bytes: at most one extra block on each side
    assert 2 << 20 <= part.load.size_bytes <= (2 << 20) + 2 * CHECK_BLOCK < size // 5
    np.testing.assert_array_equal(pre.state["optim"]["m"], state["optim"]["m"])
    assert pre.load.size_bytes <= (4 << 20) + 2 * CHECK_BLOCK


async def test_a_flipped_byte_in_a_chosen_tensor_is_caught_one_outside_is_not_read(tmp_path: Path) -> None:
    uri = tmp_path / "s.safetensors"
    state = big_state()
    async with ckpt() as c:
        await c.save_state(uri, state)
        # find where w3 and w7 live (their header offsets), flip a byte in w7's middle
        probe = await c.load_state(uri, keys="model.w7")
        assert probe.verified
    needle = state["model"]["w7"].tobytes()[1 << 20 : (1 << 20) + 64]
    at = await asyncio.to_thread(flip_byte_of, uri, needle)
    async with ckpt() as c:
        ok = await c.load_state(uri, keys="model.w0")  # far from the flipped byte: fine
        np.testing.assert_array_equal(ok.state["model"]["w0"], state["model"]["w0"])
        with pytest.raises(ChecksumMismatchError) as info:
            await c.load_state(uri, keys="model.w7")
    block_start = at // CHECK_BLOCK * CHECK_BLOCK
    assert info.value.offset == block_start
    assert str(uri) in str(info.value)


async def test_unknown_keys_and_prefixes_are_named_before_any_data_is_read(tmp_path: Path) -> None:
    uri = tmp_path / "s.safetensors"
    async with ckpt() as c:
        await c.save_state(uri, big_state())
        with pytest.raises(ConfigError, match=r"'model\.nope'"):
            await c.load_state(uri, keys=["model.w1", "model.nope"])
        with pytest.raises(ConfigError, match=r"prefix 'opt\.'"):
            await c.load_state(uri, prefix="opt.")
        with pytest.raises(ConfigError, match="keys must be"):
            await c.load_state(uri, keys=[3])
        # an empty list loaded an empty state without a word; a string for as_torch was taken
        with pytest.raises(ConfigError, match=r"keys must be a non-empty string or a list of them, got \[\]"):
            await c.load_state(uri, keys=[])
        with pytest.raises(ConfigError, match=r"prefix must be .*got \(\)"):
            await c.load_state(uri, prefix=())
        with pytest.raises(ConfigError, match="as_torch must be True or False, got 'yes'"):
            await c.load_state(uri, as_torch="yes")  # type: ignore[arg-type]
        await c.save_step(tmp_path / "run", 1, big_state())
        with pytest.raises(ConfigError, match="as_torch must be True or False, got 1"):
            await c.load_step(tmp_path / "run", as_torch=1)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match=r"keys must be .*got \[\]"):
            await c.load_step(tmp_path / "run", keys=[])


async def test_partial_load_into_the_callers_arrays(tmp_path: Path) -> None:
    uri = tmp_path / "s.safetensors"
    state = big_state()
    async with ckpt() as c:
        await c.save_state(uri, state)
        dst = {"model": {"w1": np.zeros((512, 1024), np.float32), "w2": np.zeros((512, 1024), np.float32)}}
        got = await c.load_state(uri, into=dst, keys=["model.w1", "model.w2"])
    assert got.in_place
    np.testing.assert_array_equal(dst["model"]["w1"], state["model"]["w1"])
    np.testing.assert_array_equal(dst["model"]["w2"], state["model"]["w2"])


async def test_partial_load_over_s3_uses_ranged_reads(s3_endpoint: S3Endpoint) -> None:
    bucket = await asyncio.to_thread(new_bucket, s3_endpoint)
    uri = f"s3://{bucket}/p/s.safetensors"
    state = big_state()
    async with ckpt(backend="aiobotocore", backend_options=s3_endpoint.options()) as c:
        await c.save_state(uri, state)
        part = await c.load_state(uri, prefix=["model.w5", "model.w6"])
    assert part.verified
    np.testing.assert_array_equal(part.state["model"]["w5"], state["model"]["w5"])
    np.testing.assert_array_equal(part.state["model"]["w6"], state["model"]["w6"])
    assert part.load.size_bytes <= (4 << 20) + 2 * CHECK_BLOCK


async def test_partial_load_of_a_step(tmp_path: Path) -> None:
    state = big_state()
    async with ckpt() as c:
        await c.save_step(tmp_path / "run", 3, state)
        got = await c.load_step(tmp_path / "run", prefix="model.w9")
        with pytest.raises(ConfigError, match=r"'optim\.x'"):
            await c.load_step(tmp_path / "run", keys="optim.x")
    assert got.step == 3 and list(got.state["model"]) == ["w9"]
    np.testing.assert_array_equal(got.state["model"]["w9"], state["model"]["w9"])
    assert got.result.load.size_bytes <= (2 << 20) + 2 * CHECK_BLOCK


async def test_a_tensor_of_whole_blocks_is_read_without_an_extra_block(tmp_path: Path) -> None:
    """A large state's data starts on a checksum block and its tensors of whole blocks come
    first, so loading one reads exactly its bytes: with 4096-byte alignment, and a small int64
    array laid out first (descending element size), every key read a block more."""
    uri = tmp_path / "s.safetensors"
    state = {**big_state(), "count": np.arange(3, dtype=np.int64)}
    async with ckpt() as c:
        await c.save_state(uri, state)
        one = await c.load_state(uri, keys=["model.w3"])
        small = await c.load_state(uri, keys=["count"])
    np.testing.assert_array_equal(one.state["model"]["w3"], state["model"]["w3"])
    assert one.load.size_bytes == 2 << 20
    np.testing.assert_array_equal(small.state["count"], state["count"])
    assert small.load.size_bytes <= CHECK_BLOCK  # the last, short block


def _small(zero: bool) -> dict[str, Any]:
    def v(a: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        return np.zeros_like(a) if zero else a

    return {
        "model": {
            "w": v(np.arange(4.0)),
            "layers": [v(np.arange(2.0)), -1 if zero else 5],
            "pair": (v(np.arange(3.0)), v(np.arange(3.0) + 1)),
        },
        "opt": {"m": v(np.full(2, 7.0))},
        "step": 0 if zero else 5,
    }


@pytest.mark.parametrize("how", ["load_state", "load_step", "resharded"])
async def test_a_partial_load_into_a_whole_state_leaves_the_rest_of_it_alone(
    tmp_path: Path, how: str
) -> None:
    """Before: into= holding more than the chosen tensors was a ConfigError ('not in the
    checkpoint (or not chosen)'; a resharded load: 'not among the keys chosen'), and into=
    holding only them had its other values overwritten: a list's other item became None, a
    tuple was replaced by one with None for the items left out."""
    saved = _small(zero=False)
    if how == "resharded":  # a sharded leaf: the step loads by boxes
        saved["opt"]["m"] = Shard((2,), (0,), saved["opt"]["m"])
    into = _small(zero=True)
    pair = into["model"]["pair"]
    keys = ["model.w", "model.layers.0", "model.pair.0"]
    async with ckpt() as c:
        if how == "load_state":
            await c.save_state(tmp_path / "s.safetensors", saved)
            await c.load_state(tmp_path / "s.safetensors", into=into, keys=keys)
        else:
            await c.save_step(tmp_path / "run", 1, saved)
            got = await c.load_step(tmp_path / "run", into=into, keys=keys)
            assert (got.reads is not None) == (how == "resharded")
    np.testing.assert_array_equal(into["model"]["w"], np.arange(4.0))
    np.testing.assert_array_equal(into["model"]["layers"][0], np.arange(2.0))
    assert into["model"]["layers"][1] == -1
    assert into["model"]["pair"] is pair
    np.testing.assert_array_equal(pair[0], np.arange(3.0))
    np.testing.assert_array_equal(pair[1], np.zeros(3))
    np.testing.assert_array_equal(
        into["opt"]["m"].data if how == "resharded" else into["opt"]["m"], np.zeros(2)
    )
    assert into["step"] == 0


async def test_a_partial_load_keeps_the_other_items_of_a_list_in_into(tmp_path: Path) -> None:
    """Before: into= holding only the chosen tensors had a list's other item set to None."""
    uri = tmp_path / "s.safetensors"
    async with ckpt() as c:
        await c.save_state(uri, {"model": {"w": np.arange(4.0), "layers": [np.arange(2.0), 5]}, "step": 5})
        into = {"model": {"w": np.zeros(4), "layers": [np.zeros(2), -1]}, "step": 0}
        await c.load_state(uri, into=into, keys=["model.w", "model.layers.0"])
    assert into["model"]["layers"][1] == -1 and into["step"] == 0
    np.testing.assert_array_equal(into["model"]["layers"][0], np.arange(2.0))


async def test_keys_as_any_collection_a_value_key_and_prefixes_of_whole_components(tmp_path: Path) -> None:
    """Before: ``keys=d.keys()`` or a set was a ConfigError ('must be a non-empty string or a
    list of them'); ``keys=["step"]`` said 'step' is not in the checkpoint, though it is (a
    value, not a tensor); ``prefix="model"`` also loaded ``model_ema.w``."""
    uri = tmp_path / "s.safetensors"
    state = {"model": {"w": np.arange(2.0), "b": np.ones(2)}, "model_ema": {"w": np.zeros(2)}, "step": 3}
    async with ckpt() as c:
        await c.save_state(uri, state)
        by_keys = await c.load_state(uri, keys=dict.fromkeys(["model.w"]).keys())
        by_set = await c.load_state(uri, keys={"model.w", "model.b"})
        by_prefix = await c.load_state(uri, prefix="model")
        with pytest.raises(ConfigError, match=r"keys: 'step' is a value of the state, not a tensor"):
            await c.load_state(uri, keys=["step"])
        with pytest.raises(
            ConfigError, match=r"keys must be a string or a collection of strings .*generator"
        ):
            await c.load_state(uri, keys=(k for k in ["model.w"]))  # type: ignore[arg-type]
        await c.save_step(tmp_path / "run", 1, {"s": Shard((2,), (0,), np.ones(2)), "step": 3})
        with pytest.raises(ConfigError, match=r"keys: 'step' is a value of the state, not a tensor"):
            await c.load_step(tmp_path / "run", into={"s": np.zeros(2)}, keys=["step"])  # by boxes
    assert list(by_keys.state["model"]) == ["w"]
    assert sorted(by_set.state["model"]) == ["b", "w"]
    assert list(by_prefix.state) == ["model"] and sorted(by_prefix.state["model"]) == ["b", "w"]

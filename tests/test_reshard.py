"""Sharded leaves, the step index and loads on any number of ranks (issue 27 items 1-3, 6).

Multi-rank runs are real: ``torchrun`` with gloo on the CPU (``tests/reshard_child.py``).
A rank's check is bit-for-bit against the same tensor distributed directly by torch.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate

from asyncckpt import (
    AsyncCheckpointer,
    CheckpointManager,
    ChecksumMismatchError,
    ConfigError,
    Shard,
    StateFormatError,
)
from asyncckpt.engine.chunks import CHECK_BLOCK
from asyncckpt.servers.s3endpoint import S3Endpoint
from asyncckpt.state import index as step_index
from asyncckpt.steps import COMMIT, digest

from .launch import torchrun
from .reshard_child import full
from .s3_harness import new_bucket

CHUNK = 8 << 20


def ckpt() -> AsyncCheckpointer:
    return AsyncCheckpointer(chunk_size=CHUNK, num_buffers=3)


def ok(proc: Any) -> None:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.fixture(scope="module")
def saved_on_2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Step 1 saved by two torchrun ranks on a 1-D mesh."""
    out = tmp_path_factory.mktemp("two")
    ok(torchrun("tests.reshard_child", "save1d", str(out / "run"), str(out), nproc=2, timeout=120))
    return out


def test_two_ranks_each_write_only_their_box_and_the_index_says_where(saved_on_2: Path) -> None:
    step = saved_on_2 / "run" / "step-1"
    record = json.loads((step / "COMMITTED.json").read_text())
    index = json.loads((step / record["index"]).read_text())
    assert index["version"] == 1 and index["objects"] == record["objects"]
    a = index["tensors"]["model.a"]
    assert a["global_shape"] == [7, 5] and a["dtype"] == "F32"
    assert sorted((b["offsets"], b["shape"]) for b in a["boxes"]) == [([0, 0], [4, 5]), ([4, 0], [3, 5])]
    b = index["tensors"]["model.b"]
    assert b["dtype"] == "BF16" and sorted(x["offsets"] for x in b["boxes"]) == [[0, 0], [0, 5]]
    c = index["tensors"]["model.c"]  # replicated: written once, by rank 0
    assert [(x["object"], x["shape"]) for x in c["boxes"]] == [(0, [5])]
    n = index["tensors"]["n"]
    assert sorted(x["offsets"] for x in n["boxes"]) == [[0, 0], [5, 0]]


def bits(t: torch.Tensor) -> np.ndarray[Any, Any]:
    return t.contiguous().view(torch.uint8).numpy()


async def test_one_rank_loads_whole_tensors_bit_identical(saved_on_2: Path) -> None:
    async with ckpt() as c:  # this process is a world of one: the step was saved by two
        got = await c.load_step(saved_on_2 / "run", as_torch=True)
        part = await c.load_step(saved_on_2 / "run", keys=["model.b"], as_torch=True)
    assert got.result is None and got.reads is not None
    want = full()
    for k in ("a", "b", "c"):
        assert np.array_equal(bits(got.state["model"][k]), bits(want[k])), k
    assert np.array_equal(got.state["n"].numpy(), want["n"])
    assert torch.equal(got.state["plain"], torch.arange(4)) and got.state["step"] == 3
    assert list(part.state) == ["model"] and list(part.state["model"]) == ["b"]
    assert np.array_equal(bits(part.state["model"]["b"]), bits(want["b"]))


async def test_a_manager_restored_on_another_world_size_reshards_the_latest_step(saved_on_2: Path) -> None:
    async with CheckpointManager(saved_on_2 / "run", chunk_size=CHUNK, num_buffers=3) as mgr:
        assert await mgr.restore() == 1
        assert mgr.restored is not None and mgr.restored.reads is not None
        state = mgr.restored.state
    assert np.array_equal(state["model"]["a"], full()["a"].numpy()) and state["step"] == 3


@pytest.mark.parametrize("ranks", [3, 4])
def test_two_ranks_to_more_ranks_bit_identical(saved_on_2: Path, ranks: int) -> None:
    ok(
        torchrun(
            "tests.reshard_child", "load", str(saved_on_2 / "run"), str(saved_on_2), nproc=ranks, timeout=120
        )
    )
    for r in range(ranks):
        facts = json.loads((saved_on_2 / f"ok-{r}-of-{ranks}.json").read_text())
        assert facts["read"] >= facts["needed"] > 0


def test_a_2x2_mesh_loads_on_two_ranks(tmp_path: Path) -> None:
    ok(torchrun("tests.reshard_child", "save2d", str(tmp_path / "run"), str(tmp_path), nproc=4, timeout=150))
    ok(torchrun("tests.reshard_child", "load", str(tmp_path / "run"), str(tmp_path), nproc=2, timeout=120))
    assert sorted(p.name for p in tmp_path.glob("ok-*")) == ["ok-0-of-2.json", "ok-1-of-2.json"]


def flip(path: Path, needle: bytes) -> int:
    raw = path.read_bytes()
    at = raw.find(needle)
    assert at > 0
    with path.open("r+b") as f:
        f.seek(at)
        f.write(bytes([raw[at] ^ 0x01]))
    return at


def test_a_flipped_byte_is_reported_by_the_rank_that_read_it(saved_on_2: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    ok(torchrun("tests.reshard_child", "save1d", str(run), str(tmp_path), nproc=2, timeout=120))
    # rank 1 of the saving job held rows 4..6 of model.a; on two ranks only rank 1 reads them
    at = flip(run / "step-1" / "rank-1-of-2.safetensors", full()["a"][5].numpy().tobytes())
    ok(torchrun("tests.reshard_child", "load", str(run), str(tmp_path), nproc=2, timeout=120))
    assert (tmp_path / "ok-0-of-2.json").exists() and not (tmp_path / "error-0-of-2.txt").exists()
    offset, message = (tmp_path / "error-1-of-2.txt").read_text().split(" ", 1)
    assert int(offset) == at // CHECK_BLOCK * CHECK_BLOCK  # the checksum block holding the byte
    assert "rank-1-of-2.safetensors" in message


# -- one rank, explicit shards: the errors -----------------------------------------------
def sharded_state() -> dict[str, Any]:
    w = np.arange(60, dtype=np.float32).reshape(6, 10)
    return {"w": Shard((6, 10), (0, 0), w), "b": np.ones(3, np.int32), "step": 2}


async def test_a_destination_of_another_global_shape_or_dtype_is_refused(tmp_path: Path) -> None:
    async with ckpt() as c:
        await c.save_step(tmp_path, 1, sharded_state())
        box = await c.load_step(
            tmp_path,
            into={"w": Shard((6, 10), (2, 3), np.zeros((2, 4), np.float32)), "b": np.zeros(3, np.int32)},
        )
        assert isinstance(box.state["w"], Shard)
        assert np.array_equal(box.state["w"].data, np.arange(60, dtype=np.float32).reshape(6, 10)[2:4, 3:7])
        with pytest.raises(ConfigError, match=r"F32\[6, 11\].*'w' is F32\[6, 10\]"):
            await c.load_step(
                tmp_path,
                into={"w": Shard((6, 11), (0, 0), np.zeros((1, 1), np.float32)), "b": np.zeros(3, np.int32)},
            )
        with pytest.raises(ConfigError, match=r"F64\[6, 10\]"):
            await c.load_step(
                tmp_path, into={"w": Shard((6, 10), (0, 0), np.zeros((1, 1))), "b": np.zeros(3, np.int32)}
            )
        with pytest.raises(ConfigError, match=r"'nope'"):
            await c.load_step(
                tmp_path, into={"w": Shard((6, 10), (0, 0), np.zeros((1, 1), np.float32))}, keys="nope"
            )


async def test_a_shard_outside_its_global_shape_is_refused_before_any_io(tmp_path: Path) -> None:
    async with ckpt() as c:
        with pytest.raises(ConfigError, match=r"state\['w'\].*leaves the global shape"):
            await c.save_state(tmp_path / "x.safetensors", {"w": Shard((4, 4), (2, 0), np.zeros((3, 4)))})
    assert not await asyncio.to_thread(lambda: list(tmp_path.iterdir()))


async def test_an_index_of_another_version_is_a_clear_error(tmp_path: Path) -> None:
    async with ckpt() as c:
        await c.save_step(tmp_path, 1, sharded_state())
        index = tmp_path / "step-1" / "asyncckpt-index.json"
        record = json.loads(await asyncio.to_thread(index.read_text))
        record["version"] = 0
        await asyncio.to_thread(index.write_text, json.dumps(record))
        # as its writer would have: the commit record gives the new file's CRC32C
        commit = tmp_path / "step-1" / COMMIT
        facts = json.loads(await asyncio.to_thread(commit.read_text))
        facts["checksums"]["asyncckpt-index.json"] = digest(index.read_bytes())
        await asyncio.to_thread(commit.write_text, json.dumps(facts))
        with pytest.raises(StateFormatError, match="step index version 0; this asyncckpt reads version 1"):
            await c.load_step(
                tmp_path,
                into={"w": Shard((6, 10), (0, 0), np.zeros((6, 10), np.float32)), "b": np.zeros(3, np.int32)},
            )


# -- one rank: one header read, hops, the copy-out shared between threads -----------------
def test_a_copy_out_is_shared_in_pieces_of_at_least_2_mib_cut_on_64_kib() -> None:
    from asyncckpt.state.reshard import SHARE_MIN, share_cuts

    assert SHARE_MIN == 2 << 20
    assert share_cuts(0, 2) == [(0, 0)] and share_cuts(5, 2) == [(0, 5)]
    assert share_cuts((4 << 20) - 1, 2) == [(0, (4 << 20) - 1)]  # two shares would be under 2 MiB
    assert share_cuts(8 << 20, 1) == [(0, 8 << 20)]
    odd = (4 << 20) + 12345
    assert share_cuts(odd, 2) == [(0, (2 << 20) + (64 << 10)), ((2 << 20) + (64 << 10), odd)]
    cuts = share_cuts(32 << 20, 3)
    assert len(cuts) == 3 and cuts[0][0] == 0 and cuts[-1][1] == 32 << 20
    assert all(a[1] == b[0] and a[1] % (64 << 10) == 0 for a, b in itertools.pairwise(cuts))


def big() -> np.ndarray[Any, Any]:
    return np.random.default_rng(7).standard_normal((1024, 2048), dtype=np.float32)  # 8 MiB


@pytest.mark.parametrize(
    ("chunk_size", "shares"),
    [
        # reads of whole checksum blocks: each read is checked and copied in its own hop as it
        # lands, beside the other reads in flight, so no copy is cut between threads
        (CHUNK, 0),
        # reads that cut blocks (a loading chunk_size the saved blocks do not divide) are
        # checked in order, in one hop: a large copy is shared out
        (CHUNK + 4096, 2),
    ],
)
async def test_large_boxes_load_bit_identical_copied_beside_the_reads_or_shared_between_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk_size: int, shares: int
) -> None:
    from asyncckpt.state import reshard

    shared: list[int] = []
    real = reshard.share_cuts

    def spy(n: int, threads: int) -> list[tuple[int, int]]:
        cuts = real(n, 2)  # as on two cores, whatever this machine has
        shared.append(len(cuts))
        return cuts

    monkeypatch.setattr(reshard, "share_cuts", spy)
    w = big()
    async with ckpt() as c:
        await c.save_step(tmp_path, 1, {"w": Shard(w.shape, (0, 0), w), "step": 5})
    async with AsyncCheckpointer(chunk_size=chunk_size, num_buffers=3) as c:  # reads of chunk_size
        rows = await c.load_step(
            tmp_path, into={"w": Shard(w.shape, (100, 0), np.zeros((800, 2048), np.float32))}
        )
        cols = await c.load_step(
            tmp_path, into={"w": Shard(w.shape, (0, 3), np.zeros((1024, 1000), np.float32))}
        )
    assert max(shared, default=0) == shares  # the views of the direct (row) copy cut in two, or none
    assert np.array_equal(rows.state["w"].data, w[100:900]) and rows.state["step"] == 5
    assert np.array_equal(cols.state["w"].data, w[:, 3:1003])
    assert rows.reads is not None and rows.reads.read <= 1.1 * rows.reads.needed


async def test_a_flipped_byte_in_a_shared_copy_out_is_still_reported(tmp_path: Path) -> None:
    w = big()
    async with ckpt() as c:
        await c.save_step(tmp_path, 1, {"w": Shard(w.shape, (0, 0), w)})
        at = await asyncio.to_thread(flip, tmp_path / "step-1" / "rank-0-of-1.safetensors", w[600].tobytes())
        with pytest.raises(ChecksumMismatchError) as info:
            await c.load_step(
                tmp_path, into={"w": Shard(w.shape, (512, 0), np.zeros((512, 2048), np.float32))}
            )
    assert info.value.offset == at // CHECK_BLOCK * CHECK_BLOCK


async def test_a_rank_reading_boxes_of_rank_0s_object_reads_its_header_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from asyncckpt.state import reshard

    again: list[str] = []
    real = reshard.read_prefix

    async def spy(sink: Any, size: int, uri: str) -> Any:
        again.append(uri)
        return await real(sink, size, uri)

    monkeypatch.setattr(reshard, "read_prefix", spy)  # the tree's own read of the header
    w = np.arange(60, dtype=np.float32).reshape(6, 10)
    async with ckpt() as c:
        await c.save_step(tmp_path, 1, {"w": Shard((6, 10), (0, 0), w), "step": 2})
        got = await c.load_step(tmp_path, into={"w": Shard((6, 10), (2, 0), np.zeros((2, 10), np.float32))})
    assert got.state["step"] == 2 and np.array_equal(got.state["w"].data, w[2:4])
    assert again == []


async def test_each_read_is_verified_and_copied_out_in_one_thread_hop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from asyncckpt.state import reshard

    hops: list[str] = []
    real = reshard.run_blocking

    async def spy(executor: Any, fn: Any, *args: Any) -> Any:
        hops.append(getattr(fn, "__name__", repr(fn)))
        return await real(executor, fn, *args)

    monkeypatch.setattr(reshard, "run_blocking", spy)  # the resharded load's own hops, not the reads'
    w = np.random.default_rng(3).standard_normal((256, 1024), dtype=np.float32)  # 1 MiB
    async with ckpt() as c:
        await c.save_step(tmp_path, 1, {f"t{i}": Shard(w.shape, (0, 0), w) for i in range(16)})
        into = {f"t{i}": Shard(w.shape, (64, 0), np.zeros((64, 1024), np.float32)) for i in range(16)}
        got = await c.load_step(tmp_path, into=into)  # 16 boxes of 256 KiB: 16 separate reads
    assert all(np.array_equal(got.state[f"t{i}"].data, w[64:128]) for i in range(16))
    assert sorted(hops) == ["_rebuild", "_wants_and_plan"], hops  # no hop per read


def test_a_view_that_fails_its_checksum_is_not_delivered() -> None:
    from asyncckpt.engine.loader import check_then_deliver, check_whole_then_deliver
    from asyncckpt.engine.verify import Mismatch

    class Bad:
        def check_cpu_sync(self, offset: int, view: memoryview) -> tuple[Mismatch | None, float, float]:
            return Mismatch(0, None), 0.0, 0.0

        check_whole_cpu_sync = check_cpu_sync

    got: list[tuple[int, bool]] = []

    def keep(at: int, v: memoryview, beside: bool) -> None:
        got.append((at, beside))

    x = memoryview(b"x")
    assert check_then_deliver(Bad(), keep, 7, x)[0] == Mismatch(0, None) and got == []  # type: ignore[arg-type]
    assert check_whole_then_deliver(Bad(), keep, 7, x)[0] == Mismatch(0, None) and got == []  # type: ignore[arg-type]
    assert check_then_deliver(None, keep, 7, x)[0] is None and got == [(7, False)]
    assert check_whole_then_deliver(None, keep, 8, x)[0] is None and got == [(7, False), (8, True)]


def blocks_and_manifest(block: int, size: int) -> tuple[bytearray, Any]:
    """Random bytes and a manifest of their CRC32C per ``block`` (and the whole object's)."""
    import os

    from asyncckpt.checksum import combine_all, crc
    from asyncckpt.engine.manifest import Manifest

    data = bytearray(os.urandom(size))
    crcs = tuple(crc(bytes(data[i : i + block])) for i in range(0, size, block))
    whole = combine_all((c, min(block, size - i * block)) for i, c in enumerate(crcs))
    manifest = Manifest(
        object="o",
        size=size,
        chunk_size=block,
        generator="caller",
        seed=None,
        chunk_crc32c=crcs,
        object_crc32c=whole,
    )
    return data, manifest


def test_reads_of_whole_blocks_are_checked_on_their_own_and_others_are_not_taken_for_them() -> None:
    from asyncckpt.engine.verify import BlockVerifier, Mismatch

    block, size = 4096, 4096 * 5 + 100  # the last block is short
    data, m = blocks_and_manifest(block, size)
    v = BlockVerifier(m)
    assert v.whole_reads([(0, size)], 2 * block)
    assert v.whole_reads([(block, 2 * block), (4 * block, size - 4 * block)], block)
    assert not v.whole_reads([(0, size)], 2 * block + 4096 // 2)  # a read size the blocks do not divide
    assert not v.whole_reads([(100, block)], block)  # a span off a block boundary
    assert not v.whole_reads([(0, block + 100)], block)  # a span ending inside a block
    # in any order, each read alone, the short last block included
    assert v.check_whole_cpu_sync(4 * block, memoryview(data)[4 * block :])[0] is None
    assert v.check_whole_cpu_sync(0, memoryview(data)[: 2 * block])[0] is None
    data[3 * block + 7] ^= 1
    assert v.check_whole_cpu_sync(2 * block, memoryview(data)[2 * block : 4 * block])[0] == Mismatch(3, None)
    with pytest.raises(RuntimeError, match="does not hold chunk 0 whole"):
        v.check_whole_cpu_sync(0, memoryview(data)[:100])


def test_in_order_checks_of_several_blocks_per_read_name_the_bad_block() -> None:
    """Whole blocks in a read are checked with one CRC against the manifest's combined; the
    reads below also start and end inside blocks, and a flipped byte is still named by block."""
    import itertools

    from asyncckpt.engine.verify import BlockVerifier, ChecksumVerifier, Mismatch, runs

    block, size = 4096, 4096 * 9 + 100  # the last block is short
    data, m = blocks_and_manifest(block, size)
    # whole blocks merged into one run, parts of blocks alone
    assert list(runs(m, 100, 3 * block)) == [
        (0, 100, 0, block - 100, 0),
        (1, 0, block - 100, 2 * block, 2),
        (3, 0, 3 * block - 100, 100, 0),
    ]
    cuts = [0, 100, 3 * block + 100, 3 * block + 200, 8 * block, size]  # reads in order
    for flip in (None, 5 * block + 9, size - 1, 50):
        if flip is not None:
            data[flip] ^= 1
        for v in (ChecksumVerifier(m), BlockVerifier(m)):
            bad = None
            for lo, hi in itertools.pairwise(cuts):
                bad, _ = v.check_sync(lo, memoryview(data)[lo:hi])
                if bad is not None:
                    break
            if flip is None:
                assert bad is None
                v.finish_sync()  # the whole-object CRC of the checksum verifier agrees too
            else:
                assert bad == Mismatch(flip // block, None), (type(v).__name__, flip)
        if flip is not None:
            data[flip] ^= 1


def s3_env(ep: S3Endpoint) -> str:
    return json.dumps(
        {"endpoint": ep.endpoint, "key": ep.access_key, "secret": ep.secret_key, "region": ep.region}
    )


def test_two_ranks_to_three_on_s3(s3_endpoint: S3Endpoint, tmp_path: Path) -> None:
    bucket = new_bucket(s3_endpoint)
    root, env = f"s3://{bucket}/run", {"RESHARD_S3": s3_env(s3_endpoint)}
    ok(torchrun("tests.reshard_child", "save1d", root, str(tmp_path), nproc=2, timeout=150, **env))
    ok(torchrun("tests.reshard_child", "load", root, str(tmp_path), nproc=3, timeout=150, **env))
    assert len(list(tmp_path.glob("ok-*-of-3.json"))) == 3


@pytest.fixture
def unsavable(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """DTensors asyncckpt cannot save, in a gloo world of one in this process (made here, not
    on the test's event loop: the first DTensor imports a good part of torch): one with a
    Partial placement, and one whose local tensor is not on the CPU (``meta``: this torch
    build has no CUDA; the check is on the device type)."""
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        off_cpu = torch.empty(3, 2, device="meta")
        yield {
            "partial": DTensor.from_local(torch.ones(3, 2), mesh, [Partial()]),
            "device": DTensor.from_local(off_cpu, mesh, [Replicate()], run_check=False),
        }
    finally:
        dist.destroy_process_group()


async def test_partial_placements_and_off_cpu_dtensors_are_refused_naming_the_leaf(
    unsavable: dict[str, Any], tmp_path: Path
) -> None:
    async with ckpt() as c:
        with pytest.raises(ConfigError, match=r"state\['grads'\]\['w'\].*Partial placement"):
            await c.save_state(tmp_path / "p.safetensors", {"grads": {"w": unsavable["partial"]}})
        with pytest.raises(ConfigError, match=r"state\['opt'\]\['m'\].*DTensor on meta: .*no device path"):
            await c.save_state(tmp_path / "p.safetensors", {"opt": {"m": unsavable["device"]}})
    assert not (tmp_path / "p.safetensors").exists()


def box(
    name: str, offsets: list[int], shape: list[int], global_shape: list[int], dtype: str = "F32"
) -> dict[str, Any]:
    return {"name": name, "dtype": dtype, "shape": shape, "start": 4096, "end": 4096 + 4 * math.prod(shape),
            "global_shape": global_shape, "offsets": offsets}  # fmt: skip


def test_ranks_that_disagree_on_a_tensor_or_leave_a_gap_are_refused_before_the_commit() -> None:
    objects = ["rank-0-of-2.safetensors", "rank-1-of-2.safetensors"]
    good = step_index.build(objects, [[box("w", [0, 0], [2, 4], [4, 4])], [box("w", [2, 0], [2, 4], [4, 4])]])
    assert step_index.parse(good, "x").tensors["w"].global_shape == (4, 4)
    with pytest.raises(ConfigError, match=r"'w': rank 1 saved F32\[5, 4\], an earlier rank F32\[4, 4\]"):
        step_index.build(objects, [[box("w", [0, 0], [2, 4], [4, 4])], [box("w", [2, 0], [2, 4], [5, 4])]])
    with pytest.raises(ConfigError, match="hold 8 of its 16 elements"):
        step_index.build(objects, [[box("w", [0, 0], [2, 4], [4, 4])], [box("w", [0, 0], [0, 4], [4, 4])]])
    with pytest.raises(StateFormatError, match="not an asyncckpt step index"):
        step_index.parse({"format": "other"}, "x")

"""PyTorch DCP through asyncckpt: dcp.save / async_save / load on files and S3, 2 gloo ranks, a crash."""

from __future__ import annotations

import os
import pickle
import threading
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402

from asyncckpt import ChecksumMismatchError, ConfigError  # noqa: E402
from asyncckpt.integrations.dcp import (  # noqa: E402
    AsyncCkptStorageReader,
    AsyncCkptStorageWriter,
    close_shared_threads,
)
from asyncckpt.integrations.dcp_convert import to_stock  # noqa: E402
from asyncckpt.servers.s3endpoint import S3Endpoint  # noqa: E402

from .dcp_child import expected  # noqa: E402
from .launch import torchrun  # noqa: E402
from .s3_harness import CHUNK as S3_CHUNK  # noqa: E402
from .s3_harness import new_bucket  # noqa: E402

CHUNK = 1 << 20
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def trained(seed: int) -> tuple[Any, Any]:
    """A small model and its Adam optimizer after one step (so the optimizer has state)."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 64))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(8, 256)).square().mean().backward()
    opt.step()
    return model, opt


def state_of(model: Any, opt: Any) -> dict[str, Any]:
    extra = {"bf16": torch.arange(30, dtype=torch.float32).to(torch.bfloat16), "empty": torch.empty(0, 3)}
    return {"model": model.state_dict(), "optim": opt.state_dict(), "step": 42, "extra": extra}


def assert_identical(got: Any, want: Any, path: str = "state") -> None:
    if isinstance(want, dict):
        assert set(got) == set(want), path
        for k in want:
            assert_identical(got[k], want[k], f"{path}[{k!r}]")
    elif isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and got.shape == want.shape, path
        assert (
            got.view(-1).view(torch.uint8).numpy().tobytes()
            == want.view(-1).view(torch.uint8).numpy().tobytes()
        )
    else:
        assert got == want, path


def failure_of(info: pytest.ExceptionInfo[CheckpointException]) -> BaseException:
    """The one rank's exception inside DCP's CheckpointException (DCP keeps (exc, traceback))."""
    (failure,) = info.value.failures.values()
    exc = failure[0] if isinstance(failure, tuple) else failure
    assert isinstance(exc, BaseException)
    return exc


def round_trip(target: str, use_async: bool, **options: Any) -> None:
    options = {"chunk_size": CHUNK, "num_buffers": 3, **options}
    model, opt = trained(1)
    saved = state_of(model, opt)
    with AsyncCkptStorageWriter(target, **options) as writer:
        if use_async:
            dcp.async_save(saved, storage_writer=writer).result()
        else:
            dcp.save(saved, storage_writer=writer)
    fresh_model, fresh_opt = trained(2)  # different values, same structure
    into = state_of(fresh_model, fresh_opt)
    into["step"] = 0
    with AsyncCkptStorageReader(target, **options) as reader:
        dcp.load(into, storage_reader=reader)
    assert_identical(into, saved)
    fresh_model.load_state_dict(into["model"])
    x = torch.randn(4, 256)
    assert torch.equal(fresh_model(x), model(x))  # the restored model computes bit-identical outputs


@pytest.mark.parametrize("use_async", [False, True], ids=["save", "async_save"])
def test_round_trip_on_files(tmp_path: Path, use_async: bool, leak_check: None) -> None:
    round_trip(str(tmp_path / "ckpt"), use_async)
    names = sorted(os.listdir(tmp_path / "ckpt"))
    assert names == [".metadata", "__0_0.distcp"]
    assert not [t for t in threading.enumerate() if t.name.startswith("asyncckpt")]


@pytest.mark.parametrize("use_async", [False, True], ids=["save", "async_save"])
def test_round_trip_on_s3(s3_endpoint: S3Endpoint, use_async: bool) -> None:
    bucket = new_bucket(s3_endpoint)
    options = s3_endpoint.options()
    round_trip(
        f"s3://{bucket}/run/step-1",
        use_async,
        chunk_size=S3_CHUNK,
        backend="aiobotocore",
        backend_options=options,
    )
    keys = sorted(o["Key"] for o in s3_endpoint.client().list_objects_v2(Bucket=bucket)["Contents"])
    assert keys == ["run/step-1/.metadata", "run/step-1/__0_0.distcp"]


def test_a_corrupt_byte_fails_the_load(tmp_path: Path) -> None:
    model, opt = trained(1)
    with AsyncCkptStorageWriter(tmp_path, chunk_size=CHUNK) as writer:
        dcp.save(state_of(model, opt), storage_writer=writer)
    data = tmp_path / "__0_0.distcp"
    raw = bytearray(data.read_bytes())
    raw[100_000] ^= 0x01  # inside a tensor
    data.write_bytes(raw)
    with (
        AsyncCkptStorageReader(tmp_path, chunk_size=CHUNK) as reader,
        pytest.raises(CheckpointException) as info,
    ):
        dcp.load(state_of(*trained(2)), storage_reader=reader)
    failure = failure_of(info)
    assert isinstance(failure, ChecksumMismatchError) and failure.chunk == 0


def test_an_uncommitted_checkpoint_is_refused(tmp_path: Path) -> None:
    (tmp_path / "__0_0.distcp").write_bytes(b"x" * 4096)  # data without its .metadata
    with AsyncCkptStorageReader(tmp_path) as reader, pytest.raises(CheckpointException) as info:
        dcp.load(state_of(*trained(2)), storage_reader=reader)
    # DCP wraps the reader's TargetNotFoundError: "metadata is None; global metadata read failed: ..."
    assert (
        f"no committed DCP checkpoint at {str(tmp_path)!r}: {str(tmp_path / '.metadata')!r} does not exist"
        in str(failure_of(info))
    )


def test_conversion_and_strided_destinations(tmp_path: Path) -> None:
    saved = {"w": torch.randn(300, 200), "v": torch.randn(50, 40)}
    with AsyncCkptStorageWriter(tmp_path) as writer:
        dcp.save(saved, storage_writer=writer)
    into = {"w": torch.zeros(200, 300).t(), "v": torch.zeros(50, 40, dtype=torch.float64)}
    with AsyncCkptStorageReader(tmp_path) as reader:
        dcp.load(into, storage_reader=reader)
    assert not into["w"].is_contiguous() and torch.equal(into["w"], saved["w"])
    assert into["v"].dtype == torch.float64 and torch.equal(into["v"], saved["v"].double())


def test_overwrite(tmp_path: Path) -> None:
    state = state_of(*trained(1))
    with AsyncCkptStorageWriter(tmp_path) as writer:
        dcp.save(state, storage_writer=writer)
    with (
        AsyncCkptStorageWriter(tmp_path, overwrite=False) as writer,
        pytest.raises(CheckpointException) as info,
    ):
        dcp.save(state, storage_writer=writer)
    failure = failure_of(info)
    assert isinstance(failure, ConfigError) and "overwrite=False" in str(failure)
    state["step"] = 43
    with AsyncCkptStorageWriter(tmp_path) as writer:  # overwrite=True (DCP's default)
        dcp.save(state, storage_writer=writer)
    into = state_of(*trained(2))
    with AsyncCkptStorageReader(tmp_path) as reader:
        dcp.load(into, storage_reader=reader)
    assert into["step"] == 43


def zeroed_expected() -> dict[str, Any]:
    """The 2-rank runs' state, unsharded, every tensor zero: a destination to load into."""
    into = {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else v for k, v in expected().items()}
    into["optim"] = {k: torch.zeros_like(v) for k, v in expected()["optim"].items()}
    return into


@pytest.mark.torchrun
def test_two_gloo_ranks_sharded_and_replicated(tmp_path: Path) -> None:
    with AsyncCkptStorageWriter(tmp_path / "full") as writer:  # one process, unsharded: resharded on load
        dcp.save(expected(), storage_writer=writer)
    proc = torchrun("tests.dcp_child", "roundtrip", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert sorted(os.listdir(tmp_path / "a")) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    # resharded on load: both ranks' shards into one full tensor, in a single process
    into = zeroed_expected()
    with AsyncCkptStorageReader(tmp_path / "a") as reader:
        dcp.load(into, storage_reader=reader)
    assert_identical(into, expected())


@pytest.mark.torchrun
def test_a_rank_killed_mid_save_publishes_nothing(tmp_path: Path) -> None:
    proc = torchrun("tests.dcp_child", "crash", str(tmp_path))
    assert proc.returncode != 0
    assert "Signals.SIGKILL" in proc.stderr or "SIGKILL" in proc.stderr, proc.stderr[-4000:]
    assert (tmp_path / "prev" / ".metadata").exists()
    left = sorted(os.listdir(tmp_path / "partial"))  # rank 0's object committed, rank 1's torn mid-write
    assert "__0_0.distcp" in left and "__1_0.distcp" not in left and ".metadata" not in left, left
    assert any(name.startswith(".__1_0.distcp") and name.endswith(".partial") for name in left), left
    into = zeroed_expected()
    with AsyncCkptStorageReader(tmp_path / "prev") as reader:  # the previous checkpoint still loads
        dcp.load(into, storage_reader=reader)
    assert_identical(into, expected())
    with AsyncCkptStorageReader(tmp_path / "partial") as reader, pytest.raises(CheckpointException) as info:
        dcp.load(into, storage_reader=reader)
    assert "no committed DCP checkpoint" in str(failure_of(info))


@pytest.mark.torchrun
def test_process_based_async_save_on_two_gloo_ranks(tmp_path: Path) -> None:
    """Issue 27 item 5: ``async_save(async_checkpointer_type=PROCESS)`` hands the writer to DCP's
    checkpoint daemon (pickled), with DCP's default stager and with a ``DefaultStager``."""
    proc = torchrun("tests.dcp_process_child", str(tmp_path), timeout=180)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.count(": loaded") == 2
    for name in ("p1", "p2", "p3"):
        assert sorted(os.listdir(tmp_path / name)) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    into = zeroed_expected()  # resharded on load: both ranks' shards into one full tensor
    with AsyncCkptStorageReader(tmp_path / "p2") as reader:
        dcp.load(into, storage_reader=reader)
    assert_identical(into, expected())
    to_stock(tmp_path / "p3", tmp_path / "stock")  # two ranks' objects in DCP's stock layout
    into = zeroed_expected()
    dcp.load(into, storage_reader=dcp.FileSystemReader(str(tmp_path / "stock")))
    assert_identical(into, expected())


def test_a_pickled_writer_shares_one_thread_per_process(tmp_path: Path) -> None:
    """What DCP's checkpoint daemon does with each save: unpickle the writer. Its copies share
    one checkpointer thread (and pool); an unpicklable progress callback is a ConfigError."""
    with AsyncCkptStorageWriter(tmp_path, chunk_size=CHUNK) as writer:
        first, second = pickle.loads(pickle.dumps(writer)), pickle.loads(pickle.dumps(writer))
        assert first.thread is second.thread and first.thread is not writer.thread
        dcp.save({"w": torch.arange(10.0)}, storage_writer=first, checkpoint_id=tmp_path / "a")
        assert [t for t in threading.enumerate() if t.name == "asyncckpt-dcp-writer"]
        close_shared_threads()
        assert not [t for t in threading.enumerate() if t.name.startswith("asyncckpt")]
        into = {"w": torch.zeros(10)}
        with AsyncCkptStorageReader(tmp_path / "a") as reader:
            dcp.load(into, storage_reader=reader)
        assert torch.equal(into["w"], torch.arange(10.0))
    with (
        AsyncCkptStorageWriter(tmp_path, progress=lambda n: None) as writer,
        pytest.raises(ConfigError, match="cannot be pickled"),
    ):
        pickle.dumps(writer)

"""Issue 27 item 5: an asyncckpt DCP checkpoint converted to DCP's stock layout loads with
torch's own ``FileSystemReader``; bad input and a corrupt source leave nothing behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

from asyncckpt import ChecksumMismatchError, ConfigError  # noqa: E402
from asyncckpt.integrations.dcp import AsyncCkptStorageWriter  # noqa: E402
from asyncckpt.integrations.dcp_convert import main, to_stock  # noqa: E402

from .launch import ROOT, child_env, torchrun  # noqa: E402
from .test_dcp import CHUNK, assert_identical, state_of, trained  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def convert_cli(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "asyncckpt.integrations.dcp_convert", *args]
    return subprocess.run(cmd, env=child_env(), capture_output=True, text=True, timeout=60, cwd=ROOT)


@pytest.fixture
def saved(tmp_path: Path) -> tuple[Path, dict[str, object]]:
    state = state_of(*trained(1))  # model + Adam state, a bfloat16 and an empty tensor, step 42
    with AsyncCkptStorageWriter(tmp_path / "src", chunk_size=CHUNK) as writer:
        dcp.save(state, storage_writer=writer)
    return tmp_path / "src", state


def test_the_converted_checkpoint_loads_with_torchs_filesystem_reader(
    saved: tuple[Path, dict[str, object]], tmp_path: Path
) -> None:
    src, state = saved
    proc = convert_cli(str(src), str(tmp_path / "stock"))
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert "converted 1 object(s)" in proc.stdout
    assert sorted(os.listdir(tmp_path / "stock")) == [".metadata", "__0_0.distcp"]
    into = state_of(*trained(2))
    into["step"] = 0
    dcp.load(into, storage_reader=dcp.FileSystemReader(str(tmp_path / "stock")))
    assert_identical(into, state)


def test_bad_input_is_one_line_and_rc_2(
    saved: tuple[Path, dict[str, object]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src, _ = saved
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / ".metadata").write_bytes(b"not ours")
    assert main([str(src), str(taken)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "already holds .metadata" in err, err
    assert sorted(os.listdir(taken)) == [".metadata"] and (taken / ".metadata").read_bytes() == b"not ours"
    assert main([str(tmp_path / "nothing"), str(tmp_path / "out")]) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and "no committed asyncckpt DCP checkpoint" in err, err
    assert not (tmp_path / "out").exists()
    with pytest.raises(ConfigError, match="must be a local directory"):
        to_stock(src, "s3://bucket/stock")


def test_a_corrupt_source_fails_and_leaves_nothing(
    saved: tuple[Path, dict[str, object]], tmp_path: Path
) -> None:
    src, _ = saved
    data = src / "__0_0.distcp"
    raw = bytearray(data.read_bytes())
    raw[100_000] ^= 0x01
    data.write_bytes(raw)
    with pytest.raises(ChecksumMismatchError):
        to_stock(src, tmp_path / "stock", chunk_size=CHUNK)
    assert os.listdir(tmp_path / "stock") == []  # no object, no temporary, no .metadata


def test_a_rank_with_nothing_to_write_converts(tmp_path: Path) -> None:
    """Before: rank 1's empty tensor is in ``.metadata`` at ``__1_0.distcp``, which rank 1 never
    wrote (0 bytes); the converter opened it: rc 2, ``No such file or directory``."""
    proc = torchrun("tests.dcp_empty_child", str(tmp_path / "src"), nproc=2, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(os.listdir(tmp_path / "src")) == [".metadata", "__0_0.distcp"]
    proc = convert_cli(str(tmp_path / "src"), str(tmp_path / "stock"))
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert sorted(os.listdir(tmp_path / "stock")) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    into = {"w": torch.zeros(10), "e0": torch.ones(0), "e1": torch.ones(0)}
    dcp.load(into, storage_reader=dcp.FileSystemReader(str(tmp_path / "stock")))
    assert torch.equal(into["w"], torch.arange(10.0))


def test_a_destination_file_a_stock_source_and_bad_arguments_are_one_line_and_rc_2(
    saved: tuple[Path, dict[str, object]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: a destination that is a file was rc 1 (``[Errno 17] create ...: File exists``),
    a stock DCP checkpoint as the source rc 1 (``has no manifest``), and a missing argument two
    lines (argparse's usage, then the error)."""
    src, state = saved
    afile = tmp_path / "afile"
    afile.write_bytes(b"x")
    assert main([str(src), str(afile)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and "exists and is not a directory" in err, err
    stock = tmp_path / "stock-src"
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(stock)))
    assert main([str(stock), str(tmp_path / "out")]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and "is not an asyncckpt DCP checkpoint" in err, err
    assert not (tmp_path / "out").exists()
    proc = convert_cli(str(src))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "the following arguments are required: dst (usage: " in proc.stderr

"""One command-line grammar: subcommand words first, ./NAME for a colliding target, +/++
overrides handed to one hook; ``python -m asyncckpt.bench [TARGET] [options]`` unchanged."""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path

import pytest

from asyncckpt.bench.grammar import RESERVED, Override, split_command
from asyncckpt.errors import ConfigError

from .conftest import checkpoint_data, run_bench

bench = functools.partial(run_bench, timeout=60)


def test_split_command() -> None:
    assert split_command(["report", "r.json", "-q"]).name == "report"
    assert split_command(["report", "r.json"]).argv == ["r.json"]
    plain = split_command(["./compare", "--size", "1GiB"])
    assert (plain.name, plain.argv) == (None, ["./compare", "--size", "1GiB"])
    assert split_command([]).name is None
    # a reserved word later on is not a subcommand (check_target then explains)
    assert split_command(["--size", "1GiB", "compare"]).name is None
    cmd = split_command(["/t", "+a=1", "--seed", "+5", "++b.c=x=y", "--", "+c=3"])
    assert cmd.argv == ["/t", "--seed", "+5", "--", "+c=3"]
    assert cmd.overrides == (Override("+a=1", "a", "1", False), Override("++b.c=x=y", "b.c", "x=y", True))
    assert {"report", "compare", "cleanup", "plan"} <= set(RESERVED)


@pytest.mark.parametrize("token", ["+=1", "+++a=1", "+1a=2"])
def test_bad_override_tokens_are_named(token: str) -> None:
    with pytest.raises(ConfigError, match="must look like"):
        split_command([token])


def test_reserved_word_as_target_says_how_to_name_it(tmp_path: Path) -> None:
    proc = bench("--size", "1MiB", "compare", cwd=tmp_path)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "write ./compare" in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_dot_slash_names_a_target_called_like_a_subcommand(tmp_path: Path) -> None:
    args = ("--size", "1MiB", "--chunk-size", "1MiB", "--mode", "save", "--keep", "-q")
    proc = bench("./compare", *args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert len(checkpoint_data((tmp_path / "compare").read_bytes())) == 2**20


def test_reserved_but_unimplemented_word(tmp_path: Path) -> None:
    proc = bench("plan", "/x", cwd=tmp_path)
    assert proc.returncode == 2 and "'plan' is reserved for a future subcommand" in proc.stderr


def test_an_override_of_an_unknown_section_is_bad_input(tmp_path: Path) -> None:
    """Override tokens are recognised by the grammar and applied by the workload loader."""
    run = subprocess.run(
        [sys.executable, "-m", "asyncckpt.bench", str(tmp_path / "x"), "++workflow.checkpoint=True"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr
    assert "keys start with 'workload.'" in run.stderr
    assert not (tmp_path / "x").exists()

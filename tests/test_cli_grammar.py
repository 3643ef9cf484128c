"""One command-line grammar: subcommand words first, ./NAME for a colliding target, +/++
overrides handed to one hook; ``python -m asyncckpt.bench [TARGET] [options]`` unchanged."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from asyncckpt.bench import cli, grammar
from asyncckpt.bench.grammar import RESERVED, Override, split_command
from asyncckpt.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent


def bench(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "asyncckpt.bench", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


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
    assert (tmp_path / "compare").stat().st_size == 2**20


def test_reserved_but_unimplemented_word(tmp_path: Path) -> None:
    proc = bench("cleanup", "/x", cwd=tmp_path)
    assert proc.returncode == 2 and "'cleanup' is reserved for a future subcommand" in proc.stderr


def test_overrides_without_an_implementation_are_bad_input(tmp_path: Path) -> None:
    proc = bench(str(tmp_path / "ck.bin"), "--size", "1MiB", "++workflow.checkpoint=True", cwd=tmp_path)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "overrides are not supported by this build: ++workflow.checkpoint=True" in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_overrides_reach_the_hook_with_the_parsed_arguments(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    seen: list[tuple[argparse.Namespace, Sequence[Override]]] = []

    def hook(args: argparse.Namespace, overrides: Sequence[Override]) -> None:
        seen.append((args, overrides))
        raise ConfigError("hook stops the run before any I/O")

    monkeypatch.setattr(grammar, "OVERRIDE_HOOK", hook)
    target = str(tmp_path / "ck.bin")
    assert cli.main([target, "+model.size=8", "--size", "1MiB"]) == 2
    ((args, overrides),) = seen
    assert args.target == target and args.size == 2**20 and args.overrides == overrides
    assert [(o.key, o.value, o.force) for o in overrides] == [("model.size", "8", False)]
    assert "hook stops the run" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []

"""One module reads the environment: asyncckpt/env.py. This test keeps it that way."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import asyncckpt
from asyncckpt import env
from asyncckpt.errors import ConfigError

PACKAGE = Path(asyncckpt.__file__).parent
#: modules being rewritten elsewhere (the S3 core); they move to asyncckpt.env's accessors
#: (aws_variable, load_balance_strategy, s3dlio_variable, child_environ) and leave this list
ALLOWED_READS: frozenset[str] = frozenset()  # none: every module reads through asyncckpt.env
ENV_NAMES = frozenset({"environ", "environb", "getenv", "getenvb"})
WRITE_METHODS = frozenset({"update", "pop", "clear", "__setitem__", "__delitem__"})
MARK = "# env-write:"  # on the write's line or one of the two above


def _is_env(node: ast.AST) -> bool:
    """``os.environ`` and friends (a ``from os import environ`` is flagged at the import)."""
    return (
        isinstance(node, ast.Attribute)
        and node.attr in ENV_NAMES
        and isinstance(node.value, ast.Name)
        and node.value.id == "os"
    )


def env_uses(source: str) -> tuple[list[int], list[int]]:
    """(lines that read the environment, lines that write it) in ``source``."""
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    reads: list[int] = []
    writes: list[int] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            if any(alias.name in ENV_NAMES for alias in node.names):
                reads.append(node.lineno)
            continue
        if not _is_env(node):
            continue
        up = parents.get(node)
        stored = isinstance(up, ast.Subscript) and isinstance(up.ctx, (ast.Store, ast.Del))
        called = (
            isinstance(up, ast.Attribute)
            and up.attr in WRITE_METHODS
            and isinstance(call := parents.get(up), ast.Call)
            and isinstance(parents.get(call), ast.Expr)  # the value is discarded: a pure write
        )
        (writes if stored or called else reads).append(node.lineno)
    return sorted(reads), sorted(writes)


def test_the_checker_sees_reads_and_writes() -> None:
    src = (
        "import os\nfrom os import getenv\na = os.environ.get('X')\nb = dict(os.environ)\n"
        "os.environ['Y'] = '1'\nos.environ.pop('Y', None)\nc = os.getenv('Z')\n"
    )
    assert env_uses(src) == ([2, 3, 4, 7], [5, 6])


def test_only_env_module_reads_the_environment() -> None:
    offenders = []
    unmarked = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel == "env.py":
            continue
        text = path.read_text()
        reads, writes = env_uses(text)
        if reads and rel not in ALLOWED_READS:
            offenders += [f"{rel}:{n}" for n in reads]
        lines = text.splitlines()
        for n in writes:
            if rel not in ALLOWED_READS and not any(MARK in ln for ln in lines[max(0, n - 3) : n]):
                unmarked.append(f"{rel}:{n}")
    assert not offenders, f"read the environment through asyncckpt.env, not directly: {offenders}"
    assert not unmarked, f"mark environment writes with {MARK!r} saying why, or use env.export: {unmarked}"


def test_accessors_read_the_given_mapping_and_name_bad_values() -> None:
    assert env.data_generator({}) == "dgen"
    assert env.data_generator({env.DATA_GEN: " NumPy "}) == "numpy"
    with pytest.raises(ConfigError, match=r"ASYNCCKPT_DATA_GEN='bogus' is not one of"):
        env.data_generator({env.DATA_GEN: "bogus"})
    assert env.start_method({"MLPS_CHECKPOINT_MP_START_METHOD": "spawn"}) == (
        "spawn",
        "MLPS_CHECKPOINT_MP_START_METHOD",
    )
    assert env.start_method({}) is None
    assert env.load_balance_strategy({env.LOAD_BALANCE_STRATEGY: ""}) is None
    assert env.aws_variable("region", {"AWS_DEFAULT_REGION": "eu", "AWS_REGION": ""}) == (
        "AWS_DEFAULT_REGION",
        "eu",
    )


def test_exported_restores_what_was_there(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCCKPT_TEST_A", "before")
    monkeypatch.delenv("ASYNCCKPT_TEST_B", raising=False)
    with env.exported({"ASYNCCKPT_TEST_A": "a", "ASYNCCKPT_TEST_B": "b"}):
        assert env.child_environ()["ASYNCCKPT_TEST_A"] == "a"
        assert env.environ()["ASYNCCKPT_TEST_B"] == "b"
    assert env.environ()["ASYNCCKPT_TEST_A"] == "before"
    assert "ASYNCCKPT_TEST_B" not in env.environ()

"""The library core never imports the CLI (asyncckpt.bench) or the test servers (asyncckpt.servers)."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys

import asyncckpt

OUTER = ("asyncckpt.bench", "asyncckpt.servers")


def core_modules() -> list[str]:
    """Every module of the package outside the CLI and the servers (the sinks' included)."""
    found = pkgutil.walk_packages(asyncckpt.__path__, "asyncckpt.")
    return sorted(m.name for m in found if not m.name.startswith(OUTER) and not m.name.endswith("__main__"))


def test_core_modules_import_neither_the_cli_nor_the_servers() -> None:
    modules = core_modules()
    assert {"asyncckpt.checkpointer", "asyncckpt.engine.pipeline", "asyncckpt.sinks.file"} <= set(modules)
    probe = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.startswith({OUTER!r}))))\n"
    )
    cmd = [sys.executable, "-c", probe]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=60)
    assert json.loads(out.stdout) == []


def test_the_servers_are_reachable_from_the_cli() -> None:
    from asyncckpt.bench.cli import build_parser
    from asyncckpt.servers.embedded import start_for_bench

    assert callable(start_for_bench)
    assert "--embedded-s3" in build_parser().format_help()

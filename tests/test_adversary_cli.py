"""Issue 25: what a new user and an adversary hit on the bench CLI.

Bad input and unusable targets are one line on stderr and exit 2 before any I/O; a run leaves
no folder it made behind; small grammar and documentation faults. Read-only file systems are
real (a tmpfs mounted ``ro``): root ignores mode bits, so a chmod'ed folder would refuse nothing.

The adversary's whole list, item by item, and the test that reproduces each (each failed
before its fix):

1. one checkpointer in a second event loop: ``test_event_loops.py``
2. unwritable ``--results-dir``, 3. unknown backend, 4. workload on a read-only file system,
   10. empty folders left behind, 14. the small CLI and docs faults: this module
5. SIGTERM cleans up like SIGINT: ``test_bench_signals.py``
6. the same stall limit and the right stage for s3dlio: ``test_s3_stall.py``
   (``test_stall_is_reported_after_stall_timeout_naming_a_sent_part``, the s3dlio launcher)
7. setup out of the first timed checkpoint, 8. one size in ``summary.json``, 9. ``--config``
   and ``--model`` plan the same ranks: ``test_dlio_run.py``
11. a staged save whose loop ends first: ``test_staged_loop_end.py``
12. manager failures raised and cleaned: ``test_steps.py`` (``test_manager_raises_*``,
    ``test_manager_aclose_raises_*``, ``test_manager_cleans_*``)
13. ``restore(into=)`` brings scalars back: ``test_state.py::test_in_place_restore_updates_scalars``
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from asyncckpt import AsyncCheckpointer, CheckpointConfig, ConfigError
from asyncckpt.bench.subcommands import SUBCOMMANDS, NotYet
from asyncckpt.sinks import BACKENDS

from .conftest import ROOT, mounted, run_bench, run_python
from .test_cleanup import dead_pid, temp
from .test_dlio_run import write_config

#: a llama3-8b workload run scaled down to seconds: one write, one read, no emulated compute
FAST_WORKLOAD = (
    *("--model", "llama3-8b", "--scale", "0.0001"),
    "++workload.checkpoint.time_between_checkpoints=0",
    "++workload.checkpoint.num_checkpoints_write=1",
    "++workload.checkpoint.num_checkpoints_read=1",
)


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[Path]:
    """An empty tmpfs mounted read-only (unmounted after the test)."""
    with mounted(tmp_path / "ro", "tmpfs", "ro,size=1m") as mnt:
        yield mnt


def one_line_error(run: subprocess.CompletedProcess[str], *needles: str) -> str:
    """Exit 2, one line on stderr holding every needle, no traceback; returns the line."""
    assert run.returncode == 2, (run.returncode, run.stderr)
    assert "Traceback" not in run.stderr, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


# -- 2, 4, 14: read-only targets and results folders ------------------------------------------


def test_unwritable_results_dir_is_refused_before_the_run(tmp_path: Path, read_only: Path) -> None:
    target = tmp_path / "ckpt"
    run = run_bench(str(target), *FAST_WORKLOAD, "--results-dir", str(read_only / "res"), "-q", cwd=tmp_path)
    one_line_error(run, "--results-dir", str(read_only / "res"))
    assert not target.exists()  # nothing written: refused before any I/O
    assert run.stdout == ""


def test_workload_on_read_only_fs_is_one_line(tmp_path: Path, read_only: Path) -> None:
    run = run_bench(str(read_only / "x"), *FAST_WORKLOAD, "-q", cwd=tmp_path)
    one_line_error(run, str(read_only / "x"), "read-only")


def test_plain_run_on_read_only_fs_is_bad_input(tmp_path: Path, read_only: Path) -> None:
    run = run_bench(str(read_only / "x"), "--size", "64MiB", "-q", cwd=tmp_path)
    one_line_error(run, str(read_only / "x"), "read-only")


# -- 3: an unknown backend -----------------------------------------------------------------------


def test_unknown_backend_is_a_config_error_naming_the_choices(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="nosuchbackend") as info:
        CheckpointConfig(backend="nosuchbackend")
    for name in BACKENDS:
        assert name in str(info.value)
    with pytest.raises(ConfigError, match="aiobotocore"):
        AsyncCheckpointer(backend="nosuchbackend")
    run = run_bench(str(tmp_path / "x.bin"), "--backend", "nosuchbackend", "--size", "1MiB", cwd=tmp_path)
    one_line_error(run, "nosuchbackend", "file", "aiobotocore")
    assert list(tmp_path.iterdir()) == []


# -- 10: folders the run made --------------------------------------------------------------------


def test_a_workload_run_removes_the_folders_it_made_and_only_those(tmp_path: Path) -> None:
    made = tmp_path / "a" / "b"
    assert run_bench(str(made), *FAST_WORKLOAD, "-q", cwd=tmp_path).returncode == 0
    assert list(tmp_path.iterdir()) == []
    existing = tmp_path / "mine"
    existing.mkdir()
    assert run_bench(str(existing / "ck"), *FAST_WORKLOAD, "-q", cwd=tmp_path).returncode == 0
    assert existing.is_dir() and list(existing.iterdir()) == []


def test_a_relative_checkpoint_folder_leaves_nothing_behind(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, folder="./checkpoints/llama_8b", writes=1, reads=1)
    run = run_bench("--config", str(cfg), "-q", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [cfg.name]


def test_kept_checkpoints_keep_their_folders(tmp_path: Path) -> None:
    made = tmp_path / "a" / "b"
    assert run_bench(str(made), *FAST_WORKLOAD, "--keep", "-q", cwd=tmp_path).returncode == 0
    assert any(made.rglob("*.pt"))


# -- 14: small CLI faults ------------------------------------------------------------------------


def test_override_without_equals_is_an_error_naming_it(tmp_path: Path) -> None:
    run = run_bench("+workload.checkpoint.fsync", "--size", "1MiB", cwd=tmp_path)
    one_line_error(run, "+workload.checkpoint.fsync", "=")
    assert list(tmp_path.iterdir()) == []


def test_a_negative_size_is_an_invalid_size(tmp_path: Path) -> None:
    line = one_line_error(run_bench("--size", "-1GiB", cwd=tmp_path), "--size", "-1GiB")
    assert "expected one argument" not in line


def test_cleanup_dry_run_says_what_it_would_remove(tmp_path: Path) -> None:
    temp(tmp_path, dead_pid())
    run = run_bench("cleanup", str(tmp_path), "--dry-run", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    row = next(line for line in run.stdout.splitlines() if "temporary file" in line)
    assert "would remove" in row and "kept" not in row, run.stdout
    assert len(list(tmp_path.iterdir())) == 1


def test_embedded_swift_checks_the_client_library_first(tmp_path: Path) -> None:
    """Neither S3 client installed (hidden by a sitecustomize): refused before Swift starts."""
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(
        "import sys\nsys.modules['aiobotocore'] = None\nsys.modules['s3dlio'] = None\n"
    )
    run = subprocess.run(
        [sys.executable, "-m", "asyncckpt.bench", "--embedded-s3", "swift", "--size", "1MiB", "-q"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": f"{shim}{os.pathsep}{ROOT}"},
    )
    one_line_error(run, "aiobotocore")  # no "[asyncckpt] embedded swift S3 server at ..." line


UNGUARDED = """\
import asyncio
from asyncckpt import AsyncCheckpointer

async def main() -> None:
    async with AsyncCheckpointer(chunk_size=1 << 20, num_buffers=2, isolation="process",
                                 mp_start_method={method!r}) as ckpt:
        await ckpt.save({target!r}, 1 << 20)
        await ckpt.delete({target!r})

asyncio.run(main())
"""


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_script_without_the_main_guard_is_told_so(tmp_path: Path, method: str) -> None:
    script = tmp_path / "train.py"
    script.write_text(UNGUARDED.format(method=method, target=str(tmp_path / "ck.bin")))
    run = run_python(str(script), cwd=tmp_path)
    assert run.returncode != 0
    assert "bootstrapping phase" not in run.stderr, run.stderr
    said = [line for line in run.stderr.splitlines() if 'if __name__ == "__main__":' in line]
    assert said and str(script) in said[0], run.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]


def test_the_quickstart_repeats_give_compare_a_verdict(tmp_path: Path) -> None:
    """The quick start's two runs (scaled down), then its compare: every save metric judged."""
    text = (ROOT / "docs" / "quickstart.md").read_text()
    runs = [line for line in text.splitlines() if "asyncckpt.bench /" in line and "--json" in line]
    assert len(runs) == 2, runs
    for line in runs:
        words = line.split("#")[0].split()[3:]
        keep = [w for i, w in enumerate(words) if w.startswith("--repeat") or words[i - 1] == "--repeat"]
        json_file = words[words.index("--json") + 1]
        run = run_bench(str(tmp_path / "ck.bin"), *keep, "--json", json_file, *SMALL, cwd=tmp_path)
        assert run.returncode == 0, run.stderr
    compare = next(line for line in text.splitlines() if "asyncckpt.bench compare" in line)
    out = run_bench(*compare.split()[3:], cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    saves = [line for line in out.stdout.splitlines() if line.startswith("save")]
    assert saves and not any("no verdict" in line for line in saves), out.stdout


SMALL = ("--size", "4MiB", "--chunk-size", "1MiB", "-q")


def test_the_documented_s3_default_is_the_code_s() -> None:
    text = (ROOT / "docs" / "backends.md").read_text()
    assert "s3dlio when it is installed, else aiobotocore" in " ".join(text.split())
    assert "the default S3 client" not in text


def test_words_the_docs_call_reserved_are_not_implemented() -> None:
    for page in (ROOT / "README.md", ROOT / "docs" / "cli.md"):
        text = " ".join(page.read_text().split())
        for listed in re.findall(r"((?:`\w+`(?:, | and )?)+) (?:is |are )?reserved", text):
            for word in re.findall(r"`(\w+)`", listed):
                assert isinstance(SUBCOMMANDS[word], NotYet), f"{page.name} calls {word!r} reserved"

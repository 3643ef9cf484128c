"""Output files of the benchmark (``--json``) are checked before any I/O, not after the run."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import mounted, run_bench

bench = run_bench


@pytest.mark.parametrize("where", ["missing/r.json", "."])
def test_bad_json_path_is_refused_before_the_run(tmp_path: Path, where: str) -> None:
    target = tmp_path / "ckpt.bin"
    out = tmp_path / where
    proc = bench(str(target), "--size", "8MiB", "--chunk-size", "1MiB", "--json", str(out), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("asyncckpt.bench: error: --json")
    assert str(out) in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == ""  # no run happened: nothing measured, nothing written
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_json_into_read_only_directory_is_refused(tmp_path: Path) -> None:
    with mounted(tmp_path / "ro", "tmpfs", "ro,size=1m") as ro:
        proc = bench(str(tmp_path / "c.bin"), "--size", "8MiB", "--json", str(ro / "r.json"), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "not writable" in proc.stderr and proc.stderr.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ro"]


@pytest.mark.parametrize("option", ["--json", "--csv", "--plots", "--report"])
def test_every_output_into_read_only_directory_is_refused_before_the_run(tmp_path: Path, option: str) -> None:
    """--csv, --plots and --report were found unwritable only after the whole run (rc 1)."""
    target = tmp_path / "data"
    target.mkdir()
    with mounted(tmp_path / "ro", "tmpfs", "ro,size=1m") as ro:
        out = ro / ("plots" if option == "--plots" else "out")
        proc = bench(
            str(target / "c.bin"), "--size", "1MiB", "--chunk-size", "1MiB", option, str(out), cwd=tmp_path
        )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"asyncckpt.bench: error: {option} ") and proc.stderr.count("\n") == 1
    assert str(ro) in proc.stderr and proc.stdout == ""
    assert list(target.iterdir()) == []


@pytest.mark.parametrize("command", [[], ["report", "r.json"]])
def test_an_existing_directory_given_for_report_is_refused_before_the_run(
    tmp_path: Path, command: list[str]
) -> None:
    (tmp_path / "d").mkdir()
    if command:  # the report subcommand re-renders a saved result
        saved = bench(
            str(tmp_path / "c.bin"),
            "--size",
            "1MiB",
            "--mode",
            "save",
            "-q",
            "--json",
            "r.json",
            cwd=tmp_path,
        )
        assert saved.returncode == 0, saved.stderr
    args = command or [str(tmp_path / "c.bin"), "--size", "1MiB", "--chunk-size", "1MiB"]
    proc = bench(*args, "--report", str(tmp_path / "d"), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "--report" in proc.stderr and "is a directory" in proc.stderr and proc.stderr.count("\n") == 1
    assert proc.stdout == "" and list((tmp_path / "d").iterdir()) == []


@pytest.mark.parametrize("option", ["--json", "--csv", "--report"])
def test_an_output_file_the_bench_did_not_write_is_not_replaced(tmp_path: Path, option: str) -> None:
    """``--json model.pt`` replaced the user's file with the results; the target itself was
    refused in the same case. Refused before the run now; its own outputs are replaced."""
    precious = tmp_path / "model.pt"
    precious.write_bytes(b"precious")
    run = [str(tmp_path / "c.bin"), "--size", "1MiB", "--chunk-size", "1MiB", "-q"]
    proc = bench(*run, option, str(precious), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "is not an output of this bench" in proc.stderr
    assert precious.read_bytes() == b"precious" and proc.stdout == ""
    # control: the bench's own output at that path is replaced by the next run
    mine = tmp_path / f"mine{option.replace('-', '_')}"
    for _ in range(2):
        proc = bench(*run, option, str(mine), cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
    # and --overwrite replaces a file it did not write
    proc = bench(*run, "--overwrite", option, str(precious), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert precious.read_bytes() != b"precious"

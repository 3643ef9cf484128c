"""Every Python example in README.md runs as written, in its own interpreter, and cleans up."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .conftest import ROOT, run_python

README = ROOT / "README.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```", README.read_text(), re.S | re.M)


def test_readme_has_python_examples() -> None:
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs_as_written(index: int, tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(BLOCKS[index])
    scratch = tmp_path / "tmp"  # where the example's temporary directory goes
    scratch.mkdir()
    proc = run_python(str(script), cwd=tmp_path, env={"TMPDIR": str(scratch)})
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout.strip()  # it shows something
    assert sorted(p.name for p in tmp_path.iterdir()) == ["example.py", "tmp"]
    assert list(scratch.iterdir()) == []  # nothing left behind

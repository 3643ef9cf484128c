"""The progress bar: on a terminal (a real pseudo-terminal) it shows bytes, rate, ETA and the
bottleneck; piped or with ``-q``, nothing but the summary is printed."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

from .launch import ROOT, child_env

ARGS = ["--size", "64MiB", "--chunk-size", "4MiB", "--num-buffers", "4", "--mode", "both"]


def on_terminal(*args: str) -> str:
    """Run the bench with stdout and stderr on a 160-column pseudo-terminal; all it wrote."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 160, 0, 0))
    env = child_env(TERM="xterm-256color")
    env.pop("NO_COLOR", None)
    cmd = [sys.executable, "-m", "asyncckpt.bench", *args]
    proc = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=ROOT)
    os.close(slave)
    out = bytearray()
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        out += data
    os.close(master)
    assert proc.wait(timeout=60) == 0, out.decode(errors="replace")
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.decode(errors="replace"))  # drop colours, cursor moves


def test_bar_on_a_terminal(tmp_path: Path) -> None:
    text = on_terminal(str(tmp_path / "ck.bin"), *ARGS)
    bars = [line for line in re.split(r"[\r\n]", text) if "bottleneck:" in line]
    assert any(line.lstrip().startswith("streaming 1/1") for line in bars), text
    assert any(line.lstrip().startswith("load 1/1") for line in bars), text
    done = [line for line in bars if "64.0/64.0 MiB" in line]
    assert done, bars
    for line in done:  # bytes, rate, ETA and which side limits
        assert re.search(r"\d+(\.\d+)? [kMG]B/s", line), line
        assert re.search(r"ETA \d+:\d\d:\d\d", line), line
        assert re.search(r"bottleneck: (I/O|Generation|Consumer)", line), line
    assert "Throughput:" in text  # and the summary after it


def test_quiet_on_a_terminal_has_no_bar(tmp_path: Path) -> None:
    text = on_terminal(str(tmp_path / "ck.bin"), *ARGS, "-q")
    assert "bottleneck:" not in text and "ETA" not in text
    assert "throughput" in text


def test_piped_prints_only_the_summary(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "asyncckpt.bench", str(tmp_path / "ck.bin"), *ARGS]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=child_env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # no bar, no carriage returns, no escape codes
    assert "\r" not in proc.stdout and "\x1b" not in proc.stdout
    assert "Throughput:" in proc.stdout


def test_the_library_does_not_import_rich(tmp_path: Path) -> None:
    code = (
        "import asyncio, sys\n"
        "from asyncckpt import AsyncCheckpointer\n"
        "async def main():\n"
        "    async with AsyncCheckpointer(chunk_size=1 << 20, num_buffers=2) as c:\n"
        f"        await c.save({str(tmp_path / 'x.bin')!r}, 4 << 20)\n"
        f"        await c.load({str(tmp_path / 'x.bin')!r})\n"
        "asyncio.run(main())\n"
        "assert 'rich' not in sys.modules, 'the library imported rich'\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=child_env(), timeout=60
    )
    assert proc.returncode == 0, proc.stderr

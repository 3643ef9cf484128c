"""stdout closed by its reader (``python -m asyncckpt.bench ... | head -1``): a quiet exit, as
other Unix tools make, instead of a BrokenPipeError traceback."""

from __future__ import annotations

import os
import select
import signal
import sys


def stdout_reader_gone() -> bool:
    """stdout is a pipe whose reader exited (Linux flags POLLERR): the BrokenPipeError is that
    pipe's, not one of a writer process or a socket, which must not pass for a quiet exit."""
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError):
        return False
    poller = select.poll()
    poller.register(fd, 0)  # POLLERR is reported whatever the mask
    return any(event & select.POLLERR for _, event in poller.poll(0))


def stdout_closed() -> int:
    """Exit as Unix tools do when ``| head`` stops reading: no traceback, rc 141 (128 + SIGPIPE).
    stdout goes to /dev/null so the interpreter's final flush cannot fail again. Everything
    the run wrote was removed before its report was printed."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 128 + signal.SIGPIPE

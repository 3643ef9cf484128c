"""SIGTERM ends a bench run the way Ctrl-C does.

Schedulers (Slurm, Kubernetes, ``timeout``) stop a job with SIGTERM, whose default action
kills the process on the spot and leaves every checkpoint it wrote behind. While the CLI runs,
SIGTERM is handed to whatever handles SIGINT: inside ``asyncio.run`` that cancels the main
task, so every ``finally`` removes what the run wrote; elsewhere it raises
``KeyboardInterrupt``. The CLI then says which signal ended it and exits 128 + its number.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator
from types import FrameType

from ..node.distributed import Comm


class Interrupt:
    """The signal that ended the run: SIGINT unless SIGTERM came."""

    def __init__(self) -> None:
        self.signum = signal.SIGINT

    @property
    def exit_code(self) -> int:
        return 128 + int(self.signum)

    @property
    def message(self) -> str:
        return "terminated (SIGTERM)" if self.signum == signal.SIGTERM else "interrupted"


#: what ended the current run (one CLI run per process)
INTERRUPT = Interrupt()


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    INTERRUPT.signum = signal.SIGTERM
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):  # asyncio's while a loop runs (cancels the main task), else Python's
        handler(signal.SIGINT, frame)
    else:  # SIGINT ignored (a background job): SIGTERM must still end the run
        raise KeyboardInterrupt


@contextlib.contextmanager
def sigterm_as_sigint() -> Iterator[Interrupt]:
    """While inside, SIGTERM takes SIGINT's path; the previous handler is put back after."""
    INTERRUPT.signum = signal.SIGINT
    if threading.current_thread() is not threading.main_thread():  # handlers: main thread only
        yield INTERRUPT
        return
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield INTERRUPT
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """SIGINT and SIGTERM held back while inside (delivered, and so raised, on the way out):
    for steps that must not stop halfway, such as removing the run's directory, which a
    signal between its last file and the directory itself left behind, empty."""
    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread
        yield
        return
    held = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def temporary_directory(stack: contextlib.ExitStack, prefix: str) -> str:
    """A new directory, removed when ``stack`` closes, however a signal falls: it is created
    and its removal registered as one step, and it is removed as one."""

    def remove(path: str) -> None:
        with deferred():
            shutil.rmtree(path, ignore_errors=True)

    with deferred():
        path = tempfile.mkdtemp(prefix=prefix)
        stack.callback(remove, path)
    return path


def end_job_if_distributed(comm: Comm) -> None:
    """After an interrupted rank removed what it wrote: with other ranks, end the whole job,
    as they may wait at a collective this rank will not reach; alone, return (the caller
    re-raises and the CLI reports the signal)."""
    if comm.size > 1:
        print(f"asyncckpt.bench: rank {comm.rank}: {INTERRUPT.message}", file=sys.stderr)
        comm.abort(INTERRUPT.exit_code)
